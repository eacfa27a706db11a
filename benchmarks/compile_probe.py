"""Does ``actor.use_torch_compile`` run compiled code? The actor and the reference of one job, built in this
process on this machine's platform, take a few steps of the work a GRPO step gives them (the old log-probs,
the reference's log-probs, an update) on packed rows of varied lengths; torch's dynamo counters and
recompile reasons are printed after each step.

Built when a whole job's layers ran eager on an H100 with the setting given (docs/benchmarks.md,
2026-12-06: the override never reached the job, and hf generation used up dynamo's recompile limit). It
answers whether the layers compile on a machine, and why they recompile, in a minute, without the engine:

    python benchmarks/compile_probe.py --model DIR --steps 3 -- model.dtype=bfloat16

It prints, per step, dynamo's graph count and how many frames it compiled and the seconds of each pass (the
device synchronized after each), and at the end each recompile's reason (the first guard that failed) with
its count, whether dynamo reached its recompile limit (past it, a frame runs eager for good), and the
median seconds of each pass over steps 2 and later. ``--eager`` runs the same work with the layers eager
(the comparison: what compiling brings the trainer's passes, without the engine beside them);
``--reduce-each-micro-batch`` has FSDP reduce the gradients after every micro-batch, as before 2026-12-07.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class RecompileReasons(logging.Handler):
    """Collects dynamo's recompile messages (``TORCH_LOGS=recompiles`` goes to this logger)."""

    def __init__(self):
        super().__init__()
        self.reasons: collections.Counter = collections.Counter()
        self.limit_hits: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "recompile_limit" in message or "cache_size_limit" in message:
            self.limit_hits.append(message.splitlines()[0][:300])
        lines = message.splitlines()
        if lines and lines[0].startswith("Recompiling function"):
            where = lines[0].split(" in ")[0].replace("Recompiling function ", "")
            first = next((line.strip() for line in lines[1:] if line.strip().startswith("- ")), "?")
            self.reasons[f"{where}: {first.split(':', 1)[-1].strip()[:160]}"] += 1


@contextlib.contextmanager
def recompile_reasons():
    """dynamo's recompile messages collected while the block runs; the logging as it was afterwards."""
    import torch

    reasons = RecompileReasons()
    torch_log = logging.getLogger("torch._dynamo")  # the recompile messages' loggers are below it
    torch._logging.set_logs(recompiles=True)
    torch_log.addHandler(reasons)
    try:
        yield reasons
    finally:
        torch_log.removeHandler(reasons)
        torch._logging.set_logs()


