# The next GPU sitting's queue, most needed first. The default one-GPU form runs the trainer's and the
# engine's kernels side by side (device_sharing = "auto": CUDA MPS, the trainer at half the SMs). On
# 2026-12-06 (eighth session, a slow host) it took 4.73 s a step, 1.57x lockstep, and 4.05 s with two engines
# beside the trainer (async_training.engines_per_device = 2, 1.83x), the trainer then what the step follows
# (update_actor host-bound: 2.69 s of CPU in 3.44). Compiled layers never ran on a GPU so far (an override
# dropped by a verl-key rule, fixed in the eighth session). So: whether the layers compile on the GPU
# (benchmarks/compile_probe.py, each pass timed); the 135M pair with the bare engine, both runs with compiled layers and the
# colocated one with two engines (the candidate defaults; lockstep keeps its one engine); the rule; the probe's
# passes with the layers eager (what compiling brings the trainer alone); the 1.5B
# shape, lockstep and the default form (never measured under MPS); the rule; two engines without compiled
# layers (what compiling brings); the candidate with the trainer's layers kept gathered; time slicing; partial
# rollouts; verl's PPO line under rlcore; then issue 31's remainder (tests/vllm under vllm 0.24.0, by file).
# A sitting reaches about the first seven; benchmarks/plans/short-sitting.sh is the first questions in ~10 minutes.
# Queued in the last staging call:
#
#   . $HOME/stage/env.sh && bash benchmarks/open_issues_sitting.sh queue-file benchmarks/plans/next-sitting.sh \
#       && bash benchmarks/open_issues_sitting.sh queue-wait --timeout 380
#
# then `queue-wait --timeout 540` calls back to back until the queue is empty (results: queue.tar.gz, all so
# far at each call: a machine taken back mid-call loses only what that call would have brought).
# Each line runs in the repository root with OUT set to the queue's folder; GSM8K is in $HOME/gsm8k.
timeout 180 python3 benchmarks/compile_probe.py --model embedded:smollm2-135m-instruct --steps 5 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe.txt 2>&1; grep "^step\|^platform\|limit reached\|^layers\|Error" $OUT/compile-probe.txt | tail -n 20
SITTING_GSM8K=$HOME/gsm8k STEPS=12 EXTRA="actor.use_torch_compile=true async_training.engines_per_device=2" TAG=candidate bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 600
bash benchmarks/open_issues_sitting.sh overlap-rule
timeout 180 python3 benchmarks/compile_probe.py --eager --model embedded:smollm2-135m-instruct --steps 5 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe-eager.txt 2>&1; grep "^step\|^platform\|limit reached\|^layers\|Error" $OUT/compile-probe-eager.txt | tail -n 20
timeout 180 python3 benchmarks/compile_probe.py --eager --reduce-each-micro-batch --model embedded:smollm2-135m-instruct --steps 5 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe-eager-reduce-each.txt 2>&1; grep "^step\|^platform\|limit reached\|^layers\|Error" $OUT/compile-probe-eager-reduce-each.txt | tail -n 20
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 330
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 330
SITTING_GSM8K=$HOME/gsm8k STEPS=12 EXTRA=async_training.engines_per_device=2 TAG=two-engines bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=12 EXTRA="actor.use_torch_compile=true async_training.engines_per_device=2" TAG=candidate bash benchmarks/open_issues_sitting.sh overlap-trainer --timeout 300
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=5 EXTRA=async_training.engines_per_device=2 TAG=two-engines bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 360
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=12 EXTRA=async_training.device_sharing=time_slicing TAG=turns bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 300
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-partial --timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-trainer --timeout 300
bash benchmarks/verl_side_by_side.sh --gsm8k $HOME/gsm8k --shapes $HOME/shapes --results $OUT/bench-verl.jsonl --jobs ppo-line --line-steps 2 --batch 64 --mini 16 --systems rlcore-vllm --line-timeout 300
mkdir -p $HOME/shared/data && ln -sfn $HOME/gsm8k $HOME/shared/data/gsm8k && RLCORE_TEST_SHARED=$HOME/shared python3 benchmarks/tests_by_file.py run tests/vllm --results $OUT/vllm-0.24.0 --budget 1200 --first test_training.py test_async.py -- -s && python3 benchmarks/tests_by_file.py table $OUT/vllm-0.24.0 --directory tests/vllm
