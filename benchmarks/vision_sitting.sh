#!/usr/bin/env bash
# Vision-language GRPO on one GPU (issue 37): a Qwen2.5-VL-3B-shaped model (benchmarks/shapes.py
# qwen2.5-vl-3b: random weights, SmolLM2's tokenizer with Qwen2-VL's vision tokens) trained on
# `rlcore data shapes` by examples/shapes_grpo_vlm.toml with the vllm engine and the fsdp backend, in
# lockstep; after the wheels of ../shared/gpu/vllm-0.22.1.txt are installed (". $HOME/stage/env.sh").
#
#   bash benchmarks/vision_sitting.sh [--steps 5] [--engine vllm] [--timeout 540] [-- more overrides]
#
# Writes $OUT/vision/metrics.jsonl (the job's metrics), $OUT/vision/job.log, and prints per step the
# seconds, the phases, and the rollout-vs-actor log-prob gap on the image prompts
# (rollout_corr/log_prob_abs_diff: the mean absolute difference per response token of vLLM's bf16
# log-probs and the fsdp actor's old log-probs; rollout_corr/kl beside it), then their medians over
# steps 2..N.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.}/vision
steps=5 engine=vllm timeout=540 shape=qwen2.5-vl-3b
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --engine) engine=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1
mkdir -p "$out"
model=$(realpath -m ".gpu-data/shapes/$shape") data=$(realpath -m .gpu-data/shapes-data)
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || { echo "rlcore did not install"; exit 1; }
python3 benchmarks/shapes.py "$shape" --out "$model" || exit 1
[ -f "$data/train.parquet" ] || python3 -m rlcore data shapes --local-save-dir "$data" --train-size 1024 \
  --test-size 64 --image-size 224 --seed 0 || exit 1
echo "[$(date +%T)] $shape: ${steps} steps, engine $engine"
timeout "$timeout" python3 -m rlcore train examples/shapes_grpo_vlm.toml "model.path=$model" "rollout.name=$engine" \
  "data.train_files=['$data/train.parquet']" "data.val_files=[]" "trainer.total_training_steps=$steps" \
  trainer.save_freq=-1 trainer.test_freq=-1 trainer.val_before_train=false async_training.mode=off \
  algorithm.rollout_is_threshold=2.0 "trainer.default_local_dir=$out/run" "$@" > "$out/job.log" 2>&1
status=$?
grep -E "^step [0-9]|^(actor|rollout|reference|workers):|Error|error" "$out/job.log" | tail -n 20
[ "$status" = 0 ] || { echo "the job exited with $status:"; tail -n 60 "$out/job.log"; }
cp "$out/run/metrics.jsonl" "$out/metrics.jsonl" 2>/dev/null
python3 - "$out/metrics.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])] if len(sys.argv) > 1 else []
steps = [r for r in rows if r.get("step", 0) >= 1 and "timing_s/step" in r]
keys = ["timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor",
        "timing_s/update_weights", "rollout_corr/log_prob_abs_diff", "rollout_corr/kl", "response_length/mean",
        "prompt_length/mean", "perf/max_memory_allocated_gb"]
def name(key):
    return key.removeprefix("timing_s/").removeprefix("rollout_corr/").removeprefix("perf/")
for r in steps:
    print("step", r["step"], {name(k): round(r[k], 4) for k in keys if k in r})
later = steps[1:] or steps
print("median of steps 2..N:", {name(k): round(statistics.median(r[k] for r in later), 4)
                                 for k in keys if all(k in r for r in later)})
EOF
