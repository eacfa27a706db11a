"""``rlcore export``: a sharded checkpoint becomes a Hugging Face folder that transformers loads and
that generates what the trained model generates."""

from __future__ import annotations

import json

import pytest
import torch

from rlcore.batch import Batch
from rlcore.cli import main
from rlcore.errors import RlcoreError
from rlcore.testing import build_actor, build_critic
from rlcore_fsdp.export import export_checkpoint
from tests.fsdp.helpers import RESPONSE_LENGTH, full_weights, job, make_batch


def trained(backend, platform, model_path, steps: int = 3):
    """An actor moved well away from its initial weights (large learning rate)."""
    actor = build_actor(backend, job(model_path, lr=3e-2), platform)
    batch = make_batch(4)
    for _ in range(steps):
        actor.update(batch.update(actor.compute_log_prob(batch)).update(
            Batch({"advantages": torch.linspace(-1, 1, 4 * RESPONSE_LENGTH).view(4, RESPONSE_LENGTH)})))
    return actor, batch


def greedy(model, prompts: torch.Tensor, device) -> torch.Tensor:
    attention_mask = (prompts != 0).long()
    return model.generate(prompts.to(device), attention_mask=attention_mask.to(device), max_new_tokens=12,
                          do_sample=False, pad_token_id=0).cpu()


def test_an_exported_folder_loads_in_transformers_and_generates_like_the_trained_model(
        backend, platform, tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    actor, batch = trained(backend, platform, tiny_model_path)
    run_step = tmp_path / "global_step_3"
    actor.save(str(run_step / "actor"))
    with actor.generation_module() as module:
        expected = greedy(module, batch["prompts"], platform.device())

    assert main(["export", str(run_step), "--to", str(tmp_path / "hf")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").to(platform.device()).eval()
    assert model.dtype == torch.float32  # the run's compute dtype on the CPU
    for name, value in full_weights(actor).items():
        torch.testing.assert_close(dict(model.named_parameters())[name].detach().cpu(), value, atol=0, rtol=0)
    assert torch.equal(greedy(model, batch["prompts"], platform.device()), expected)
    assert (expected != greedy(AutoModelForCausalLM.from_pretrained(tiny_model_path), batch["prompts"],
                               torch.device("cpu"))).any()  # training changed what it says
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").eos_token == "<|im_end|>"


def test_export_in_another_dtype_and_of_the_critic(backend, platform, tiny_model_path, tmp_path):
    from transformers import AutoModelForTokenClassification

    actor, batch = trained(backend, platform, tiny_model_path, steps=1)
    actor.save(str(tmp_path / "step" / "actor"))
    out = export_checkpoint(str(tmp_path / "step" / "actor"), str(tmp_path / "bf16"), dtype="bfloat16")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"

    critic = build_critic(backend, job(tiny_model_path), platform)
    critic.save(str(tmp_path / "step" / "critic"))
    export_checkpoint(str(tmp_path / "step"), str(tmp_path / "critic-hf"), role="critic")
    values = critic.compute_values(batch)["values"]
    model = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic-hf").eval()
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        plain = model(**inputs).logits[:, -RESPONSE_LENGTH - 1:-1, 0]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(plain[mask], values[mask], atol=1e-5, rtol=1e-5)


def test_export_refuses_a_non_empty_target_and_a_folder_without_a_checkpoint(tmp_path, capsys):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    with pytest.raises(RlcoreError, match="not empty"):
        export_checkpoint(str(tmp_path), str(tmp_path / "busy"))
    assert main(["export", str(tmp_path / "nothing"), "--to", str(tmp_path / "out")]) == 2
    assert "holds no actor checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
