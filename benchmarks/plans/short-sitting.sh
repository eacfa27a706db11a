# A sitting with ~10 minutes of queue (device time spent on machines that would not start): the first
# questions of next-sitting.sh, fewer steps: whether the layers compile on the GPU and what that brings the
# trainer's passes (benchmarks/compile_probe.py, each pass timed), then the 135M pair with the bare engine,
# both runs with compiled layers and the colocated one with two engines beside the trainer (the candidate
# defaults), the rule, and the probe's passes with the layers eager.
timeout 150 python3 benchmarks/compile_probe.py --model embedded:smollm2-135m-instruct --steps 5 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe.txt 2>&1; grep "^step\|^platform\|limit reached\|^layers\|Error" $OUT/compile-probe.txt | tail -n 20
SITTING_GSM8K=$HOME/gsm8k STEPS=10 EXTRA="actor.use_torch_compile=true async_training.engines_per_device=2" TAG=candidate bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 540
bash benchmarks/open_issues_sitting.sh overlap-rule
timeout 120 python3 benchmarks/compile_probe.py --eager --model embedded:smollm2-135m-instruct --steps 5 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe-eager.txt 2>&1; grep "^step\|^platform\|limit reached\|^layers\|Error" $OUT/compile-probe-eager.txt | tail -n 20
SITTING_GSM8K=$HOME/gsm8k STEPS=10 EXTRA=async_training.engines_per_device=2 TAG=two-engines bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 240
bash benchmarks/open_issues_sitting.sh overlap-rule
