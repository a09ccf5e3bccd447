"""The error autoplan raises for a user's mistake, and what the command line makes of it.

Input: nothing (a type). Output: :class:`PlanError` and its run-file kind :class:`RunFileError`. Every check of user input
(a run file, a saved plan, a model handed to :func:`autoplan.plan`, an option)
raises it with a message naming the thing, its value, what is allowed and the
fix; it is a ``ValueError`` so callers that catch that keep working. Anything
else escaping autoplan is a defect, which the CLI reports under its own exit code.
"""

from __future__ import annotations


class PlanError(ValueError):
    """A user mistake autoplan can name; the message says what, its value and the fix."""


class RunFileError(PlanError):
    """A run file (or ``--set`` override) that cannot be used; the message says where and how
    to fix it."""


class Interrupted(BaseException):
    """A termination signal turned into an exception so ``finally`` blocks and ``with``
    exits run (solver children stopped, temporary files removed) before the exit.

    A ``BaseException`` like ``KeyboardInterrupt``: ``except Exception`` must not swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum
