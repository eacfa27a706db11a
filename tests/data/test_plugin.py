"""The built-in preprocessors and ``rlcore data`` are registered through the plugin hooks."""

import pytest

from rlcore.cli import Command, main
from rlcore.plugins.manager import PluginManager


def test_preprocessors_and_the_data_command_are_registered():
    manager = PluginManager(autoload=False)
    preprocessors = manager.registry("data_preprocessors")
    assert preprocessors.names() == ["arithmetic", "geo3k", "gsm8k", "humaneval", "shapes"]
    assert all(isinstance(preprocessors.get(name), Command) for name in preprocessors)
    assert "data" in manager.registry("cli_commands")


def test_data_needs_a_preprocessor_name(capsys):
    with pytest.raises(SystemExit) as exit:  # argparse: the required NAME is missing
        main(["data"])
    assert exit.value.code == 2
    assert "NAME" in capsys.readouterr().err
