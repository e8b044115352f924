"""The ``perfguard`` command and its subcommands. Nothing in the plugin imports this part."""
