# A sitting with ~10 minutes of queue (device time spent on machines that would not start): the first
# questions of next-sitting.sh, fewer steps, the bare engine left out (compare it with an earlier sitting's,
# same card): lockstep against the default one-GPU form (colocated, CUDA MPS with the trainer at half the
# SMs), then MPS with the trainer at three quarters, then two engines beside the trainer.
SITTING_GSM8K=$HOME/gsm8k STEPS=8 BARE_ENGINE=0 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 400
SITTING_GSM8K=$HOME/gsm8k STEPS=8 SHARE=0.75 TAG=three-quarters bash benchmarks/open_issues_sitting.sh overlap-mps --timeout 240
SITTING_GSM8K=$HOME/gsm8k STEPS=8 EXTRA=async_training.engines_per_device=2 TAG=two-engines bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 240
