"""The core's own subcommands, registered through ``rlcore_register_cli_commands`` like any plugin's."""
