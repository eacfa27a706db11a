#!/usr/bin/env bash
# LoRA at scale on one GPU, one sitting: the GSM8K GRPO job (examples/gsm8k_grpo_smollm2.toml, lockstep)
# on a shaped model (benchmarks/shapes.py), LoRA rank 32 on every linear layer, with the adapter synced
# to vLLM alone or merged into full weights, against full fine-tuning; after the wheels of
# benchmarks/envs/verl-0.9.1.txt are installed (the GPU machine: ". $HOME/stage/env.sh" first).
#
#   bash benchmarks/lora_sitting.sh --shape qwen2.5-1.5b --rows "adapter merged full" [--steps 3]
#                                   [--batch B] [--gsm8k DIR] [--results FILE] [--timeout S] [--no-sync-bench]
#
# Rows: adapter (rollout.vllm.lora_sync = "adapter"), merged (LoRA, merged weights every sync), full
# (no LoRA). Each row: benchmarks/grpo_step.py rlcore-vllm --job a with the shape's model, gradient
# checkpointing and 16384-token budgets (the one-GPU issue's 1.5B settings), labelled
# "<shape> <row>"; --batch cuts data.train_batch_size (and the mini-batch) where a shape must fit the
# call's time. The results (s/step, phases with timing_s/update_weights, peak GPU memory) go to FILE
# (default $OUT/bench-lora.jsonl) and each run's log to $OUT/logs/. Where the rows hold both adapter and
# merged, the sync alone is timed after them (benchmarks/lora_sync.py on the same shape: the median of 3
# syncs each, and the generations after them; $OUT/bench-lora-sync.jsonl) unless --no-sync-bench.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.}
shape=qwen2.5-1.5b rows="adapter merged full" steps=3 batch="" gsm8k=.gpu-data/gsm8k results="" timeout=300
sync_bench=1
while [ $# -gt 0 ]; do
  case "$1" in
    --shape) shape=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --gsm8k) gsm8k=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --no-sync-bench) sync_bench=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
results=${results:-$out/bench-lora.jsonl}
model=$(realpath -m ".gpu-data/shapes/$shape")
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
mkdir -p "$out/logs"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || { echo "rlcore did not install"; exit 1; }
python3 benchmarks/shapes.py "$shape" --out "$model" || exit 1
common=("model.path=$model" model.enable_gradient_checkpointing=true actor.ppo_max_token_len_per_gpu=16384
        rollout.log_prob_max_token_len_per_gpu=16384 ref.log_prob_max_token_len_per_gpu=16384)
[ -n "$batch" ] && common+=("data.train_batch_size=$batch" "actor.ppo_mini_batch_size=$batch")
lora=(model.lora_rank=32 model.lora_alpha=32)  # model.target_modules' default: all-linear
for row in $rows; do
  case "$row" in
    adapter) extra=("${lora[@]}" rollout.vllm.lora_sync=adapter) ;;
    merged) extra=("${lora[@]}" rollout.vllm.lora_sync=merged) ;;
    full) extra=() ;;
    *) echo "unknown row $row (adapter, merged, full)" >&2; exit 2 ;;
  esac
  echo "[$(date +%T)] $shape $row"
  python3 benchmarks/grpo_step.py rlcore-vllm --job a --gsm8k "$gsm8k" --results "$results" --steps "$steps" \
    --timeout "$timeout" --label "$shape $row" -- "${common[@]}" "${extra[@]}" > "$out/logs/lora-$shape-$row.log" 2>&1 \
    || { echo "$shape $row FAILED:"; tail -n 40 "$out/logs/lora-$shape-$row.log"; }
  grep -E "^step [0-9]|rollout:|Error|error" "$out/logs/lora-$shape-$row.log" | tail -n 8
done
[ -f "$results" ] && python3 benchmarks/grpo_step.py table "$results"
if [ "$sync_bench" = 1 ] && [[ " $rows " == *" adapter "* && " $rows " == *" merged "* ]]; then
  echo "[$(date +%T)] $shape: the sync alone (benchmarks/lora_sync.py)"
  python3 benchmarks/lora_sync.py --model "$model" --label "$shape" --rows "adapter merged" \
    --results "$out/bench-lora-sync.jsonl" --timeout "$timeout" > "$out/logs/lora-sync-$shape.log" 2>&1 \
    || { echo "$shape sync bench FAILED:"; tail -n 40 "$out/logs/lora-sync-$shape.log"; }
  grep -E "^\|" "$out/logs/lora-sync-$shape.log"
fi
