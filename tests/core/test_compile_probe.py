"""``benchmarks/compile_probe.py``: the rows it trains on vary in length as a rollout's do (so the packed
rows and their longest samples differ between micro-batches), and it reads dynamo's recompile messages
into reasons and limit hits."""

import logging
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import compile_probe  # noqa: E402


def test_rows_hold_prompts_and_responses_of_their_own_lengths():
    batch = compile_probe.packed_rows(rows=32, prompt=16, response=24, vocab=100, seed=1)
    prompt_lengths = batch["attention_mask"][:, :16].sum(-1)
    response_lengths = batch["response_mask"].sum(-1)
    assert prompt_lengths.min() >= 4 and prompt_lengths.max() <= 16 and len(set(prompt_lengths.tolist())) > 3
    assert response_lengths.min() >= 1 and response_lengths.max() <= 24 and len(set(response_lengths.tolist())) > 3
    # prompts left-padded, responses right-padded, pads are token 0 and carry no advantage
    assert (batch["prompts"][batch["attention_mask"][:, :16] == 0] == 0).all()
    assert (batch["responses"][batch["response_mask"] == 0] == 0).all()
    assert (batch["advantages"][batch["response_mask"] == 0] == 0).all()


def test_recompile_messages_become_counted_reasons_and_limit_hits():
    reasons = compile_probe.RecompileReasons()
    log = logging.getLogger("compile-probe-test")
    log.addHandler(reasons)
    message = ("Recompiling function forward in modeling_qwen2.py:262\n"
               "    triggered by the following guard failure(s):\n"
               "    - 5/0: GLOBAL_STATE changed: grad_mode ")
    log.warning(message)
    log.warning(message)
    log.warning("torch._dynamo hit config.recompile_limit (8)\n   function: 'forward'")
    assert reasons.reasons == {"forward: GLOBAL_STATE changed: grad_mode": 2}
    assert reasons.limit_hits == ["torch._dynamo hit config.recompile_limit (8)"]


def test_the_eager_probe_times_each_pass_of_its_steps(capsys):
    """``--eager``: the same work with the layers eager, each pass timed; the medians leave the first step out."""
    import re

    assert compile_probe.main(["--eager", "--layers", "2", "--steps", "3", "--rows", "8", "--prompt", "8",
                               "--response", "8", "--tokens", "64", "--", "model.dtype=float32"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("seconds: old log-probs ") == 3
    medians = re.search(r"layers eager, gradients reduced once a mini-batch; median seconds of steps 2-3: "
                        r"old log-probs ([\d.]+), reference ([\d.]+), "
                        r"update ([\d.]+)", printed)
    assert medians and all(float(value) > 0 for value in medians.groups())


@pytest.mark.slow  # compiling on a 2-core CPU: ~20 s
def test_compiled_layers_over_packed_rows_on_the_cpu_stay_under_the_recompile_limit(capsys):
    """On the CPU packed rows are attended sample by sample (a Python loop over the micro-batch's sample
    bounds). Traced into the compiled layers, that loop recompiled for every new count of samples and used up
    dynamo's recompile limit (8) within three steps of this probe, after which those frames ran eager for good;
    the loop now runs outside the compiled graphs."""
    import torch

    torch._dynamo.reset()
    assert compile_probe.main(["--layers", "2", "--steps", "3", "--rows", "64", "--prompt", "8",
                               "--response", "8", "--tokens", "96", "--", "model.dtype=float32"]) == 0
    printed = capsys.readouterr().out
    assert "recompile limit reached: no" in printed
    assert "layers compiled" in printed
    assert int(printed.split("step 3: graphs ")[1].split(",")[0]) > 0  # the layers did run compiled


@pytest.mark.slow
def test_compiled_layers_under_gradient_checkpointing_stay_under_the_recompile_limit(capsys):
    """transformers' checkpointing wrapper is a frame entered with two closures, with and without gradients
    and in the backward's replay: it used up dynamo's default limit (8) in step 1, and ran eager after. The
    1.5B shape of issue 34 trains with checkpointing and, since 2026-12-07, compiled layers."""
    import torch

    torch._dynamo.reset()
    limit = torch._dynamo.config.recompile_limit
    try:
        assert compile_probe.main(["--layers", "2", "--steps", "3", "--rows", "32", "--prompt", "8", "--response", "8",
                                   "--tokens", "96", "--", "model.dtype=float32",
                                   "model.enable_gradient_checkpointing=true"]) == 0
    finally:
        torch._dynamo.config.recompile_limit = limit
    printed = capsys.readouterr().out
    assert "recompile limit reached: no" in printed
    assert int(printed.split("step 3: graphs ")[1].split(",")[0]) > 0
