import pytest

from rlcore.errors import DuplicateNameError, UnknownNameError
from rlcore.plugins.registry import FailedPlugin, Provider, Registry


def test_get_returns_what_was_registered():
    registry = Registry("reward_functions")
    registry.add("openai/gsm8k", len, Provider("core", "rlcore", "1.0"))
    assert registry.get("openai/gsm8k") is len
    assert registry.entry("openai/gsm8k").provider.distribution == "rlcore"
    assert registry.names() == ["openai/gsm8k"] and "openai/gsm8k" in registry


def test_duplicate_name_names_both_plugins():
    registry = Registry("advantage_estimators")
    registry.add("grpo", object(), Provider("core", "rlcore", "1.0"))
    with pytest.raises(DuplicateNameError) as info:
        registry.add("grpo", object(), Provider("fancy", "rlcore-fancy", "0.3"))
    message = str(info.value)
    assert "'grpo'" in message and "rlcore-fancy 0.3" in message and "plugin 'core'" in message


def test_unknown_name_lists_registered_names_and_suggests():
    registry = Registry("advantage_estimators")
    for name in ("gae", "grpo", "rloo"):
        registry.add(name, object(), Provider("core", "rlcore", "1.0"))
    with pytest.raises(UnknownNameError) as info:
        registry.get("gpro")
    message = str(info.value)
    assert "registered: gae, grpo, rloo" in message
    assert 'did you mean "grpo"' in message


def test_unknown_name_mentions_plugins_that_failed_to_load():
    failed = [FailedPlugin(Provider("broken", "rlcore-broken", "0.1"), "broken = rlcore_broken", "ImportError: x")]
    registry = Registry("policy_losses", failed)
    with pytest.raises(UnknownNameError, match="rlcore-broken 0.1.*failed to load.*ImportError: x"):
        registry.get("mystery")
