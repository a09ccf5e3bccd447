"""Where a tied LP relaxation's time goes: CBC on the whole LP and on column subsets.

A diagnostic for the solve stage, not part of planning. It plans a run file up to
the ILP build, solves the LP relaxation with PuLP's CBC (``-dualS``, as the solve
stage does) and then re-solves it on subsets of the columns:

* ``oracle Q``: the columns whose reduced cost at the LP optimum is within the
  Q-quantile, plus every binary (which the full LP's duals say suffice);
* ``flows all``: every binary and pair column, flow arcs by the same oracle rule;
* ``pairs all``: the other way round;
* ``cheap arcs`` (with ``--rounds``): column generation from every binary and pair
  column and the flow arcs no dearer than 1 % of their edge's median price,
  seeded with a plan's routes so that it is feasible; each round adds every
  column with a negative reduced cost under that round's row duals.

    python scripts/lp_columns.py configs/llama3_70b.yaml
    python scripts/lp_columns.py configs/llama3_70b.yaml --rounds 6

Why: on LLaMA3-70B the LP alone is most of the solve. The subsets show that a few
thousand dear flow arcs, which no optimal plan uses, make CBC's dual simplex
30-60 times slower, and the rounds show why pricing them in later does not help:
the restricted LP reaches the full optimum in a few rounds, but its duals price
out hundreds of other arcs each round.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import autoplan.planner.solve_mode as solve_stage
from autoplan.ilp.backends import cbc_path, read_cbc_solution, write_mps
from autoplan.ilp.bound.incumbent import from_lp
from autoplan.ilp.formulation.build import IlpModel
from autoplan.ilp.formulation.matrix import Flow, Matrix
from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import load_run


class _Built(Exception):
    def __init__(self, model: IlpModel) -> None:
        self.model = model


def _model(config: str, overrides: list[str]) -> IlpModel:
    """The planner's ILP for ``config`` (planning stops right after the build)."""
    build = solve_stage.build_ilp

    def stop(costs, **kw):  # type: ignore[no-untyped-def]
        raise _Built(build(costs, **kw))

    solve_stage.build_ilp = stop
    try:
        run_plan(load_run(config, overrides), quiet=True)
    except _Built as built:
        return built.model
    finally:
        solve_stage.build_ilp = build
    raise RuntimeError(f"{config}: planning ended before the ILP build")


def _lp(m: Matrix, tmp: Path) -> tuple[float, np.ndarray | None, np.ndarray, str]:
    """CBC's LP on ``m``: seconds, column values, row duals and its summary line."""
    mps, sol = tmp / "lp.mps", tmp / "lp.sol"
    write_mps(m, str(mps))
    began = time.perf_counter()
    out = subprocess.run(
        [cbc_path(), str(mps), "-dualS", "-printingOptions", "all", "-solution", str(sol)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    seconds = time.perf_counter() - began
    _, x, _, y = read_cbc_solution(str(sol), m.num_cols, m.num_rows)  # the solve stage's reader
    summary = next((s.strip() for s in out.splitlines() if "objective" in s.lower()), "?")
    return seconds, x, y, summary


def _reduced(m: Matrix, y: np.ndarray) -> np.ndarray:
    """Every column's reduced cost ``c - A'y``."""
    col = np.repeat(np.arange(m.num_cols), np.diff(m.start))
    return m.cost - np.bincount(col, weights=m.value * y[m.index], minlength=m.num_cols)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--set", action="append", default=[], help="run-file override KEY=VALUE")
    ap.add_argument("--rounds", type=int, default=0, help="column generation rounds to run")
    args = ap.parse_args()
    model = _model(args.config, args.set)
    m, em = model.emitted.matrix, model.emitted
    flow = np.zeros(m.num_cols, dtype=bool)
    for cols in em.edge_cols:
        if isinstance(cols, Flow):
            flow[cols.first_col : cols.first_col + len(cols.net.arc_cost)] = True
    pair = ~flow & ~m.integer
    print(f"{m.num_cols} columns ({int(m.integer.sum())} binary, {int(pair.sum())} pair, "
          f"{int(flow.sum())} flow arcs), {m.num_rows} rows")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        seconds, _, y, summary = _lp(m, tmp)
        print(f"whole LP: {seconds:.2f} s  {summary}")
        d = _reduced(m, y)
        for q in (0.3, 0.6):
            small = d <= np.quantile(d, q)
            for name, keep in (
                (f"oracle {q}", small | m.integer),
                (f"flows all, pairs oracle {q}", m.integer | flow | (pair & small)),
                (f"pairs all, flows oracle {q}", m.integer | pair | (flow & small)),
            ):
                s, _, _, summary = _lp(m.columns(keep), tmp)
                print(f"{name}: {int(keep.sum())} columns, {s:.2f} s  {summary}")
        if args.rounds:
            _generate(model, flow, args.rounds, tmp)


def _generate(model: IlpModel, flow: np.ndarray, rounds: int, tmp: Path) -> None:
    m, em, p = model.emitted.matrix, model.emitted, model.reduced
    keep = ~flow
    for k, e in enumerate(p.edges):
        cols = em.edge_cols[k]
        if isinstance(cols, Flow):
            median = float(np.median(e.cost[np.isfinite(e.cost)]))
            keep[cols.first_col : cols.first_col + len(cols.net.arc_cost)] = (
                cols.net.arc_cost <= 0.01 * median
            )
    # a plan's routes keep the restricted LP feasible: the smallest footprint per class,
    # cheapest first, improved by one-class moves
    values = {}
    for r, c in p.linear.items():
        ok = np.isfinite(c)
        if r in p.memory and p.budget is not None:
            ok &= p.memory[r] <= p.memory[r][np.isfinite(c)].min()
        values[r] = (np.arange(len(c)) == np.argmin(np.where(ok, c, np.inf))).astype(float)
    found = from_lp(p, values)
    if found is None:
        print("no seed plan: column generation skipped")
        return
    choice = found[0]
    for k, e in enumerate(p.edges):
        keep[em.move_columns(k, e.src_group[choice[e.src]], e.dst_group[choice[e.dst]])] = True
    for r in range(rounds):
        seconds, x_sub, y, summary = _lp(m.columns(keep), tmp)
        d = _reduced(m, y)
        new = ~keep & (d < -1e-3)
        print(f"round {r}: {int(keep.sum())} columns, {seconds:.2f} s, {int(new.sum())} priced "
              f"in  {summary}")  # fmt: skip
        if not new.any():
            break
        keep |= new


if __name__ == "__main__":
    main()
