# The next GPU sitting's queue, most needed first. Since 2026-12-06 the default one-GPU form runs the
# trainer's and the engine's kernels side by side (device_sharing = "auto": CUDA MPS, the trainer at half
# the SMs: 3.84 s/step, 1.40x lockstep, 1.21x the bare engine; the trainer is what the step waits for now).
# So: the 135M pair with the bare engine (the default form is now MPS at 0.5); MPS with the trainer at three
# quarters of the SMs; two engines beside the trainer (async_training.engines_per_device = 2, which hung on
# 2026-12-06 before its engines got process groups of their own); the rule; the form by time slices; MPS at
# three quarters with two engines; why actor.use_torch_compile left the layers eager on the GPU (3 lockstep
# steps with dynamo's recompile and graph-break logs); the 1.5B pair (lockstep; the default form, MPS at
# half); the rule;
# partial rollouts, for the first time on a GPU; the trainer's layers kept gathered; verl's PPO line under
# rlcore; then issue 31's remainder (tests/vllm under vllm 0.24.0, by file). A sitting reaches about the
# first six; benchmarks/plans/short-sitting.sh is the first questions in ~10 minutes.
# Queued in the last staging call:
#
#   . $HOME/stage/env.sh && bash benchmarks/open_issues_sitting.sh queue-file benchmarks/plans/next-sitting.sh \
#       && bash benchmarks/open_issues_sitting.sh queue-wait --timeout 380
#
# then `queue-wait --timeout 300` calls back to back until the queue is empty (results: queue.tar.gz, all so
# far at each call: a machine taken back mid-call loses only what that call would have brought).
# Each line runs in the repository root with OUT set to the queue's folder; GSM8K is in $HOME/gsm8k.
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 540
TORCH_LOGS=recompiles,graph_breaks SITTING_GSM8K=$HOME/gsm8k STEPS=3 EXTRA=actor.use_torch_compile=true TAG=compile-logs bash benchmarks/open_issues_sitting.sh overlap-lockstep --timeout 240; grep -h -i -A4 "recompil\|graph break" $HOME/overlap-lockstep-compile-logs/*.log | head -120 > $OUT/compile-logs.txt
SITTING_GSM8K=$HOME/gsm8k STEPS=12 SHARE=0.75 TAG=three-quarters bash benchmarks/open_issues_sitting.sh overlap-mps --timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=12 EXTRA=async_training.engines_per_device=2 TAG=two-engines bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 300
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 330
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 330
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=12 EXTRA=async_training.device_sharing=time_slicing TAG=turns bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=12 SHARE=0.75 EXTRA=async_training.engines_per_device=2 TAG=three-quarters-two-engines bash benchmarks/open_issues_sitting.sh overlap-mps --timeout 300
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-partial --timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-trainer --timeout 300
bash benchmarks/verl_side_by_side.sh --gsm8k $HOME/gsm8k --shapes $HOME/shapes --results $OUT/bench-verl.jsonl --jobs ppo-line --line-steps 2 --batch 64 --mini 16 --systems rlcore-vllm --line-timeout 300
mkdir -p $HOME/shared/data && ln -sfn $HOME/gsm8k $HOME/shared/data/gsm8k && RLCORE_TEST_SHARED=$HOME/shared python3 benchmarks/tests_by_file.py run tests/vllm --results $OUT/vllm-0.24.0 --budget 1200 --first test_training.py test_async.py -- -s && python3 benchmarks/tests_by_file.py table $OUT/vllm-0.24.0 --directory tests/vllm
