# A sitting with ~8 minutes of queue (device time spent on machines that would not start), one run an item
# so that a machine taken back keeps what ran: the default form with compiled layers and two engines beside
# the trainer (the candidate defaults), lockstep with compiled layers, the bare engine (its sampler mode
# first), the rule; then the trainer's passes alone (benchmarks/compile_probe.py) with compiled layers, eager
# layers, and eager with FSDP reducing after every micro-batch.
SITTING_GSM8K=$HOME/gsm8k STEPS=10 EXTRA="actor.use_torch_compile=true async_training.engines_per_device=2" TAG=candidate bash benchmarks/open_issues_sitting.sh overlap-colocated --timeout 240
SITTING_GSM8K=$HOME/gsm8k STEPS=8 EXTRA=actor.use_torch_compile=true TAG=compile bash benchmarks/open_issues_sitting.sh overlap-lockstep --timeout 200
SITTING_GSM8K=$HOME/gsm8k bash benchmarks/open_issues_sitting.sh engine --timeout 150
bash benchmarks/open_issues_sitting.sh overlap-rule
timeout 100 python3 benchmarks/compile_probe.py --model embedded:smollm2-135m-instruct --steps 5 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe.txt 2>&1; grep "^step\|^platform\|limit reached\|^layers\|Error" $OUT/compile-probe.txt | tail -n 20
timeout 100 python3 benchmarks/compile_probe.py --eager --model embedded:smollm2-135m-instruct --steps 5 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe-eager.txt 2>&1; grep "^step\|^platform\|limit reached\|^layers\|Error" $OUT/compile-probe-eager.txt | tail -n 20
timeout 100 python3 benchmarks/compile_probe.py --eager --reduce-each-micro-batch --model embedded:smollm2-135m-instruct --steps 5 --rows 128 --prompt 256 --response 512 --tokens 32768 -- model.dtype=bfloat16 > $OUT/compile-probe-eager-reduce-each.txt 2>&1; grep "^step\|^platform\|limit reached\|^layers\|Error" $OUT/compile-probe-eager-reduce-each.txt | tail -n 20
