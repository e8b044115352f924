"""Presenting a run: the terminal table, the results file, the view model the Markdown and HTML reports
share, merged results of several runners, and the table of output formats (writers.py) that the plugin and
`perfguard report` both write from. Reads records; never measures and never decides."""
