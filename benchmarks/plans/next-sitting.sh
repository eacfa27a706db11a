# The next GPU sitting's queue, most needed first: issue 31's last row (verl's GRPO line on the fixed
# qwen2.5-0.5b shape, beside rlcore's), then issue 34's measurements since the host changes (the 135M
# pair, the same under MPS with the trainer at half the SMs, the 1.5B pair). Queued in the last staging call:
#
#   . $HOME/stage/env.sh && bash benchmarks/open_issues_sitting.sh queue-file benchmarks/plans/next-sitting.sh \
#       && bash benchmarks/open_issues_sitting.sh queue-wait --timeout 380
#
# then `queue-wait --timeout 540` calls back to back until the queue is empty (results: queue.tar.gz).
# Each line runs in the repository root with OUT set to the queue's folder; GSM8K is in $HOME/gsm8k.
bash benchmarks/verl_side_by_side.sh --gsm8k $HOME/gsm8k --shapes $HOME/shapes --results $OUT/bench-verl.jsonl --jobs grpo-line --line-steps 2 --batch 64 --mini 16 --line-timeout 900
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 540
SITTING_GSM8K=$HOME/gsm8k STEPS=12 SHARE=0.5 TAG=half bash benchmarks/open_issues_sitting.sh overlap-mps --timeout 300
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 330
SITTING_GSM8K=$HOME/gsm8k STEPS=5 bash benchmarks/open_issues_sitting.sh overlap-1.5b-colocated --timeout 330
SITTING_GSM8K=$HOME/gsm8k STEPS=12 SHARE=0.75 TAG=three-quarters bash benchmarks/open_issues_sitting.sh overlap-mps --timeout 300
