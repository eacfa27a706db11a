# Issue 34's "Done when" in one sitting (1 x H200), the example's defaults, ratios within the sitting:
# the 135M job's bare engine (the sampler's log-probs, the setting the default form needs), lockstep and the
# default one-GPU form (colocated, rollout IS, CUDA MPS: device_sharing = "auto"; compiled layers, the
# example's [actor]; what shares the device chosen from the model's size: two engines at every SM and the
# trainer at half for 135M, one engine at half and the trainer at every SM for 1.5B; lockstep keeps its one
# engine, in the trainer's process), 20 steps each, medians of steps
# 2-20, held to the rule (<= 1.15x the bare engine, >= 1.5x lockstep's samples/s); then the 1.5B shape,
# lockstep against the default form (>= 1.4x); then the 30-step learning rule, run again since the default
# form changed (it last held on 2026-12-06 by time slices). Queued as benchmarks/plans/next-sitting.sh is
# (its header).
SITTING_GSM8K=$HOME/gsm8k STEPS=20 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 900
bash benchmarks/open_issues_sitting.sh overlap-rule
SITTING_GSM8K=$HOME/gsm8k STEPS=8 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 450
SITTING_GSM8K=$HOME/gsm8k STEPS=8 bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 450
bash benchmarks/open_issues_sitting.sh learning-start rlcore-default rlcore-lockstep -- reward.format_score=0.1 actor.optim.lr=3e-6
