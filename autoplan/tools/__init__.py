"""The tools a user drives: run files, the ``autoplan`` command and its subcommands.

In: run files (strict YAML, :mod:`~autoplan.tools.runfile`), saved plans and command
lines. Out: plans printed or written, comparisons of the mm modes, explanations of one
choice, plan diffs, charts (:mod:`~autoplan.tools.cli` dispatches them).

May import: anything in autoplan; nothing imports it but the package's own entry points.
"""
