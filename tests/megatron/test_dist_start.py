"""A role's starting weights from a megatron-core distributed checkpoint with TransformerEngine's
layer names, as verl's converter writes them (``use_dist_checkpointing``): on CPU ranks (gloo), a
checkpoint written at one rank from a tiny Hugging Face model (every tensor random, norms too) is
loaded by the backend's local-spec model at tensor-, pipeline- and expert-parallel size 1 and 2, and
every weight the model gives back equals the folder's (rounded to bfloat16, the checkpoint's dtype).

TransformerEngine does not install on a machine without CUDA, so the checkpoint is not written by a
TE-spec ``GPTModel`` but by ``dist_start_ranks.py`` from the Hugging Face tensors under the keys and
layouts read from verl's ``scripts/converter_hf_to_mcore.py`` and megatron-core 0.19.2's TE layer
spec and ``TEGroupedMLP`` (see ``rlcore_megatron/dist_start.py``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.megatron.conftest import build_tiny_qwen3_moe, needs_megatron
from tests.megatron.test_model import one_rank_layout  # noqa: F401 - the fixture
from tests.processes import run_process

REPO = Path(__file__).resolve().parents[2]
RANKS = REPO / "tests/megatron/dist_start_ranks.py"


def torchrun(ranks: int, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = run_process([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), str(RANKS),
                          *args], name=f"torchrun of {RANKS.name} {args[0]} ({ranks} gloo ranks)", timeout=600,
                         env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def build_tied_qwen2(directory: Path) -> Path:
    """The tiny Qwen2 (query/key/value biases, the output layer tied to the embedding) with every
    tensor random, norms and biases too."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.testing import build_tiny_model

    build_tiny_model(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """(Hugging Face folder, TE-named distributed checkpoint) of a dense Qwen3 (query/key norms), a
    Qwen3-MoE and a tied Qwen2 (query/key/value biases)."""
    needs_megatron()
    root = tmp_path_factory.mktemp("dist-start")
    made = {}
    for name, build in (("dense", lambda path: build_tiny_qwen3_moe(path, experts=None)),
                        ("moe", build_tiny_qwen3_moe), ("tied", build_tied_qwen2)):
        made[name] = (build(root / name), root / f"{name}-dist")
    torchrun(1, "write", *(str(path) for pair in made.values() for path in pair))  # the three in one process
    return made


LAYOUTS = [("dense", 1, 1, 1), ("dense", 2, 1, 1), ("dense", 1, 2, 1), ("moe", 2, 1, 1), ("moe", 1, 1, 2),
           ("tied", 1, 1, 1), ("tied", 2, 1, 1)]  # a tied model under pipeline parallelism needs CUDA to build


@pytest.fixture(scope="module")
def loaded(checkpoints, tmp_path_factory) -> dict[tuple, Path]:
    """Each layout's result file: the layouts of one world size loaded one after the other by one torchrun
    (a process start costs more than a load)."""
    root = tmp_path_factory.mktemp("dist-start-loads")
    outs = {layout: root / ("-".join(map(str, layout)) + ".json") for layout in LAYOUTS}
    for world in sorted({max(tp * pp, ep) for _, tp, pp, ep in LAYOUTS}):
        args = [str(arg) for layout in LAYOUTS if max(layout[1] * layout[2], layout[3]) == world
                for arg in (*checkpoints[layout[0]], *layout[1:], outs[layout])]
        torchrun(world, "load", *args)
    return outs


@pytest.mark.parametrize(("model", "tp", "pp", "ep"), LAYOUTS)
def test_every_weight_lands_where_the_hugging_face_folder_puts_it(loaded, model, tp, pp, ep):
    result = json.loads(loaded[model, tp, pp, ep].read_text())
    # every tensor of the folder comes back (the model starts as NaN: a missed parameter shows) and equals it
    assert set(result["errors"]) == set(result["hf_names"])
    assert all(error == 0.0 for error in result["errors"].values()), result["errors"]
    if model == "moe":
        assert "model.layers.1.mlp.experts.3.down_proj.weight" in result["errors"]
    if model == "tied":
        assert "model.layers.1.self_attn.v_proj.bias" in result["errors"] and "lm_head.weight" not in result["errors"]


def test_a_checkpoint_of_another_model_or_a_wrong_prefix_is_an_error_naming_the_key(checkpoints, one_rank_layout,
                                                                                  tmp_path):
    import torch

    from rlcore.errors import RlcoreError
    from rlcore_megatron.dist_start import load_dist_weights
    from rlcore_megatron.model import build_model, shape_of

    _, moe_shape = shape_of(str(checkpoints["moe"][0]), False)
    moe = build_model(moe_shape, one_rank_layout, torch.float32, torch.device("cpu"))
    # the dense model's checkpoint has the pre-MLP norm fused into linear_fc1, no router, no experts
    with pytest.raises(RlcoreError, match=r"actor\.megatron\.dist_checkpointing_path = .*no tensor "
                                          r"'decoder\.layers\.pre_mlp_layernorm\.weight'"):
        load_dist_weights(moe, str(checkpoints["dense"][1]), section="actor.megatron")
    with pytest.raises(RlcoreError, match=r"no tensor 'module\.embedding\.word_embeddings\.weight'"):
        load_dist_weights(moe, str(checkpoints["moe"][1]), section="actor.megatron", prefix="module.")
    wider = build_tiny_qwen3_moe(tmp_path / "wider", experts=None)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    _, wider_shape = shape_of(str(wider), False)
    dense = build_model(wider_shape, one_rank_layout, torch.float32, torch.device("cpu"))
    with pytest.raises(RlcoreError, match=r"'decoder\.layers\.mlp\.linear_fc1\.weight' is saved with global shape "
                                          r"\(2, 192, 64\), this model holds \(2, 256, 64\)"):
        load_dist_weights(dense, str(checkpoints["dense"][1]), section="ref.megatron")
    with pytest.raises(RlcoreError, match="critic.megatron.dist_checkpointing_path = .*no metadata.json"):
        load_dist_weights(dense, str(tmp_path), section="critic.megatron")


def test_the_critic_gets_the_checkpoints_body_and_a_new_value_head(checkpoints, one_rank_layout):
    import torch

    from rlcore_megatron.dist_start import load_dist_weights
    from rlcore_megatron.model import build_model, hf_weight_stream, new_value_head, shape_of

    hf_dir, dist_dir = checkpoints["dense"]
    _, shape = shape_of(str(hf_dir), False)
    critic = build_model(shape, one_rank_layout, torch.float32, torch.device("cpu"), value_head=True)
    with torch.no_grad():
        for param in critic.parameters():
            param.fill_(float("nan"))
    load_dist_weights(critic, str(dist_dir), section="critic.megatron", skip=("output_layer.",))
    new_value_head(critic, shape, one_rank_layout, seed=3)
    back = dict(hf_weight_stream(critic, shape, one_rank_layout, torch.float32, value_head=True))
    from safetensors.torch import load_file

    hf = load_file(str(hf_dir / "model.safetensors"))
    assert {"score.weight", "score.bias"} <= set(back)
    assert back["score.weight"].std() > 0 and not back["score.bias"].any()
    body = [name for name in back if not name.startswith("score.")]
    assert body and all(torch.equal(back[name], hf[name].to(torch.bfloat16).float()) for name in body)


def test_verls_keys_pick_the_checkpoint_a_role_starts_from():
    from rlcore.config import load_job
    from rlcore.errors import RlcoreError
    from rlcore_megatron.options import dist_checkpoint_start

    def job(*overrides: str):
        return load_job(None, ["model_engine=megatron", *overrides], check=False).config

    config = job("actor_rollout_ref.actor.megatron.use_dist_checkpointing=True",
                 "actor_rollout_ref.actor.megatron.dist_checkpointing_path=converted/qwen3",
                 "critic.megatron.use_dist_checkpointing=True", "critic.megatron.dist_checkpointing_path=nemo/qwen3",
                 "critic.megatron.dist_checkpointing_prefix=module.")
    assert dist_checkpoint_start(config, "actor.megatron") == ("converted/qwen3", "")
    assert dist_checkpoint_start(config, "critic.megatron") == ("nemo/qwen3", "module.")
    assert dist_checkpoint_start(config, "ref.megatron") is None  # the Hugging Face folder
    with pytest.raises(RlcoreError, match=r"ref\.megatron\.use_dist_checkpointing = true needs "
                                          r"ref\.megatron\.dist_checkpointing_path"):
        dist_checkpoint_start(job("actor_rollout_ref.ref.megatron.use_dist_checkpointing=True"), "ref.megatron")
    with pytest.raises(RlcoreError, match=r"actor\.megatron\.dist_checkpointing_path is set but "
                                          r"actor\.megatron\.use_dist_checkpointing is false"):
        dist_checkpoint_start(job("actor.megatron.dist_checkpointing_path=converted/qwen3"), "actor.megatron")
