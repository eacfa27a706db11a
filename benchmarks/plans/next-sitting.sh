# The next GPU sitting's queue, most needed first. On 2026-12-07 (thirteenth session, 1 x H200) the 1.5B shape
# ran 16.71 s a step in lockstep and 12.69 s in the default form (1.32x; issue 34 asks 1.4x), whose arrangement
# for a 1.39 B actor is one engine at half the SMs beside the trainer at every SM: there the engine is the
# slower side (15.88 s a batch, the trainer waiting 3.00 s), and in the traced step the trainer's device sat
# idle 7.8 s of 16.4 while the engine kept to its half. The 30-step learning rule held (0.1121 against
# 0.1121). The engine's trace: 545 forward steps in the window, ~30 ms each with 12 ms of kernels (alone, in
# lockstep, ~14 ms a step): its kernels wait for SMs behind the trainer's and its host runs one step at a time.
# So: the 1.5B shape in lockstep again (this sitting's baseline); one engine at every SM with the trainer's
# kernels first (async_training.kernel_priority, new: the engine's process at MPS's below-normal priority, so
# it takes the SMs the trainer leaves, and all of them while the trainer waits); two engines at every SM (two
# hosts stepping, any SM the trainer leaves); one engine at every SM, equal priority; two engines at every SM
# with the trainer first; one engine at every SM with the engine first; two engines at half (1.31x on the H100 already, where memory ran out at step 5; an H200 has
# room). A 1.5B run takes ~5 minutes (lockstep ~6, building the shape), so a full sitting reaches about the
# fifth line. Whichever wins becomes arrangement.py's large-model row. Then the 135M pair on this card (its
# rule was met on an H100; the issue names an H200), the default 1.5B again, the engine at a quarter.
# Queued in the last staging call:
#
#   . $HOME/stage/env.sh && bash benchmarks/open_issues_sitting.sh queue-file benchmarks/plans/next-sitting.sh \
#       && bash benchmarks/open_issues_sitting.sh queue-wait --timeout 560
#
# then `queue-wait --timeout 540` calls back to back until the queue is empty (results: queue.tar.gz, all so
# far at each call: a machine taken back mid-call loses only what that call would have brought).
# Each line runs in the repository root with OUT set to the queue's folder; GSM8K is in $HOME/gsm8k.
SITTING_GSM8K=$HOME/gsm8k STEPS=6 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA="async_training.engine_compute_share=1.0 async_training.kernel_priority=trainer" TAG=trainer-first bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA="async_training.engines_per_device=2 async_training.engine_compute_share=1.0" TAG=two-engines-all bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA=async_training.engine_compute_share=1.0 TAG=engine-all bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA="async_training.engines_per_device=2 async_training.engine_compute_share=1.0 async_training.kernel_priority=trainer" TAG=two-engines-trainer-first bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA="async_training.engine_compute_share=1.0 async_training.kernel_priority=engine" TAG=engine-first bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA=async_training.engines_per_device=2 TAG=two-engines-half bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=20 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 900
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=6 bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
SITTING_GSM8K=$HOME/gsm8k STEPS=6 EXTRA=async_training.engine_compute_share=0.25 TAG=engine-quarter bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
bash benchmarks/open_issues_sitting.sh probe --timeout 180 -- --model embedded:smollm2-135m-instruct --steps 5 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe.txt 2>&1; grep "^step\|^platform\|limit reached\|^layers\|Error" $OUT/compile-probe.txt | tail -n 20
SITTING_GSM8K=$HOME/gsm8k STEPS=12 bash benchmarks/open_issues_sitting.sh overlap-partial --timeout 300
