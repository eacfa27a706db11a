# A sitting with ~8 minutes of queue, one run an item so that a machine taken back keeps what ran: the 1.5B
# shape (what issue 34 still lacks) in lockstep and in the default form with the trainer at every SM and the
# engine held to half of them (at half the SMs, the default, the trainer's update took 15.02 s beside the
# engine against 9.30 s alone, 2026-12-07; the engine has time to spare there), both with the example's
# defaults (compiled layers; two engines for the colocated form).
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 400
SITTING_GSM8K=$HOME/gsm8k STEPS=5 SHARE=1.0 EXTRA=async_training.engine_compute_share=0.5 TAG=engine-half bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
