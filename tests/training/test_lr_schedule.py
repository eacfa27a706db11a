"""The learning-rate schedule's cosine floor: ``optim.min_lr`` (an absolute rate, verl's megatron
spelling) or ``optim.min_lr_ratio`` (a fraction of lr), checked against the cosine written out here."""

import math

import attrs
import pytest

from rlcore.config import load_job
from rlcore.config.schema import OptimConfig
from rlcore.errors import ConfigError
from rlcore.plugins.manager import PluginManager
from rlcore.training.lr_schedule import LrSchedule


def rates(optim: OptimConfig, total: int) -> list[float]:
    schedule = LrSchedule(optim, "actor.optim", total_steps=total)
    out = []
    for step in range(total + 1):
        schedule.step = step
        out.append(schedule.lr())
    return out


def test_the_cosine_decays_from_lr_to_min_lr_which_takes_the_ratios_place():
    optim = attrs.evolve(OptimConfig(), lr=1e-5, lr_scheduler="cosine", min_lr=1e-6, min_lr_ratio=0.5)
    got = rates(optim, 4)
    expected = [1e-6 + (1e-5 - 1e-6) * 0.5 * (1 + math.cos(math.pi * step / 4)) for step in range(5)]
    assert got == pytest.approx(expected)
    assert got[-1] == pytest.approx(1e-6)
    without = rates(attrs.evolve(optim, min_lr=None), 4)
    assert without[-1] == pytest.approx(0.5e-5)  # the ratio when min_lr is unset


def test_verls_min_lr_lands_on_the_schedule_and_may_not_exceed_lr():
    job = load_job(None, ["actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.optim.min_lr=1e-6",
                          "actor_rollout_ref.actor.optim.lr_decay_style=cosine"], manager=PluginManager())
    assert job.config.actor.optim.min_lr == 1e-6
    constant = load_job(None, ["actor_rollout_ref.actor.optim.min_lr=1e-7"], manager=PluginManager())
    assert ("actor.optim.min_lr has no effect while actor.optim.lr_scheduler is 'constant' (it is the cosine "
            "schedule's floor)") in constant.warnings
    with pytest.raises(ConfigError, match=r"actor.optim.min_lr \(0.001\) is the floor"):
        load_job(None, ["actor.optim.min_lr=1e-3", "actor.optim.lr_scheduler=cosine"], manager=PluginManager())


@pytest.mark.parametrize("num_cycles, min_lr_ratio, warmup", [(0.5, 0.0, 0), (0.5, 0.1, 2), (1.0, 0.2, 3), (1.5, 0.0, 1)])
def test_the_cosine_with_its_cycles_is_verls(num_cycles, min_lr_ratio, warmup):
    """verl 0.9.1's ``get_cosine_schedule_with_warmup`` (the same ``num_cycles`` and floor), after warmup;
    rlcore's warmup reaches lr on its last warmup step where verl's starts at 0 (docs/algorithms.md)."""
    torch = pytest.importorskip("torch")
    from tests.verl_reference import import_verl

    verl_F = import_verl().torch_functional
    total, lr = 12, 1e-5
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    verl_schedule = verl_F.get_cosine_schedule_with_warmup(optimizer, warmup, total, min_lr_ratio=min_lr_ratio,
                                                           num_cycles=num_cycles)
    theirs = []
    for _ in range(total):
        theirs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        verl_schedule.step()
    optim = attrs.evolve(OptimConfig(), lr=lr, lr_scheduler="cosine", min_lr_ratio=min_lr_ratio,
                         num_cycles=num_cycles, warmup_steps=warmup)
    assert rates(optim, total)[warmup:total] == pytest.approx(theirs[warmup:], rel=1e-9, abs=1e-15)


def test_verls_eps_and_num_cycles_land_on_the_optimizer():
    job = load_job(None, ["actor_rollout_ref.actor.optim.eps=1e-6", "actor_rollout_ref.actor.optim.num_cycles=1.0",
                          "critic.optim.eps=1e-5", "actor_rollout_ref.actor.optim.lr_decay_style=cosine"],
                   manager=PluginManager())
    assert job.config.actor.optim.eps == 1e-6 and job.config.actor.optim.num_cycles == 1.0
    assert job.config.critic.optim.eps == 1e-5
    from rlcore_fsdp.optim import build_optimizer

    torch = pytest.importorskip("torch")
    optimizer = build_optimizer(torch.nn.Linear(2, 2), job.config.actor.optim)
    assert optimizer.param_groups[0]["eps"] == 1e-6
    constant = load_job(None, ["actor.optim.num_cycles=2"], manager=PluginManager())
    assert ("actor.optim.num_cycles has no effect while actor.optim.lr_scheduler is 'constant' (it shapes the "
            "cosine schedule)") in constant.warnings
