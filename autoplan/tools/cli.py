"""The ``autoplan`` command: plan, compare and price collectives from a terminal.

Input: argv. Output: text (or JSON) on stdout, one-line errors on stderr. Exit
codes: 0 success, 1 no plan fits (infeasible), 2 bad input (a :class:`PlanError`
or a usage error), 3 an internal error (``--debug`` shows its traceback), 130
interrupted (Ctrl-C), 143 terminated (SIGTERM).

    autoplan plan CONFIG.yaml [--out plan.json] [--json] [--quiet] [--mm-mode M] [--set k=v]
    autoplan compare CONFIG.yaml [--json] [--quiet] [--out DIR_OR_FILE] [--set k=v]
    autoplan collectives [--topology FILE|preset] [--json]
    autoplan diff A.json B.json [--json]
    autoplan validate CONFIG.yaml [--set k=v]
    autoplan explain PLAN.json NODE|PARAM --config CONFIG.yaml [--set k=v] [--top 5] [--json]
    torchrun --nproc-per-node N --no-python autoplan calibrate --mesh 2x2 --names dp,tp
        --out FILE.yaml [--device cpu|cuda] [--force] [--quiet]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from autoplan.calibrate.command import run_command as run_calibrate
from autoplan.core.errors import Interrupted, PlanError
from autoplan.core.mesh import fake_mesh
from autoplan.core.placements import fmt
from autoplan.core.user_files import writable
from autoplan.cost.collectives import collective_table
from autoplan.result.plan import Plan
from autoplan.tools.compare import compare, format_compare, output_paths, write_compare
from autoplan.tools.diff import diff_plans, format_diff
from autoplan.tools.explain import explain, format_explain
from autoplan.tools.rebuild import rebuild
from autoplan.tools.run_checks import check_run, mesh_text, not_an_input
from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import load_run, load_topology

EXIT_INFEASIBLE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


def _cmd_plan(args: argparse.Namespace) -> int:
    run = load_run(args.config, args.set)
    check_run(run)
    if args.out:
        writable(args.out, "--out")
        not_an_input(run, "--out", args.out, example=Path(run.source).with_suffix(".plan.json"))
    if args.mm_mode:
        run = dataclasses.replace(run, config=dataclasses.replace(run.config, mm_mode=args.mm_mode))
    result = run_plan(run, quiet=args.quiet or args.json)
    print(result.to_json(timings=True) if args.json else result.summary())
    if args.out:
        _save(result, args.out)
        if not args.json:
            print(f"plan written to {args.out}")
    return EXIT_INFEASIBLE if result.status == "infeasible" else 0


def _save(result: Plan, out: str) -> None:
    """Write the plan to ``out``; if that fails (a full disk), to a temporary file instead, so
    a finished solve is never lost, and say where it went."""
    try:
        result.save(out)
    except OSError as exc:
        fd, fallback = tempfile.mkstemp(prefix="autoplan-plan-", suffix=".json")
        os.close(fd)
        result.save(fallback)
        raise PlanError(
            f"--out {out}: cannot write the plan ({exc.strerror or exc}); it was saved to "
            f"{fallback} instead: move it where it belongs"
        ) from exc


def _cmd_compare(args: argparse.Namespace) -> int:
    run = load_run(args.config, args.set)
    check_run(run)
    if args.out:
        json_path, png_path = output_paths(args.out)
        for path in (json_path, png_path):
            if path.is_dir():
                raise PlanError(f"--out {args.out}: {path} is a directory; give another path")
            not_an_input(run, "--out", path, example=Path(run.source).parent / "compare")
    result = compare(run, quiet=args.quiet or args.json, by_kind=bool(args.out))
    print(json.dumps(result, indent=1, sort_keys=True) if args.json else format_compare(result))
    if args.out:
        title = f"{run.source}: compute and comm per layer kind, mesh {mesh_text(run)}"
        json_path, png_path = write_compare(result, args.out, title)
        print(f"comparison written to {json_path}, chart to {png_path}", file=sys.stderr)
    statuses = [result[m]["status"] for m in ("einsum", "native")]
    return EXIT_INFEASIBLE if "infeasible" in statuses else 0


def _cmd_collectives(args: argparse.Namespace) -> int:
    rows = collective_table(load_topology(args.topology))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'op':<15}{'ranks':>6}{'nodes':>6}{'bytes':>14}{'time_us':>12}{'busbw_GBps':>12}")
    for r in rows:
        print(
            f"{r['op']:<15}{r['ranks']:>6}{r['nodes']:>6}{r['bytes']:>14}"
            f"{r['time_us']:>12.1f}{r['busbw_GBps']:>12.1f}"
        )
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    result = diff_plans(Plan.load(args.a), Plan.load(args.b))
    print(json.dumps(result, indent=1) if args.json else format_diff(result))
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise PlanError(
            f"--top ({args.top}) must be at least 1; it is how many alternatives to show."
        )
    saved = Plan.load(args.plan)
    run = load_run(args.config, args.set)
    result = explain(rebuild(run, saved, plan_source=args.plan), args.name, top=args.top)
    print(json.dumps(result, indent=1) if args.json else format_explain(result))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    run = load_run(args.config, args.set)
    checked = check_run(run, summary=True)
    num_params, params = checked.num_params, checked.param_shapes
    fake_mesh(run.mesh_shape, run.axis_names)
    mesh = mesh_text(run)
    shape = list(checked.input_shape)
    options = {
        f.name: getattr(run.config, f.name)
        for f in dataclasses.fields(run.config)
        if f.name != "topology"
    }
    print(f"{run.source}: OK")
    print(f"model: {run.model_name}, {num_params:,} parameters")
    print(f"mesh: {mesh} ({math.prod(run.mesh_shape)} devices)")
    placed = ", ".join(fmt(p) for p in run.input_placements) or "planner's choice"
    print(f"input: shape {list(shape)}, placements {placed}")
    print("plan: " + ", ".join(f"{k}={v}" for k, v in options.items()))
    if run.output_placements:
        print("output placements: " + ", ".join(fmt(p) for p in run.output_placements))
    if run.pins:
        nodes = [n for n in run.pins if n not in params]
        print(
            "pins: " + ", ".join(f"{n}={fmt(p)}" for n, p in run.pins.items())
            + (f" (graph nodes {', '.join(nodes)} are checked when planning)" if nodes else "")
        )  # fmt: skip
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    try:
        return run_calibrate(
            mesh=args.mesh, names=args.names, out=args.out, device=args.device,
            force=args.force, quiet=args.quiet,
        )  # fmt: skip
    except PlanError:
        if os.environ.get("RANK", "0") != "0":  # every rank refuses alike; rank 0 says why
            return EXIT_BAD_INPUT
        raise


def _parser() -> argparse.ArgumentParser:
    debug = "on an internal error, print its traceback"
    p = argparse.ArgumentParser(
        prog="autoplan", description="ILP auto-parallel planner for PyTorch."
    )
    p.add_argument("--debug", action="store_true", help=debug)
    # Accepted after the command too; SUPPRESS keeps a subcommand from resetting it to False.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug)
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, about: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=about)

    pp = command("plan", "plan a run file and print the plan")
    pp.add_argument("config")
    pp.add_argument("--out", help="write the plan JSON here")
    pp.add_argument("--json", action="store_true", help="print the plan as JSON")
    pp.add_argument("--quiet", action="store_true", help="no progress lines")
    pp.add_argument("--mm-mode", choices=("einsum", "native"), help="override plan.mm_mode")
    pp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pp.set_defaults(func=_cmd_plan)
    pc = command("compare", "plan in both mm modes and compare side by side")
    pc.add_argument("config")
    pc.add_argument("--json", action="store_true")
    pc.add_argument("--quiet", action="store_true", help="no progress lines")
    pc.add_argument(
        "--out", metavar="DIR_OR_FILE", help="write compare.json and a per-kind PNG chart here"
    )
    pc.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pc.set_defaults(func=_cmd_compare)
    pk = command("collectives", "predicted collective times and bus bandwidth")
    pk.add_argument("--topology", default="h100", help="preset name or topology YAML")
    pk.add_argument("--json", action="store_true")
    pk.set_defaults(func=_cmd_collectives)
    pd = command("diff", "compare two saved plans: cost deltas and changed placements")
    pd.add_argument("a", metavar="A.json")
    pd.add_argument("b", metavar="B.json")
    pd.add_argument("--json", action="store_true")
    pd.set_defaults(func=_cmd_diff)
    pv = command("validate", "check a run file, its mesh and input placements; no solve")
    pv.add_argument("config")
    pv.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pv.set_defaults(func=_cmd_validate)
    pe = command(
        "explain", "why a node or parameter got its strategy: cost and next best alternatives"
    )
    pe.add_argument("plan", metavar="PLAN.json")
    pe.add_argument("name", metavar="NODE|PARAM", help="graph node name or parameter FQN")
    pe.add_argument("--config", required=True, help="the run file that made the plan")
    pe.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pe.add_argument("--top", type=int, default=5, help="alternatives to show (default 5)")
    pe.add_argument("--json", action="store_true")
    pe.set_defaults(func=_cmd_explain)
    pa = command(
        "calibrate",
        "measure this job's collectives and devices into a topology file (under torchrun)",
    )
    pa.add_argument("--mesh", required=True, help="the job's mesh shape, e.g. 2x2")
    pa.add_argument("--names", required=True, help="its axis names, e.g. dp,tp")
    pa.add_argument("--out", required=True, help="write the topology YAML here")
    pa.add_argument(
        "--device", choices=("cpu", "cuda"), help="cpu (gloo) or cuda (nccl); default: cuda if "
        "available, else cpu",
    )  # fmt: skip
    pa.add_argument("--force", action="store_true", help="replace --out if it exists")
    pa.add_argument("--quiet", action="store_true", help="no progress lines")
    pa.set_defaults(func=_cmd_calibrate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit code says how it ended (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        with _signals_as_exceptions():
            return int(args.func(args))
    except (Exception, KeyboardInterrupt, Interrupted) as exc:
        return _report(exc, debug=args.debug)


def _report(exc: BaseException, *, debug: bool) -> int:
    """One line on stderr for what ended the command, and its exit code."""
    stop = _interruption(exc)
    if stop is not None:
        print(f"autoplan: {_stopped_by(stop)}", file=sys.stderr)
        return 128 + stop
    if isinstance(exc, PlanError):
        print(f"autoplan: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if debug:  # a defect: one line by default, the traceback on request
        traceback.print_exception(exc)
    first = (str(exc).strip().splitlines() or [""])[0]
    print(
        f"autoplan: internal error: {type(exc).__name__}: {first}"
        + ("" if debug else " (rerun with --debug for the traceback)"),
        file=sys.stderr,
    )
    return EXIT_INTERNAL


def _interruption(exc: BaseException) -> int | None:
    """The signal number behind ``exc``: itself an interruption, or raised while one unwound
    (torch's mode stacks can fail in their exit when Ctrl-C lands inside them, and the
    trace may wrap that failure)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, KeyboardInterrupt):
            return int(signal.SIGINT)
        if isinstance(current, Interrupted):
            return current.signum
        current = current.__cause__ or current.__context__
    return None


def _stopped_by(signum: int) -> str:
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"


@contextlib.contextmanager
def _signals_as_exceptions() -> Iterator[None]:
    """While a command runs, SIGTERM and SIGHUP raise :class:`Interrupted` so every ``with``
    and ``finally`` on the way out runs (solver children stopped, temporary files removed);
    the previous handlers are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupted(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    caught = [signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    previous = {s: signal.signal(s, raise_interrupted) for s in caught}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
