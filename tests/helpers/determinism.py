"""Plan run files in this process and save each plan, for the determinism test.

    python -m tests.helpers.determinism OUT_DIR SPEC [SPEC ...]

A SPEC is ``CONFIG.yaml`` or ``CONFIG.yaml,key=value,...`` (``--set`` overrides); plan
number i is saved to ``OUT_DIR/i.json`` with :meth:`autoplan.Plan.save`, the file a user
keeps. tests/integration/test_determinism.py runs this twice, under other hash seeds and loads, and
compares the files byte for byte.
"""

from __future__ import annotations

import sys
from pathlib import Path

from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import load_run


def main(out: str, specs: list[str]) -> None:
    """Plan each spec and save it as ``out/<position>.json``."""
    Path(out).mkdir(parents=True, exist_ok=True)
    for k, spec in enumerate(specs):
        config, *sets = spec.split(",")
        run_plan(load_run(config, sets), quiet=True).save(str(Path(out) / f"{k}.json"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
