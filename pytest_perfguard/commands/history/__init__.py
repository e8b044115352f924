"""``perfguard history``: the SQLite store of runs on main (store.py) and its subcommands (command.py)."""
