# The next GPU sitting's queue, most needed first: issue 34's 135M pair with the bare engine; the colocated
# form with two engine processes beside the trainer (async_training.engines_per_device = 2: the engine is
# bound by its host, its kernels ran 38% of its generation on 2026-12-06, and two bare engines generated the
# batch in 4.02 s against 5.14 for one on 2026-12-01); two bare engines sharing the GPU, each with half the
# batch; the colocated form under MPS with the trainer at half the SMs, alone and with two engines; the
# rule; three engines; the log-probs' compiled kernels (their test, passed on an H100 on 2026-12-06, and
# their time against the eager chunks on the update's micro-batch); the pair with the trainer's layers
# compiled; MPS and compiled layers together; the rule; MPS at three quarters; the trainer's layers kept
# gathered; verl's PPO line under rlcore (its peak memory with the trainer's cache emptied before the
# engine wakes: 51.5 GB before); the 1.5B pair; partial rollouts, for the first time on a GPU; the pair
# with the eager log-prob chunks (what the kernels win in a step); then issue 31's remainder (tests/vllm
# under vllm 0.24.0, by file). A sitting reaches about the first six; benchmarks/plans/short-sitting.sh is
# the same questions in ~10 minutes.
# Queued in the last staging call:
#
#   . $HOME/stage/env.sh && bash benchmarks/open_issues_sitting.sh queue-file benchmarks/plans/next-sitting.sh \
#       && bash benchmarks/open_issues_sitting.sh queue-wait --timeout 380
#
# then `queue-wait --timeout 300` calls back to back until the queue is empty (results: queue.tar.gz, all so
# far at each call: a machine taken back mid-call loses only what that call would have brought).
# Each line runs in the repository root with OUT set to the queue's folder; GSM8K is in $HOME/gsm8k.
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 540
SITTING_GSM8K=$HOME/gsm8k STEPS=12 EXTRA=async_training.engines_per_device=2 TAG=two-engines bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 300
timeout 200 python3 benchmarks/vllm_generation.py --gsm8k $HOME/gsm8k --results $OUT/gen-replicas.jsonl --replicas 2 --mode sampler --rounds 2 && python3 benchmarks/vllm_generation.py table $OUT/gen-replicas.jsonl
SITTING_GSM8K=$HOME/gsm8k STEPS=12 SHARE=0.5 TAG=half bash benchmarks/open_issues_sitting.sh overlap-mps --timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=12 SHARE=0.5 EXTRA=async_training.engines_per_device=2 TAG=half-two-engines bash benchmarks/open_issues_sitting.sh overlap-mps --timeout 300
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=12 EXTRA=async_training.engines_per_device=3 TAG=three-engines bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 300
python3 -m pytest -q -p no:cacheprovider tests/algorithms/test_entropy.py > $OUT/test-entropy.txt 2>&1; tail -3 $OUT/test-entropy.txt; python3 benchmarks/log_prob_memory.py --entropy --forms chunked fused --repeats 5 | tee $OUT/log-prob-kernels.jsonl && python3 benchmarks/log_prob_memory.py --no-grad --forms chunked fused --repeats 5 | tee -a $OUT/log-prob-kernels.jsonl
SITTING_GSM8K=$HOME/gsm8k STEPS=12 BARE_ENGINE=0 EXTRA=actor.use_torch_compile=true TAG=compile bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=12 SHARE=0.5 EXTRA=actor.use_torch_compile=true TAG=half-compile bash benchmarks/open_issues_sitting.sh overlap-mps --timeout 300
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=12 SHARE=0.75 TAG=three-quarters bash benchmarks/open_issues_sitting.sh overlap-mps --timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-trainer --timeout 300
bash benchmarks/verl_side_by_side.sh --gsm8k $HOME/gsm8k --shapes $HOME/shapes --results $OUT/bench-verl.jsonl --jobs ppo-line --line-steps 2 --batch 64 --mini 16 --systems rlcore-vllm --line-timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 330
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-colocated --timeout 330
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-partial --timeout 300
RLCORE_FUSED_LOG_PROBS=0 SITTING_GSM8K=$HOME/gsm8k STEPS=12 BARE_ENGINE=0 TAG=eager-log-probs bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 420
bash benchmarks/open_issues_sitting.sh overlap-rule
mkdir -p $HOME/shared/data && ln -sfn $HOME/gsm8k $HOME/shared/data/gsm8k && RLCORE_TEST_SHARED=$HOME/shared python3 benchmarks/tests_by_file.py run tests/vllm --results $OUT/vllm-0.24.0 --budget 1200 --first test_training.py test_async.py -- -s && python3 benchmarks/tests_by_file.py table $OUT/vllm-0.24.0 --directory tests/vllm
