# The next GPU sitting's queue, most needed first. Since 2026-12-07 the example job's defaults are the
# candidate that held the 135M rule on an H100 (compiled layers, two engines beside the trainer: 2.86 s a step,
# 1.87x lockstep's samples/s, 0.87x the bare engine; docs/async.md). The 1.5B shape is what stays open: its
# default form (CUDA MPS, the trainer at half the SMs, one engine, eager layers) took 20.31 s a step against
# lockstep's 19.33, the trainer's update 15.02 s beside the engine against 9.30 s alone. So: the 1.5B shape
# with the new defaults (compiled layers, now under gradient checkpointing too: step 1 compiles longer, so
# 420 s a run), lockstep, the trainer at every SM with the engine held to half (async_training.
# engine_compute_share, new: the engine has time to spare there) and the default form; the 135M comparison
# of "Done when" (20 steps, the example's defaults) and the rule; both at every SM (SHARE=1.0); by time slices; the
# compiled probe (through the probe part, which installs rlcore first: run bare, the probe found no training
# backend); the learning rule; partial rollouts; verl's PPO line under rlcore; tests/vllm under vllm 0.24.0.
# A sitting reaches about the first six; benchmarks/plans/short-sitting.sh is the first questions in ~10 minutes.
# Queued in the last staging call:
#
#   . $HOME/stage/env.sh && bash benchmarks/open_issues_sitting.sh queue-file benchmarks/plans/next-sitting.sh \
#       && bash benchmarks/open_issues_sitting.sh queue-wait --timeout 380
#
# then `queue-wait --timeout 540` calls back to back until the queue is empty (results: queue.tar.gz, all so
# far at each call: a machine taken back mid-call loses only what that call would have brought).
# Each line runs in the repository root with OUT set to the queue's folder; GSM8K is in $HOME/gsm8k.
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=5 SHARE=1.0 EXTRA=async_training.engine_compute_share=0.5 TAG=engine-half bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=20 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 900
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=5 SHARE=1.0 TAG=share1 bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-colocated --timeout 420
bash benchmarks/open_issues_sitting.sh probe --timeout 180 -- --model embedded:smollm2-135m-instruct --steps 5 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe.txt 2>&1; grep "^step\|^platform\|limit reached\|^layers\|Error" $OUT/compile-probe.txt | tail -n 20
bash benchmarks/open_issues_sitting.sh learning-start rlcore-default rlcore-lockstep -- reward.format_score=0.1 actor.optim.lr=3e-6
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-partial --timeout 300
bash benchmarks/verl_side_by_side.sh --gsm8k $HOME/gsm8k --shapes $HOME/shapes --results $OUT/bench-verl.jsonl --jobs ppo-line --line-steps 2 --batch 64 --mini 16 --systems rlcore-vllm --line-timeout 300
mkdir -p $HOME/shared/data && ln -sfn $HOME/gsm8k $HOME/shared/data/gsm8k && RLCORE_TEST_SHARED=$HOME/shared python3 benchmarks/tests_by_file.py run tests/vllm --results $OUT/vllm-0.24.0 --budget 1200 --first test_training.py test_async.py -- -s && python3 benchmarks/tests_by_file.py table $OUT/vllm-0.24.0 --directory tests/vllm
