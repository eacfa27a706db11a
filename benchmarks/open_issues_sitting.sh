#!/usr/bin/env bash
# The GPU measurements the open issues still wait for, one part per device call (each fits a 10-minute
# call), after the wheels of benchmarks/envs/verl-0.9.1.txt, veomni==0.1.12 and megatron-core==0.19.2
# are installed (the GPU machine: ". $HOME/stage/env.sh" first) and GSM8K is copied to .gpu-data/gsm8k.
#
#   bash benchmarks/open_issues_sitting.sh PART [--timeout S]
#
# Parts:
#   veomni   the example GSM8K job (grpo_step.py --job a, 5 steps, lockstep, the example's micro-batch
#            budgets unless VEOMNI_BUDGET is set) on the veomni backend and on fsdp beside it (BACKENDS="veomni"
#            runs one of them), then the table
#   engine   the bare engine on the job's batch alone (vllm_generation.py, every log-prob mode, 2 rounds)
#   overlap  one GPU doing two things at once: the bare engine on the job's batch (vllm_generation.py,
#            with and without log-probs), then lockstep, 20 steps (the issue's median of steps 2-20), step
#            4 traced with torch's profiler (async_modes.py --profile)
#   overlap-lockstep  lockstep alone, 20 steps, step 4 traced (the rest of "overlap" after "engine")
#   overlap-colocated  the colocated form (rollout IS), $STEPS steps (default 20), step 4 traced (how long
#            the trainer's and the engine's kernels ran at the same moment), EXTRA's overrides (e.g.
#            EXTRA=async_training.engines_per_device=2 TAG=two-engines: two engine processes beside the trainer)
#   overlap-levers  the colocated form with the cheaper corrections (bypass; none), 20 steps each
#   overlap-sampler  the colocated form with the engine's log-probs taken at vLLM's sampler
#            (rollout.vllm.log_prob_source = "sampler"), $STEPS steps (default 20), step 4 traced; since its
#            default became "auto" (the sampler where it can), overlap-colocated runs the same unless refused
#   overlap-trainer  the colocated form (rollout IS) with the trainer's layers kept gathered from forward to
#            backward (actor/ref .fsdp.reshard_after_forward = false: on one device a "gather" is a cast and a
#            copy, done again for the backward otherwise), $STEPS steps (default 20), step 4 traced: on a
#            fast host the colocated step follows the trainer's passes (docs/async.md)
#   overlap-mps  the colocated form (rollout IS) with the two processes' kernels side by side under CUDA MPS
#            and no limit on the trainer's SMs (trainer_compute_share = 1.0: under MPS the decoding stand-in
#            slowed, the training one did not; on a fast host the trainer is what the step waits for;
#            SHARE=0.5 gives the engine the SMs the trainer may not use), $STEPS steps (default 20), step 4 traced
#   overlap-partial  the colocated form (rollout IS) with partial rollouts (async_training.partial_rollout:
#            weights reach the generations in flight), $STEPS steps (default 20), step 4 traced: never yet
#            run on a GPU (docs/async.md, "Partial rollouts")
#   overlap-pair  the three of the 135M comparison in one call, shorter: the bare engine (2 rounds), then
#            lockstep and the colocated form (rollout IS), $STEPS steps each (default 12), step 4 traced
#            EXTRA="key=value ..." gives both runs more overrides (a lever tried on both forms alike, e.g.
#            EXTRA=actor.use_torch_compile=true with TAG=compile; overlap-mps, -trainer and -1.5b-* take it too);
#            BARE_ENGINE=0 leaves the bare engine out
#   overlap-rule  the 135M runs of the sitting so far (overlap-pair, -lockstep, -colocated, -mps, -trainer, -partial) against the
#            one-GPU rule: x lockstep's samples/s and x the bare engine (benchmarks/overlap_rule.py)
#   overlap-1.5b-lockstep, overlap-1.5b-colocated, overlap-1.5b-mps  the Qwen2.5-1.5B shape
#            (benchmarks/shapes.py), one run a call (on an H100 one took ~125 s to start and ~24 s a step):
#            lockstep; the colocated form by time slices; the colocated form with its kernels side by
#            side (device_sharing = "concurrent": CUDA MPS; SHARE sets the trainer's part of the SMs, else the
#            job's arrangement chooses it from the model's size: rlcore.asynchronous.arrangement); $STEPS steps
#            (default 6), step 4 traced; GRAD_CKPT=false turns gradient checkpointing off (a lever for a
#            card with the memory for it)
#   sharing  the stand-in workloads of benchmarks/gpu_sharing.py under MPS with the train process at
#            below-normal client priority and every SM (beside the 50% limit measured before), and the
#            kernel checks of that arrangement
#   vllm-tests    tests/vllm/test_engine.py (the partial-rollout handover) and tests/vllm/test_profiler.py
#   learning-start SYSTEM... [-- OVERRIDE...]  the 30-step learning runs of benchmarks/learning_runs.py
#            (e.g. verl rlcore-default rlcore-lockstep -- data.train_batch_size=16
#            actor_rollout_ref.actor.ppo_mini_batch_size=16: verl's keys, which rlcore takes too), one after
#            another, queued (below: they outlive this call and no run restarts per call), then their table
#   learning-wait  the next calls on the same warm machine: queue-wait (learn.jsonl in queue.tar.gz)
#   probe -- ARGS  benchmarks/compile_probe.py ARGS (the trainer's three passes alone), after installing rlcore
#            (the probe finds the training backend through rlcore's entry points); needs no vLLM
#   queue -- 'COMMAND'  run COMMAND (a shell line; $OUT in it is the queue's output folder) in the
#            background of the machine, after every command queued before it: one process session runs
#            the queue, so a sitting longer than one call keeps the GPU busy between calls. Give the data
#            and models the commands need paths under $HOME (a later call's carried folders replace
#            the checkout's while they run): queue copies .gpu-data/gsm8k to $HOME/gsm8k once.
#   queue-file FILE  queue each line of FILE (a shell command a line; blank lines and # comments skipped),
#            e.g. benchmarks/plans/next-sitting.sh, the next sitting's queue
#   queue-wait  the next calls: wait up to --timeout s (default 540) for the queue to empty, then each
#            command's log end; the queue's output folder (results and every log) comes back as one file,
#            $OUT/queue.tar.gz (the machine hands back at most 8 files)
#
# Results and logs go to $OUT (default .): bench.jsonl, gen.jsonl, overlap*.json, each traced step's
# summary.json (PART-RUN-step_N.summary.json) and logs/. TAG=x names a run's files PART-x instead of PART
# (e.g. overlap-mps at two SHAREs in one queue).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.}
part=${1:?"a part: veomni, engine, overlap, overlap-lockstep, overlap-colocated, overlap-levers, overlap-sampler, overlap-trainer, overlap-mps, overlap-partial, overlap-pair, overlap-rule, overlap-1.5b-lockstep, overlap-1.5b-colocated, overlap-1.5b-mps, sharing, vllm-tests, learning-start, learning-wait, probe, queue, queue-file, queue-wait"}
shift
run_name=$part${TAG:+-$TAG}  # TAG=x: this run's work folder and results named PART-x (the same part twice)
read -r -a extra <<< "${EXTRA:-}"  # EXTRA="key=value ...": overrides for every run of overlap-pair, -colocated, -mps, -trainer, -1.5b-*
timeout=540
systems=(); overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout=$2; shift 2 ;;
    --) shift; overrides=("$@"); break ;;  # learning-start's overrides, for every system
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) systems+=("$1"); shift ;;  # learning-start's systems
  esac
