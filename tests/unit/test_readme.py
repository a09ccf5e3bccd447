"""The README's command lines name only what the CLI has: every verb shown, every flag an
option of its parser. Running each line to its exit code is in
tests/integration/test_readme.py."""

from __future__ import annotations

import argparse
import re
import shlex

from autoplan.tools.cli import _parser
from tests.helpers.readme import README, command_lines


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_the_readme_shows_commands_of_every_verb():
    """The extraction finds the README's synopsis and session lines, one verb each at least."""
    verbs = {shlex.split(line)[1] for line in command_lines(README)}
    assert verbs == set(_subcommands())


def _flags_named(text: str) -> set[str]:
    """The ``--flags`` of ``text``'s code (spans and block lines), but those given to another
    program (``python ...``, ``torchrun ...``, ``pip ...``)."""
    code = re.findall(r"`([^`\n]+)`", text) + [
        line for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S)
        for line in block.splitlines()
    ]  # fmt: skip
    other = ("python ", "torchrun ", "pip ", "$ python", "$ torchrun")
    return {
        flag
        for piece in code
        if not piece.lstrip().startswith(other)
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", piece)
    }


def test_every_flag_the_readme_names_is_an_option_of_the_cli():
    """A ``--flag`` the README gives autoplan is an option of one of its verbs, and
    ``--quiet`` of both plan and compare, as the README says."""
    commands = _subcommands()
    known = {opt for parser in commands.values() for opt in parser._option_string_actions}
    named = _flags_named(README)
    assert {"--quiet", "--out", "--debug"} <= named and named <= known, named - known
    for verb in ("plan", "compare"):
        assert "--quiet" in commands[verb]._option_string_actions, verb
