# A sitting with ~10 minutes of queue, one run an item so that a machine taken back keeps what ran: the 1.5B
# shape (what issue 34 still lacks on an H200: 1.4x lockstep) in lockstep and in the default form, which since
# 2026-12-07 (fourteenth session) is one engine at every SM behind the trainer's kernels (1.51x on an H100).
SITTING_GSM8K=$HOME/gsm8k STEPS=6 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 400
SITTING_GSM8K=$HOME/gsm8k STEPS=6 bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
