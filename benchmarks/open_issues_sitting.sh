#!/usr/bin/env bash
# The GPU measurements the open issues still wait for, one part per device call (each fits a 10-minute
# call), after the wheels of benchmarks/envs/verl-0.9.1.txt, veomni==0.1.12 and megatron-core==0.19.2
# are installed (the GPU machine: ". $HOME/stage/env.sh" first) and GSM8K is copied to .gpu-data/gsm8k.
#
#   bash benchmarks/open_issues_sitting.sh PART [--timeout S]
#
# Parts:
#   veomni   the example GSM8K job (grpo_step.py --job a, 5 steps, lockstep) on the veomni backend and on
#            fsdp beside it, then the table (the TorchTitan/VeOmni issue: its last H200 row)
#   overlap  one GPU doing two things at once: the bare engine on the job's batch (vllm_generation.py,
#            with and without log-probs), then lockstep against the colocated form with each correction,
#            12 steps each, step 4 traced with torch's profiler (async_modes.py --profile: how long the
#            trainer's and the engine's kernels ran at the same moment)
#   overlap-1.5b  the same comparison on the Qwen2.5-1.5B shape (benchmarks/shapes.py), 6 steps, step 4 traced
#   sharing  the stand-in workloads of benchmarks/gpu_sharing.py under MPS with the train process at
#            below-normal client priority and every SM (beside the 50% limit measured before), and the
#            kernel checks of that arrangement
#   vllm-tests    tests/vllm/test_engine.py (the partial-rollout handover) and tests/vllm/test_profiler.py
#
# Results and logs go to $OUT (default .): bench.jsonl, gen.jsonl, overlap*.json and logs/.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.}
part=${1:?"a part: veomni, overlap, overlap-1.5b, sharing or vllm-tests"}
shift
timeout=540
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
gsm8k=.gpu-data/gsm8k
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
mkdir -p "$out/logs"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || { echo "rlcore did not install"; exit 1; }
python3 -c 'import torch, transformers, vllm; print("torch", torch.__version__, "transformers", transformers.__version__,
"vllm", vllm.__version__, torch.cuda.get_device_name(0))'
job=examples/gsm8k_grpo_smollm2.toml
case "$part" in
  veomni)
    rlcore plugins | grep -E "veomni|torchtitan|fsdp"
    for backend in veomni fsdp; do
      echo "[$(date +%T)] $backend"
      python3 benchmarks/grpo_step.py rlcore-vllm --job a --gsm8k "$gsm8k" --steps 5 --results "$out/bench.jsonl" \
        --timeout $((timeout / 2 - 20)) --label "rlcore-vllm $backend" -- "trainer.backend=$backend" \
        async_training.mode=off > "$out/logs/$backend.log" 2>&1 || tail -n 30 "$out/logs/$backend.log"
    done
    python3 benchmarks/grpo_step.py table "$out/bench.jsonl" ;;
  overlap)
    python3 benchmarks/vllm_generation.py --gsm8k "$gsm8k" --results "$out/gen.jsonl" --rounds 3 \
      > "$out/logs/gen.log" 2>&1 || tail -n 30 "$out/logs/gen.log"
    python3 benchmarks/vllm_generation.py table "$out/gen.jsonl"
    python3 benchmarks/async_modes.py --job "$job" --steps 12 --modes off colocated --staleness 1 \
      --correction is bypass none --profile 4 --timeout $((timeout / 5)) --work "$HOME/overlap" \
      --out "$out/overlap.json" ;;
  overlap-1.5b)
    model=$(realpath -m .gpu-data/shapes/qwen2.5-1.5b)
    python3 benchmarks/shapes.py qwen2.5-1.5b --out "$model" || exit 1
    python3 benchmarks/async_modes.py --job "$job" --steps 6 --modes off colocated --staleness 1 --correction is \
      --profile 4 --timeout $((timeout / 2 - 10)) --work "$HOME/overlap-1.5b" --out "$out/overlap-1.5b.json" -- \
      "model.path=$model" model.enable_gradient_checkpointing=true actor.ppo_max_token_len_per_gpu=16384 \
      rollout.log_prob_max_token_len_per_gpu=16384 ref.log_prob_max_token_len_per_gpu=16384 ;;
  sharing)
    python3 benchmarks/gpu_sharing.py --mps --decode-steps 2000 --train-steps 3000 --train-sm-percent 50 \
      --train-below-normal
    python3 benchmarks/gpu_sharing.py --check --train-below-normal ;;
  vllm-tests)
    timeout "$timeout" python3 -m pytest -q -rs -p no:cacheprovider tests/vllm/test_engine.py \
      tests/vllm/test_profiler.py 2>&1 | tail -n 40 ;;
  *) echo "unknown part $part (veomni, overlap, overlap-1.5b, sharing, vllm-tests)" >&2; exit 2 ;;
esac
