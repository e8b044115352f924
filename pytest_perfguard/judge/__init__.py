"""Deciding: the decision rules and their constants, the verdicts of each gate, the stored baseline and the
statistics behind them. Knows nothing of pytest's run loop, of timers or of output formats."""
