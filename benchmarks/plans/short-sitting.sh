# A sitting with ~10 minutes of queue (device time spent on machines that would not start): the first
# questions of next-sitting.sh, fewer steps, the bare engine left out (compare it with an earlier sitting's,
# same card): lockstep against the default one-GPU form (colocated, CUDA MPS with the trainer at half the
# SMs), then why the compiled layers run eager on the GPU (dynamo's logs), then two engines beside the trainer.
SITTING_GSM8K=$HOME/gsm8k STEPS=8 BARE_ENGINE=0 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 400
TORCH_LOGS=recompiles,graph_breaks SITTING_GSM8K=$HOME/gsm8k STEPS=5 EXTRA=actor.use_torch_compile=true TAG=compile-logs bash benchmarks/open_issues_sitting.sh overlap-lockstep --timeout 240; grep -h -i -A4 "recompil\|graph break" $HOME/overlap-lockstep-compile-logs/*.log | head -120 > $OUT/compile-logs.txt
SITTING_GSM8K=$HOME/gsm8k STEPS=8 EXTRA=async_training.engines_per_device=2 TAG=two-engines bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 240
