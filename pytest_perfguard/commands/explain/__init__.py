"""``perfguard explain``: the command (command.py), Nsight Compute's profile, parse and diff (ncu.py), and the
pytest plugin it runs under ncu (probe.py)."""
