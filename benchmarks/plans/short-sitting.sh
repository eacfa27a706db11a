# A sitting with ~8 minutes of queue, one run an item so that a machine taken back keeps what ran: the 1.5B
# shape (what issue 34 still lacks) in lockstep and in the default form with the trainer at every SM
# (SHARE=1.0: at half the SMs, the default, its update took 15.02 s beside the engine against 9.30 s alone,
# 2026-12-07), both with the example's defaults (compiled layers; two engines for the colocated form).
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=5 SHARE=1.0 TAG=share1 bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 330
