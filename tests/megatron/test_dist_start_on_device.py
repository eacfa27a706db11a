"""On a GPU: roles started from a distributed checkpoint with TransformerEngine's layer names
(``use_dist_checkpointing``) compute what the same roles loaded from the Hugging Face folder compute.
The checkpoint is written in fp32 (verl writes bfloat16) so that the two must agree exactly; the
CPU tests (``test_dist_start.py``) check the bfloat16 case and the other layouts."""

from __future__ import annotations

import pytest
import torch

from rlcore.testing import build_actor, build_critic, build_reference
from rlcore_megatron.options import MegatronOptions
from tests.fsdp.helpers import RESPONSE_LENGTH, job, make_batch
from tests.megatron.conftest import build_tiny_qwen3_moe, needs_accelerator, needs_megatron
from tests.megatron.dist_start_ranks import hf_tensors_of, te_checkpoint
from tests.megatron.test_on_device import plain


@pytest.fixture(scope="module")
def platform():
    needs_megatron()
    return needs_accelerator()


@pytest.mark.parametrize("experts", [None, 4])
def test_roles_started_from_a_te_named_dist_checkpoint_compute_what_the_folders_roles_compute(platform, tmp_path,
                                                                                            experts):
    from megatron.core import dist_checkpointing
    from transformers import AutoConfig

    from rlcore_megatron.backend import MegatronBackend

    backend = MegatronBackend()
    hf_dir = build_tiny_qwen3_moe(tmp_path / "qwen3", experts=experts, std=0.3)
    batch = make_batch(5)
    mask = batch["response_mask"].bool()
    from_folder = build_reference(backend, job(hf_dir), platform).compute_ref_log_prob(batch)["ref_log_prob"]
    # written here, after the reference set up the process group and megatron-core's layout
    tensors = {name: tensor.to(platform.device()) for name, tensor in hf_tensors_of(str(hf_dir)).items()}
    (tmp_path / "dist").mkdir()
    dist_checkpointing.save(te_checkpoint(tensors, AutoConfig.from_pretrained(hf_dir), torch.float32),
                            str(tmp_path / "dist"))
    start = MegatronOptions(use_dist_checkpointing=True, dist_checkpointing_path=str(tmp_path / "dist"))
    config = job(hf_dir, sections={f"{role}.megatron": start for role in ("actor", "ref", "critic")})
    reference = build_reference(backend, config, platform).compute_ref_log_prob(batch)["ref_log_prob"]
    actor = build_actor(backend, config, platform).compute_log_prob(batch)["old_log_probs"]
    assert torch.equal(reference[mask], from_folder[mask])
    torch.testing.assert_close(actor[mask], reference[mask], atol=1e-6, rtol=0)
    expected = plain(hf_dir, batch, platform.device())
    torch.testing.assert_close(reference[mask], expected[mask], atol=2e-3, rtol=0)
    values = build_critic(backend, config, platform).compute_values(batch)["values"]
    assert values.shape == (5, RESPONSE_LENGTH) and torch.isfinite(values[mask]).all() and values[mask].std() > 0
