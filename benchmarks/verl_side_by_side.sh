#!/usr/bin/env bash
# One sitting of the side-by-side with verl 0.9.1 on one GPU, after the wheels of
# benchmarks/envs/verl-0.9.1.txt are installed (the GPU machine: ". $HOME/stage/env.sh" first).
#
#   bash benchmarks/verl_side_by_side.sh [--gsm8k DIR] [--results FILE] [--jobs "a grpo-line ppo-line"]
#                                        [--steps N] [--line-steps N] [--batch B --mini M] [--shapes DIR]
#                                        [--verl-extra "key=value ..."] [--systems "rlcore-vllm verl-vllm"]
#                                        [--rlcore-timeout S] [--verl-timeout S] [--line-timeout S]
#
# Installs rlcore from this checkout (no network), then runs each job under rlcore (lockstep) and verl,
# each in its own process with a deadline, appending to the results file, and prints the table.
# Job a: the example job, --steps steps (default 5). grpo-line / ppo-line: verl's quickstart lines on
# the qwen2.5-0.5b shape (built into --shapes DIR first), --line-steps steps (default 2), with
# data.train_batch_size=B and ppo_mini_batch_size=M when given (the same cut for both systems).
# --verl-extra: job a once more under verl with these overrides too (row "verl-vllm+"), e.g.
# "actor_rollout_ref.model.use_remove_padding=False" (padded rows, no packed-row mask under sdpa).
# --systems: which systems run (default both), e.g. one per device call where a sitting outlasts one call.
# verl's start (Ray, TransferQueue, its agent-loop workers, vLLM's HTTP server) took about 270 s on the
# H200 on 2026-12-02, before its first step: hence its longer deadline.
# DIR holds GSM8K's train.jsonl and test.jsonl (default .gpu-data/gsm8k). The results file (default
# $OUT/bench-verl.jsonl) and each run's log ($OUT/logs/) go under $OUT where it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.}  # the GPU machine sends back what is written under $OUT
gsm8k=.gpu-data/gsm8k results=$out/bench-verl.jsonl jobs=a steps=5 line_steps=2 batch="" mini="" shapes=.gpu-data/shapes
rlcore_timeout=240 verl_timeout=560 line_timeout=560 verl_extra="" systems="rlcore-vllm verl-vllm"
while [ $# -gt 0 ]; do
  case "$1" in
    --gsm8k) gsm8k=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --line-steps) line_steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --mini) mini=$2; shift 2 ;;
    --shapes) shapes=$2; shift 2 ;;
    --verl-extra) verl_extra=$2; shift 2 ;;
    --systems) systems=$2; shift 2 ;;
    --rlcore-timeout) rlcore_timeout=$2; shift 2 ;;
    --verl-timeout) verl_timeout=$2; shift 2 ;;
    --line-timeout) line_timeout=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
# verl runs in a folder of its own: the model and data paths it is given must not be relative
shapes=$(realpath -m "$shapes") gsm8k=$(realpath -m "$gsm8k")
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
mkdir -p "$out/logs"
# logged NAME COMMAND...: the command's output into $out/logs/NAME.log; its last lines (more on failure) here
logged() {
  local name=$1; shift
  "$@" > "$out/logs/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then echo "$name FAILED (exit $rc):"; tail -n 60 "$out/logs/$name.log"; else tail -n 12 "$out/logs/$name.log"; fi
  return $rc
}

python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || { echo "rlcore did not install"; exit 1; }
python3 - <<'EOF' || exit 1
from importlib.metadata import version
import rlcore
print("rlcore", rlcore.__file__, "| verl", version("verl"), "| vllm", version("vllm"), "| transformers",
      version("transformers"), "| torch", version("torch"))
EOF
stamp "the embedded SmolLM2 as a Hugging Face folder"
python3 -c "from rlcore.models.loading import resolve_model_path as r; print(r('embedded:smollm2-135m-instruct'))" || exit 1

sizes=()
[ -n "$batch" ] && sizes+=(--batch "$batch")
[ -n "$mini" ] && sizes+=(--mini "$mini")
for job in $jobs; do
  if [ "$job" = a ]; then
    if [[ " $systems " == *" rlcore-vllm "* ]]; then
      stamp "job a: rlcore lockstep"
      logged a-rlcore-vllm python3 benchmarks/grpo_step.py rlcore-vllm --job a --gsm8k "$gsm8k" --results "$results" \
        --steps "$steps" --timeout "$rlcore_timeout"
    fi
    if [[ " $systems " == *" verl-vllm "* ]]; then
      stamp "job a: verl"
      logged a-verl-vllm python3 benchmarks/grpo_step.py verl-vllm --job a --gsm8k "$gsm8k" --results "$results" \
        --steps "$steps" --timeout "$verl_timeout"
    fi
    if [ -n "$verl_extra" ]; then
      stamp "job a: verl with $verl_extra"
      # shellcheck disable=SC2086  # the extra overrides are words
      logged a-verl-vllm-extra python3 benchmarks/grpo_step.py verl-vllm --job a --gsm8k "$gsm8k" --results "$results" \
        --steps "$steps" --timeout "$verl_timeout" --label verl-vllm+ $verl_extra
    fi
  else
    model=$shapes/qwen2.5-0.5b
    stamp "the qwen2.5-0.5b shape"
    python3 benchmarks/shapes.py qwen2.5-0.5b --out "$model" || exit 1
    for system in $systems; do
      stamp "job $job: $system"
      logged "$job-$system" python3 benchmarks/grpo_step.py "$system" --job "$job" --model "$model" --gsm8k "$gsm8k" \
        --results "$results" --steps "$line_steps" --timeout "$line_timeout" "${sizes[@]}"
    done
  fi
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | sed 's/^/left on the GPU: /'
done
stamp "done"
[ -f "$results" ] && python3 benchmarks/grpo_step.py table "$results"
