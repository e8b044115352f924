"""One case through pytest: the runner's steps, the session's state and end, fresh-process confirmation,
the A/B base tree, progress and the xdist transport. The only part that knows pytest's run loop."""