done
gsm8k=${SITTING_GSM8K:-.gpu-data/gsm8k}  # a queued part: SITTING_GSM8K=$HOME/gsm8k (queue copies it there)
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
queue=${SITTING_QUEUE:-$HOME/queue}
queue_running() { pgrep -f "sitting-queue-runner $queue" > /dev/null; }
# rlcore installed from this checkout (its entry points name the plugins: run bare, nothing is registered)
install_rlcore() { python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || { echo "rlcore did not install"; exit 1; }; }
case "$part" in
  queue)
    [ ${#overrides[@]} -gt 0 ] || { echo "queue needs a command after --"; exit 2; }
    mkdir -p "$queue/out/logs"
    [ -d "$HOME/gsm8k" ] || [ ! -d "$gsm8k" ] || cp -r "$gsm8k" "$HOME/gsm8k"
    n=$(find "$queue" -maxdepth 1 -name '*.cmd' | wc -l)
    name=$(printf '%02d' $((n + 1)))
    echo "${overrides[*]}" > "$queue/$name.cmd"
    # each call starts a runner; flock lets one run at a time, each running what is pending when it gets
    # the lock, so a command queued while the last runner is leaving is still run
    setsid nohup bash -c 'cd "$1" && exec 9> "$2/lock" && flock 9 && for cmd in "$2"/*.cmd; do
        [ -e "${cmd%.cmd}.done" ] && continue
        log="$2/out/logs/$(basename "${cmd%.cmd}").log"
        echo "[$(date +%T)] $(cat "$cmd")" > "$log"
        OUT="$2/out" bash -c "$(cat "$cmd")" >> "$log" 2>&1; rc=$?
        echo "[$(date +%T)] exit $rc" >> "$log"; touch "${cmd%.cmd}.done"
      done' "sitting-queue-runner $queue" "$PWD" "$queue" > /dev/null 2>&1 < /dev/null &
    echo "queued $name: ${overrides[*]}"; exit 0 ;;
  queue-file)  # each line of the file (past blank lines and # comments) queued in order
    plan=${systems[0]:?"queue-file needs a file of commands, one a line"}
    [ -f "$plan" ] || { echo "queue-file: no file $plan"; exit 2; }
    grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$plan" | while IFS= read -r line; do
      bash "$PWD/benchmarks/open_issues_sitting.sh" queue -- "$line" || exit 1
    done; exit ;;
  probe)  # benchmarks/compile_probe.py with the arguments after --, rlcore installed first; no vLLM needed
    install_rlcore
    exec timeout "$timeout" python3 benchmarks/compile_probe.py "${overrides[@]}" ;;
  queue-wait)
    # polled each second: the call returns within a second of the queue emptying (device time is counted)
    until_s=$((SECONDS + timeout)); while queue_running && [ $SECONDS -lt $until_s ]; do sleep 1; done
    queue_running && echo "(the queue is still running: call queue-wait again)"
    for log in "$queue"/out/logs/*.log; do
      [ -f "$log" ] || continue
      echo "== $(basename "$log"): $(head -n 1 "$log")"; grep -v "Capturing CUDA" "$log" | tail -n 12
    done
    # one file: the device machine hands back at most 8 files from $OUT, and a queue's logs are more
    mkdir -p "$out" && tar -czf "$out/queue.tar.gz" -C "$queue" out && echo "results and logs: queue.tar.gz (tar -xzf: out/)"; exit 0 ;;
esac
mkdir -p "$out/logs"
install_rlcore
python3 -c 'import torch, transformers, vllm; print("torch", torch.__version__, "transformers", transformers.__version__,
"vllm", vllm.__version__, torch.cuda.get_device_name(0))'
job=examples/gsm8k_grpo_smollm2.toml
keep_summaries() {  # each traced step's summary.json (costliest kernels and operators per process) to $OUT
  for f in "$HOME/$run_name"/*/profile/step_*/summary.json; do
    [ -f "$f" ] || continue
    run=${f#"$HOME/$run_name/"}; cp "$f" "$out/${run_name}-${run%%/*}-$(basename "$(dirname "$f")").summary.json"
  done
}
trap keep_summaries EXIT
case "$part" in
  veomni)
    rlcore plugins | grep -E "veomni|torchtitan|fsdp"
    # the example's own micro-batch budgets (32768 tokens to update); VEOMNI_BUDGET=8192 lowers them all
    # (before log-probs were chunked, 32768 ran out of an 80 GB H100's memory: docs/backend-veomni.md)
    budgets=()
    [ -n "${VEOMNI_BUDGET:-}" ] && budgets=("actor.ppo_max_token_len_per_gpu=$VEOMNI_BUDGET"
      "ref.log_prob_max_token_len_per_gpu=$VEOMNI_BUDGET" "rollout.log_prob_max_token_len_per_gpu=$VEOMNI_BUDGET")
    for backend in ${BACKENDS:-veomni fsdp}; do
      echo "[$(date +%T)] $backend"
      python3 benchmarks/grpo_step.py rlcore-vllm --job a --gsm8k "$gsm8k" --steps 5 --results "$out/bench.jsonl" \
        --timeout $((timeout / 2 - 20)) --label "rlcore-vllm $backend" -- "trainer.backend=$backend" \
        async_training.mode=off "${budgets[@]}" > "$out/logs/$backend.log" 2>&1 || tail -n 30 "$out/logs/$backend.log"
    done
    python3 benchmarks/grpo_step.py table "$out/bench.jsonl" ;;
  engine)
    timeout "$timeout" python3 benchmarks/vllm_generation.py --gsm8k "$gsm8k" --results "$out/gen.jsonl" --rounds 2 \
      --modes sampler none flat dicts > "$out/logs/gen.log" 2>&1 || tail -n 30 "$out/logs/gen.log"
    python3 benchmarks/vllm_generation.py table "$out/gen.jsonl" ;;
  overlap|overlap-lockstep|overlap-colocated|overlap-levers)
    case "$part" in
      overlap)
        python3 benchmarks/vllm_generation.py --gsm8k "$gsm8k" --results "$out/gen.jsonl" --rounds 3 \
          > "$out/logs/gen.log" 2>&1 || tail -n 30 "$out/logs/gen.log"
        python3 benchmarks/vllm_generation.py table "$out/gen.jsonl"
        runs=(--modes off); runs_timeout=$((timeout - 150)) ;;
      overlap-lockstep) runs=(--modes off); runs_timeout=$((timeout - 20)) ;;
      overlap-colocated) runs=(--modes colocated --correction is); runs_timeout=$((timeout - 20)) ;;
      *) runs=(--modes colocated --correction bypass none); runs_timeout=$((timeout / 2 - 10)) ;;
    esac
    python3 benchmarks/async_modes.py --job "$job" --gsm8k "$gsm8k" --steps "${STEPS:-20}" "${runs[@]}" \
      --staleness 1 --profile 4 --timeout "$runs_timeout" --work "$HOME/$run_name" --out "$out/$run_name.json" \
      ${extra[@]+-- "${extra[@]}"} ;;
  overlap-sampler)
    python3 benchmarks/async_modes.py --job "$job" --gsm8k "$gsm8k" --steps "${STEPS:-20}" --modes colocated \
      --staleness 1 --correction is --profile 4 --timeout $((timeout - 20)) --work "$HOME/$run_name" \
      --out "$out/$run_name.json" -- rollout.vllm.log_prob_source=sampler ;;
  overlap-trainer)
    python3 benchmarks/async_modes.py --job "$job" --gsm8k "$gsm8k" --steps "${STEPS:-20}" --modes colocated \
      --staleness 1 --correction is --profile 4 --timeout $((timeout - 20)) --work "$HOME/$run_name" \
      --out "$out/$run_name.json" -- actor.fsdp.reshard_after_forward=false ref.fsdp.reshard_after_forward=false \
      ${extra[@]+"${extra[@]}"} ;;
  overlap-mps)
    python3 benchmarks/async_modes.py --job "$job" --gsm8k "$gsm8k" --steps "${STEPS:-20}" --modes colocated \
      --sharing concurrent --staleness 1 --correction is --profile 4 --timeout $((timeout - 20)) \
      --work "$HOME/$run_name" --out "$out/$run_name.json" -- "async_training.trainer_compute_share=${SHARE:-1.0}" \
      ${extra[@]+"${extra[@]}"} ;;
  overlap-partial)
    python3 benchmarks/async_modes.py --job "$job" --gsm8k "$gsm8k" --steps "${STEPS:-20}" --modes colocated \
      --staleness 1 --correction is --profile 4 --timeout $((timeout - 20)) --work "$HOME/$run_name" \
      --out "$out/$run_name.json" -- async_training.partial_rollout=true ;;
  overlap-pair)
    engine_budget=0  # seconds of the part's timeout kept for the bare engine
    if [ "${BARE_ENGINE:-1}" != 0 ]; then
      engine_budget=170
      # the rule's mode first (the job's log-probs at the sampler): an engine slow to start once left no time for it
      timeout 150 python3 benchmarks/vllm_generation.py --gsm8k "$gsm8k" --results "$out/gen.jsonl" --rounds 2 \
        --modes sampler none flat dicts \
        > "$out/logs/gen.log" 2>&1 || tail -n 30 "$out/logs/gen.log"
      python3 benchmarks/vllm_generation.py table "$out/gen.jsonl"
    fi
    python3 benchmarks/async_modes.py --job "$job" --gsm8k "$gsm8k" --steps "${STEPS:-12}" --modes off colocated \
      --staleness 1 --correction is --profile 4 --timeout $(((timeout - engine_budget) / 2)) --work "$HOME/$run_name" \
      --out "$out/$run_name.json" ${extra[@]+-- "${extra[@]}"} ;;
  overlap-rule)  # the 135M runs of this sitting so far against the rule (benchmarks/overlap_rule.py)
    runs=()
    for f in "$out"/overlap-pair*.json "$out"/overlap-lockstep*.json "$out"/overlap-colocated*.json "$out"/overlap-mps*.json \
             "$out"/overlap-trainer*.json "$out"/overlap-partial*.json; do [ -f "$f" ] && runs+=("$f"); done
    [ ${#runs[@]} -gt 0 ] || { echo "overlap-rule: no 135M run's results in $out yet"; exit 1; }
    lockstep=(); [ -f "$out/overlap-pair.json" ] && lockstep=(--lockstep "$out/overlap-pair.json")
    python3 benchmarks/overlap_rule.py --engine "$out/gen.jsonl" "${lockstep[@]}" "${runs[@]}" ;;
  overlap-1.5b-lockstep|overlap-1.5b-colocated|overlap-1.5b-mps)
    model=$HOME/shapes/qwen2.5-1.5b  # outside the carried folders, so that a later call on the machine finds it
    [ -f "$model/config.json" ] || python3 benchmarks/shapes.py qwen2.5-1.5b --out "$model" || exit 1
    share=()
    case "$part" in
      *lockstep) runs=(--modes off) ;;
      *colocated) runs=(--modes colocated --sharing time_slicing) ;;
      *mps) runs=(--modes colocated --sharing concurrent)
            # unset: the arrangement's (60, 70, 80% compute wrong under MPS: docs/async.md)
            [ -n "${SHARE:-}" ] && share=("async_training.trainer_compute_share=$SHARE") ;;
    esac
    python3 benchmarks/async_modes.py --job "$job" --gsm8k "$gsm8k" --steps "${STEPS:-6}" "${runs[@]}" --staleness 1 \
      --correction is --profile 4 --timeout $((timeout - 30)) --work "$HOME/$run_name" --out "$out/$run_name.json" -- \
      "model.path=$model" "model.enable_gradient_checkpointing=${GRAD_CKPT:-true}" actor.ppo_max_token_len_per_gpu=16384 \
      rollout.log_prob_max_token_len_per_gpu=16384 ref.log_prob_max_token_len_per_gpu=16384 "${share[@]}" \
      ${extra[@]+"${extra[@]}"} ;;
  sharing)
    python3 benchmarks/gpu_sharing.py --mps --decode-steps 2000 --train-steps 3000 --train-sm-percent 50 \
      --train-below-normal
    python3 benchmarks/gpu_sharing.py --check --train-below-normal ;;
  vllm-tests)
    timeout "$timeout" python3 -m pytest -q -rs -p no:cacheprovider tests/vllm/test_engine.py \
      tests/vllm/test_profiler.py 2>&1 | tail -n 40 ;;
  learning-start)  # the learning runs as one queued command (below), so that they outlive this call
    [ ${#systems[@]} -gt 0 ] || { echo "learning-start needs the systems to run (benchmarks/learning_runs.py)"; exit 2; }
    exec bash "$PWD/benchmarks/open_issues_sitting.sh" queue -- "python3 benchmarks/learning_runs.py run ${systems[*]} \
--gsm8k \$HOME/gsm8k --work \$HOME/learn --results \$OUT/learn.jsonl --timeout 3000 -- ${overrides[*]} \
&& python3 benchmarks/learning_runs.py table \$OUT/learn.jsonl" ;;
  learning-wait) exec bash "$PWD/benchmarks/open_issues_sitting.sh" queue-wait --timeout "$timeout" ;;
  *) echo "unknown part $part (veomni, engine, overlap, overlap-lockstep, overlap-colocated, overlap-levers, overlap-sampler, overlap-trainer, overlap-mps, overlap-partial, overlap-pair, overlap-rule, overlap-1.5b-lockstep, overlap-1.5b-colocated, overlap-1.5b-mps, sharing, vllm-tests, learning-start, learning-wait, probe, queue, queue-file, queue-wait)" >&2; exit 2 ;;
esac
