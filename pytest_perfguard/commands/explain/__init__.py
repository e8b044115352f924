"""``perfguard explain``: the Nsight Compute diff (command.py) and the pytest plugin it runs under ncu
(probe.py)."""
