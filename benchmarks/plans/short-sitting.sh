# A sitting with ~10 minutes of queue (device time spent on machines that would not start): the first
# questions of next-sitting.sh, fewer steps, the bare engine left out (compare it with an earlier sitting's,
# same card): lockstep against the default one-GPU form (colocated, CUDA MPS with the trainer at half the
# SMs), then whether the layers compile on the GPU (benchmarks/compile_probe.py), then two engines beside the trainer.
SITTING_GSM8K=$HOME/gsm8k STEPS=8 BARE_ENGINE=0 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 400
python3 benchmarks/compile_probe.py --model embedded:smollm2-135m-instruct --steps 3 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe.txt 2>&1; grep "^step\|^platform\|limit reached" $OUT/compile-probe.txt
SITTING_GSM8K=$HOME/gsm8k STEPS=8 EXTRA=async_training.engines_per_device=2 TAG=two-engines bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 240
