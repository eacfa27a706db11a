# The next GPU sitting's queue, most needed first. On 2026-12-07 (second H100 sitting) the 135M job met
# issue 34's rule over 20 steps (3.07 s a step, 2.09x lockstep's samples/s, 0.75x the bare engine) and the
# 1.5B shape, compiled, ran 14.93 s a step in lockstep; colocated with the trainer at every SM and two
# engines at half, 11.38 s (1.31x), until the two engines ran out of the H100's memory at step 5's weight
# sync. Since then the colocated arrangement is chosen from the model's size (rlcore.asynchronous.arrangement:
# a 1.5B actor gets one engine at half the SMs and the trainer at all; 135M, two engines and the trainer at
# half). So: the 1.5B shape in lockstep, in the default form (>= 1.4x is "Done when") and with the engine at
# every SM too (two engines at half left the trainer waiting 0.55 s a step: one at half may be slower than
# the trainer), the 30-step learning rule with the defaults (a line of its own: learning-start queues behind
# everything queued before it) before the engine at every SM, so that a short sitting keeps the two items
# "Done when" names; then the engine at a quarter, then the 135M pair again.
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
python3 benchmarks/learning_runs.py run rlcore-default rlcore-lockstep --gsm8k $HOME/gsm8k --work $HOME/learn --results $OUT/learn.jsonl --timeout 900 -- reward.format_score=0.1 actor.optim.lr=3e-6 && python3 benchmarks/learning_runs.py table $OUT/learn.jsonl
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA=async_training.engine_compute_share=1.0 TAG=engine-all bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA=async_training.engine_compute_share=0.25 TAG=engine-quarter bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=20 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 900
bash benchmarks/open_issues_sitting.sh overlap-rule
bash benchmarks/open_issues_sitting.sh probe --timeout 180 -- --model embedded:smollm2-135m-instruct --steps 5 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe.txt 2>&1; grep "^step\|^platform\|limit reached\|^layers\|Error" $OUT/compile-probe.txt | tail -n 20
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-partial --timeout 300
