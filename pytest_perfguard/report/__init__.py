"""Presenting a run: the terminal table, the results file, the view model the Markdown and HTML reports
share, and merged results of several runners. Reads records; never measures and never decides."""