def packed_rows(rows: int, prompt: int, response: int, vocab: int, seed: int):
    """A rollout's rows: prompts left-padded to ``prompt``, responses right-padded to ``response``, each row of
    its own lengths (so every micro-batch's packed row and longest sample differ)."""
    import torch

    from rlcore.batch import Batch

    g = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(prompt // 4, prompt + 1, (rows,), generator=g)
    response_lengths = torch.randint(1, response + 1, (rows,), generator=g)
    prompt_mask = (torch.arange(prompt) >= prompt - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(response) < response_lengths[:, None]).long()
    prompts = torch.randint(3, vocab, (rows, prompt), generator=g) * prompt_mask
    responses = torch.randint(3, vocab, (rows, response), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    return Batch({"prompts": prompts, "responses": responses, "response_mask": response_mask,
                  "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention_mask,
                  "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
                  "advantages": torch.randn(rows, response, generator=g) * response_mask})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a Hugging Face model folder (default: a tiny random Qwen2)")
    parser.add_argument("--layers", type=int, default=4, help="(the tiny model) its decoder layers")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=128, help="prompt columns (rows hold a quarter to all)")
    parser.add_argument("--response", type=int, default=256, help="response columns (rows hold 1 to all)")
    parser.add_argument("--tokens", type=int, default=4096, help="actor.ppo_max_token_len_per_gpu")
    parser.add_argument("--eager", action="store_true", help="the layers eager (actor.use_torch_compile=false)")
    parser.add_argument("--reduce-each-micro-batch", action="store_true",
                        help="FSDP reduces the gradients after every micro-batch, as before 2026-12-07 (on one "
                             "device they now accumulate unreduced until a mini-batch's last)")
    parser.add_argument("extra", nargs="*", help="after --: more job overrides (key=value)")
    args = parser.parse_args(argv)

    import torch
    import torch._dynamo

    from rlcore.config import load_job
    from rlcore.plugins.manager import get_manager
    from rlcore.runtime.platforms import current_platform
    from rlcore.testing import build_actor, build_reference, build_tiny_model

    model = args.model or str(build_tiny_model(Path(tempfile.mkdtemp(prefix="compile-probe-")) / "tiny",
                                               num_layers=args.layers))
    config = load_job(None, [f'model.path="{model}"', "model.use_remove_padding=true",
                             f"actor.use_torch_compile={str(not args.eager).lower()}", "actor.use_dynamic_bsz=true",
                             f"actor.ppo_max_token_len_per_gpu={args.tokens}", f"actor.ppo_mini_batch_size={args.rows}",
                             f"ref.log_prob_max_token_len_per_gpu={args.tokens}",
                             f"rollout.log_prob_max_token_len_per_gpu={args.tokens}",
                             "actor.use_kl_loss=true", f"data.train_batch_size={args.rows}", "rollout.n=1",
                             f"data.max_prompt_length={args.prompt}", f"data.max_response_length={args.response}",
                             *args.extra]).config
    with recompile_reasons() as reasons:
        platform = current_platform()
        backend = get_manager().get("training_backends", "fsdp")
        actor, reference = build_actor(backend, config, platform), build_reference(backend, config, platform)
        if args.reduce_each_micro_batch:
            actor.reduce_last_micro_batch_only = False
        counters = torch._dynamo.utils.counters
        synchronize = getattr(platform.device_module, "synchronize", lambda: None)
        seconds = collections.defaultdict(list)  # pass -> its seconds, step by step

        def timed(name, work):
            synchronize()
            start = time.perf_counter()
            result = work()
            synchronize()
            seconds[name].append(time.perf_counter() - start)
            return result

        for step in range(1, args.steps + 1):
            batch = packed_rows(args.rows, args.prompt, args.response, vocab=500, seed=step)
            batch = batch.update(timed("old log-probs", lambda: actor.compute_log_prob(batch)))
            batch = batch.update(timed("reference", lambda: reference.compute_ref_log_prob(batch)))
            timed("update", lambda: actor.update(batch))
            print(f"step {step}: graphs {counters['stats'].get('unique_graphs', 0)}, frames compiled "
                  f"{counters['frames'].get('ok', 0)} of {counters['frames'].get('total', 0)}, recompiles "
                  f"{sum(reasons.reasons.values())}; seconds: "
                  + ", ".join(f"{name} {values[-1]:.3f}" for name, values in seconds.items()), flush=True)
        print(f"platform {platform.name}, model {config.model.path}, dtype {config.model.dtype}")
        print("recompile reasons (count, frame: first failed guard):")
        for reason, count in reasons.reasons.most_common(30):
            print(f"  {count:4d}  {reason}")
        print("recompile limit reached: " + ("; ".join(reasons.limit_hits[:5]) if reasons.limit_hits else "no"))
        reduced = "once a mini-batch" if actor.reduce_last_micro_batch_only else "after every micro-batch"
        print(f"layers {'eager' if args.eager else 'compiled'}, gradients reduced {reduced}; median seconds of "
              f"steps 2-{args.steps}: "
              + (", ".join(f"{name} {statistics.median(values[1:]):.3f}" for name, values in seconds.items())
                 if args.steps > 1 else "- (one step: its compiles)"))
        return 0


if __name__ == "__main__":
    sys.exit(main())
