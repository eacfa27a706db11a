# A sitting with ~10 minutes of queue (device time spent on machines that would not start): the questions
# next-sitting.sh asks, fewer steps, the bare engine left out (compare it with an earlier sitting's, same card):
# the log-probs' compiled kernels, then lockstep against the colocated form with them, then the colocated
# form under MPS with the trainer at half the SMs, then both forms with compiled layers.
python3 -m pytest -q -p no:cacheprovider tests/algorithms/test_entropy.py > $OUT/test-entropy.txt 2>&1; tail -3 $OUT/test-entropy.txt; python3 benchmarks/log_prob_memory.py --entropy --forms chunked fused --repeats 3 | tee $OUT/log-prob-kernels.jsonl && python3 benchmarks/log_prob_memory.py --no-grad --forms chunked fused --repeats 3 | tee -a $OUT/log-prob-kernels.jsonl
SITTING_GSM8K=$HOME/gsm8k STEPS=8 BARE_ENGINE=0 bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 400
SITTING_GSM8K=$HOME/gsm8k STEPS=8 SHARE=0.5 TAG=half bash benchmarks/open_issues_sitting.sh overlap-mps --timeout 240
SITTING_GSM8K=$HOME/gsm8k STEPS=8 BARE_ENGINE=0 EXTRA=actor.use_torch_compile=true TAG=compile bash benchmarks/open_issues_sitting.sh overlap-pair --timeout 400
SITTING_GSM8K=$HOME/gsm8k STEPS=8 SHARE=0.5 EXTRA=actor.use_torch_compile=true TAG=half-compile bash benchmarks/open_issues_sitting.sh overlap-mps --timeout 240
