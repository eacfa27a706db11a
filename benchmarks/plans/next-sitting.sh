# The next GPU sitting's queue, most needed first. On 2026-12-07 (fourteenth session) an H100 came, not the
# H200 issue 34 names: the 1.5B shape ran 16.84 s a step in lockstep and 11.17 s with one engine at every SM
# behind the trainer's kernels (async_training.kernel_priority = "trainer"): 1.51x, now the default from
# 0.7 B parameters (arrangement.py); two engines at every SM at equal priority 1.41x. On an H200 the 1.5B
# default (then one engine at half the SMs) had run 1.32x. So: the 1.5B shape in lockstep and in today's
# default on the H200 (issue 34's 1.4x, one sitting); then the 135M pair over 20 steps and its rule on the
# same card (met on an H100 only); partial rollouts (never yet run on a GPU); then the other arrangements
# for the record. A 1.5B run takes ~4-5 minutes (lockstep ~6.5, building the shape); the 135M pair ~10.
# Queued in the last staging call:
#
#   . $HOME/stage/env.sh && bash benchmarks/open_issues_sitting.sh queue-file benchmarks/plans/next-sitting.sh \
#       && bash benchmarks/open_issues_sitting.sh queue-wait --timeout 560
#
# then `queue-wait --timeout 540` calls back to back until the queue is empty (results: queue.tar.gz, all so
# far at each call: a machine taken back mid-call loses only what that call would have brought).
# Each line runs in the repository root with OUT set to the queue's folder; GSM8K is in $HOME/gsm8k.
SITTING_GSM8K=$HOME/gsm8k STEPS=6 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=6 bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=20 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 900
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-partial --timeout 480
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA="async_training.engines_per_device=2 async_training.kernel_priority=trainer" TAG=two-engines-trainer-first bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA=async_training.kernel_priority=equal TAG=engine-all bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA=async_training.kernel_priority=engine TAG=engine-first bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
