"""``[rollout.agent]``'s checks of a job: an unknown agent lists the registered ones; what agent rollouts
lack is refused by name, the asynchronous forms included."""

from __future__ import annotations

import pytest

from rlcore.agents import Agent
from rlcore.config import load_job
from rlcore.errors import RlcoreError
from rlcore.plugins.hookspecs import hookimpl
from rlcore.plugins.manager import PluginManager

BASE = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4"]


async def _answer(episode, client):
    return "42"


class AgentsPlugin:
    @hookimpl
    def rlcore_register_agents(self, register):
        register("mine/answer", Agent(_answer))


def problems_of(*overrides: str) -> str:
    manager = PluginManager(plugins={"agents": AgentsPlugin()})
    with pytest.raises(RlcoreError) as error:
        load_job(None, BASE + list(overrides), manager=manager)
    return str(error.value)


def test_a_registered_agent_loads_and_an_unknown_one_lists_them():
    manager = PluginManager(plugins={"agents": AgentsPlugin()})
    job = load_job(None, BASE + ["rollout.agent.name='mine/answer'"], manager=manager)
    assert job.config.section("rollout.agent").enabled and manager.get("agents", "mine/answer").run is _answer
    message = problems_of("rollout.agent.name='mine/answr'")
    assert "rollout.agent.name = 'mine/answr'" in message and 'did you mean "mine/answer"' in message


@pytest.mark.parametrize(("overrides", "named"), [
    (["rollout.multi_turn.enable=true", "rollout.multi_turn.tools=['calculator']"], "rollout.multi_turn.enable"),
    (["async_training.mode='split'"], "rollout.agent.name (agent episodes)"),
    (["algorithm.filter_groups.enable=true"], "algorithm.filter_groups.enable"),
])
def test_what_agent_rollouts_lack_is_refused_by_name(overrides, named):
    assert named in problems_of("rollout.agent.name='mine/answer'", *overrides)


def test_a_command_is_an_argv_or_a_string_split_as_a_shell_would():
    manager = PluginManager(plugins={"agents": AgentsPlugin()})
    for given, argv in (("""rollout.agent.command='python agent.py --say "a b"'""", ["python", "agent.py", "--say", "a b"]),
                        ("""rollout.agent.command=["python", "my agent.py"]""", ["python", "my agent.py"])):
        section = load_job(None, BASE + [given], manager=manager).config.section("rollout.agent")
        assert section.enabled and section.name is None and section.argv == argv


@pytest.mark.parametrize(("overrides", "named"), [
    (["rollout.agent.name='mine/answer'", "rollout.agent.command='python agent.py'"],
     "rollout.agent.name and rollout.agent.command are both set"),
    (["rollout.agent.command=[]"], "rollout.agent.command = []: expected a program and its arguments"),
    (["rollout.agent.command=3"], "rollout.agent.command: expected a string or an array of strings, got an integer 3"),
    (["rollout.agent.command='python agent.py'", "algorithm.filter_groups.enable=true"],
     "algorithm.filter_groups.enable (dynamic sampling) with rollout.agent.command"),
    (["rollout.agent.max_failed_share=1.5"], "rollout.agent.max_failed_share: must be <= 1.0"),
])
def test_a_command_is_checked_by_name(overrides, named):
    assert named in problems_of(*overrides)
