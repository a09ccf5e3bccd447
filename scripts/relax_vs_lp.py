"""The solve stage's relaxation against the whole LP, on one run file's tied ILP.

A diagnostic for the solve stage, not part of planning. It plans a run file up to
the ILP build, then, on the same matrix:

* ``relax``: the solve stage's relaxation (dual ascent, then the LP over the
  columns its bound prices near zero; :mod:`autoplan.ilp.bound.relax`), timed;
* ``whole LP``: the LP relaxation of every column, solved by the same solver;

and prints each one's time and bound, and how many columns reduced-cost fixing
keeps with each one's prices under the same cutoff (``--cutoff``, microseconds;
by default the plan the planner returns, planned once more). It also times the
MIP over the columns the relaxation keeps, with and without the cutoff handed
to the solver.

    python scripts/relax_vs_lp.py configs/llama3_70b.yaml
    python scripts/relax_vs_lp.py configs/llama3_8b_2l.yaml plan.mm_mode=native

Why: the README's figures for the relaxation (time, bound, columns kept) come
from here, so that they can be measured again.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from lp_columns import _model  # noqa: E402

from autoplan.ilp.backends import run  # noqa: E402
from autoplan.ilp.bound.relax import relax  # noqa: E402
from autoplan.tools.run_plan import run_plan  # noqa: E402
from autoplan.tools.runfile import load_run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="key.path=value, as autoplan plan --set")
    ap.add_argument("--cutoff", type=float, default=None, help="plan cost in us (default: plan it)")
    args = ap.parse_args()
    run_file = load_run(args.config, args.overrides)
    solver = run_file.config.solver
    cutoff = args.cutoff
    if cutoff is None:
        cutoff = run_plan(run_file, quiet=True).objective_us
    model = _model(args.config, args.overrides)
    m = model.emitted.matrix
    print(f"{args.config}: {m.num_cols} columns, {m.num_rows} rows, cutoff {cutoff:.2f} us")

    began = time.perf_counter()
    rel = relax(model, solver=solver)
    seconds = time.perf_counter() - began
    keep = rel.keep(cutoff)
    kept = int(keep.sum()) if keep is not None else m.num_cols
    stats = rel.stats or {}
    print(
        f"relax     {seconds:6.2f} s  bound {rel.bound:.2f} us  kept {kept}  "
        f"(sweeps {stats.get('sweeps', 0):.0f}, LP over {stats.get('lp_columns', 0):.0f} columns)"
    )

    if keep is not None and rel.start is not None:
        sub, start = m.columns(keep), rel.start[keep]
        for told in (False, True):  # the final MIP, told the cutoff or only fixed by it
            began = time.perf_counter()
            res = run(
                sub, solver, mip=True, time_limit_s=None, mip_gap=0.0, start=start,
                cutoff=cutoff if told else None,
            )  # fmt: skip
            seconds = time.perf_counter() - began
            print(f"MIP       {seconds:6.2f} s  {res.status}  (cutoff given to the solver: {told})")

    began = time.perf_counter()
    lp = run(m, solver, mip=False, time_limit_s=None, mip_gap=0.0)
    seconds = time.perf_counter() - began
    if lp.x is None or lp.dj is None:
        print(f"whole LP  {seconds:6.2f} s  {lp.status}")
        return
    bound = float(m.cost @ lp.x) + m.offset
    gap = cutoff - bound + 1e-6 * max(1.0, abs(cutoff))
    kept_lp = int((~((lp.x <= 1e-9) & (lp.dj > gap))).sum())
    print(f"whole LP  {seconds:6.2f} s  bound {bound:.2f} us  kept {kept_lp}")
    print(f"relax's bound is {bound - rel.bound:.2f} us ({(bound - rel.bound) / bound:.2e}) below")


if __name__ == "__main__":
    main()
