# A sitting with ~10 minutes of queue, one run an item so that a machine taken back keeps what ran: the 1.5B
# shape (what issue 34 still lacks) in lockstep and in the default form, whose arrangement is now chosen from
# the model's size (one engine at half the SMs, the trainer at all: rlcore.asynchronous.arrangement; two
# engines at half ran 1.31x lockstep until they ran out of an H100's memory, 2026-12-07).
SITTING_GSM8K=$HOME/gsm8k STEPS=6 bash benchmarks/open_issues_sitting.sh overlap-1.5b-lockstep --timeout 400
SITTING_GSM8K=$HOME/gsm8k STEPS=6 bash benchmarks/open_issues_sitting.sh overlap-1.5b-mps --timeout 420
