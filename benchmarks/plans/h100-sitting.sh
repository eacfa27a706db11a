# The queue for a sitting where only an H100 comes (issue 34's comparisons are for an H200; an H100 has
# measured the 1.5B default, 1.51x lockstep, and the 135M pair, 2.09x): what no GPU has run yet first.
# The 135M pair first, then its rule; then partial rollouts (async_training.partial_rollout) at 135M, once
# the pair has filled the compile caches: on 2026-12-07 (sixteenth session) partial rollouts ran first on a
# fresh machine and their two engines were still starting when 280 s ran out; then two engines behind the
# 1.5B trainer's kernels.
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 700
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-partial --timeout 480
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA="async_training.engines_per_device=2 async_training.kernel_priority=trainer" TAG=two-engines-trainer-first bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
