# The next GPU sitting's queue, most needed first. The default one-GPU form runs the trainer's and the
# engine's kernels side by side (device_sharing = "auto": CUDA MPS, the trainer at half the SMs). On
# 2026-12-06 (eighth session, a slow host) it took 4.73 s a step, 1.57x lockstep, and 4.05 s with two engines
# beside the trainer (async_training.engines_per_device = 2, 1.83x); the trainer at 75% of the SMs computed
# NaN. The trainer, bound by its host's Python (update_actor: 2.69 s of CPU in 3.44), is what the step
# follows, and compiled layers never ran on a GPU so far: actor.use_torch_compile=true given as an override
# was dropped by a verl-key rule (fixed in the eighth session). So: the 135M pair with the bare engine (its
# sampler mode first, the one the rule compares with); the compile probe (graphs, recompiles, the limit);
# the pair with compiled layers; two engines, without and with compiled layers; the rule; the 1.5B shape:
# lockstep, the default form, the default with two engines; the rule; time slicing; partial rollouts; the
# trainer's layers kept gathered; verl's PPO line under rlcore; then issue 31's remainder (tests/vllm under
# vllm 0.24.0, by file). A sitting reaches about the first eight; benchmarks/plans/short-sitting.sh is the
# first questions in ~10 minutes.
# Queued in the last staging call:
#
#   . $HOME/stage/env.sh && bash benchmarks/open_issues_sitting.sh queue-file benchmarks/plans/next-sitting.sh \
#       && bash benchmarks/open_issues_sitting.sh queue-wait --timeout 380
#
# then `queue-wait --timeout 540` calls back to back until the queue is empty (results: queue.tar.gz, all so
# far at each call: a machine taken back mid-call loses only what that call would have brought).
# Each line runs in the repository root with OUT set to the queue's folder; GSM8K is in $HOME/gsm8k.
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 540
python3 benchmarks/compile_probe.py --model embedded:smollm2-135m-instruct --steps 3 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe.txt 2>&1; grep "^step\|^platform\|limit reached" $OUT/compile-probe.txt
SITTING_GSM8K=$HOME/gsm8k STEPS=12 BARE_ENGINE=0 EXTRA=actor.use_torch_compile=true TAG=compile bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=12 EXTRA=async_training.engines_per_device=2 TAG=two-engines bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=12 EXTRA="async_training.engines_per_device=2 actor.use_torch_compile=true" TAG=two-engines-compile bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 300
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 330
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 330
SITTING_GSM8K=$HOME/gsm8k STEPS=5 EXTRA=async_training.engines_per_device=2 TAG=two-engines bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 360
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=12 EXTRA=async_training.device_sharing=time_slicing TAG=turns bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 300
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-partial --timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-trainer --timeout 300
bash benchmarks/verl_side_by_side.sh --gsm8k $HOME/gsm8k --shapes $HOME/shapes --results $OUT/bench-verl.jsonl --jobs ppo-line --line-steps 2 --batch 64 --mini 16 --systems rlcore-vllm --line-timeout 300
mkdir -p $HOME/shared/data && ln -sfn $HOME/gsm8k $HOME/shared/data/gsm8k && RLCORE_TEST_SHARED=$HOME/shared python3 benchmarks/tests_by_file.py run tests/vllm --results $OUT/vllm-0.24.0 --budget 1200 --first test_training.py test_async.py -- -s && python3 benchmarks/tests_by_file.py table $OUT/vllm-0.24.0 --directory tests/vllm
