# A sitting with ~10 minutes of queue, one run an item so that a machine taken back keeps what ran: the 1.5B
# shape (what issue 34 still lacks: 1.4x lockstep) in lockstep and with two engines at every SM beside the
# trainer at every SM (the default, one engine at half, ran 1.32x on an H200 on 2026-12-07, the engine then the
# slower side, its kernels waiting behind the trainer's and half the device idle while the trainer waited).
SITTING_GSM8K=$HOME/gsm8k STEPS=6 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 400
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA="async_training.engines_per_device=2 async_training.engine_compute_share=1.0" TAG=two-engines-all bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
