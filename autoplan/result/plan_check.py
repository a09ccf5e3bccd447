"""Read a saved plan back, checked: every field, with an error naming what is wrong.

Input: a plan file's path (:func:`read_text`) or its JSON text (:func:`plan_fields`).
Output: the keyword arguments of :class:`autoplan.result.plan.Plan`, placements parsed and
lists turned to tuples, or a :class:`~autoplan.core.errors.PlanError` naming the file, the
key (``param_placements["layers.0.attention.wq.weight"]``), its value, what a valid
value looks like and how to get a new plan.

Why its own module: a plan JSON is a file people edit, copy between runs and keep.
A wrong value must stop at the load with its key named, not show up as a placement
``autoplan explain`` reports otherwise than the file holds, a diff that lists it as
if it were fine, or a DTensor error inside ``parallelize`` that names no parameter.
The checks follow what the file records: the mesh (sizes, distinct axis names), one
placement per mesh axis everywhere, sharded dims within the recorded shapes of the
parameters and inputs, and node names wherever another field refers to a node.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Sequence
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any, NoReturn

from autoplan.core import user_files
from autoplan.core.config import CHECKPOINT_MODES, PlanConfig
from autoplan.core.errors import PlanError
from autoplan.core.placements import ALLOWED, Placements, parse, sharded_dim

STATUSES = ("optimal", "time_limit", "node_limit", "infeasible")
NODE_KEYS = ("in", "op", "out")
COMM_KEYS = ("bytes", "count", "us")
BUCKET_KEYS = ("axes", "bytes", "kind", "members", "us", "us_alone", "where")
# The categories of Plan.memory_breakdown, the one list of them: (key, label in a plan's
# summary, label in compare's table). A new category is one line here.
MEMORY_CATEGORIES = (
    ("parameters", "params", "parameters"),
    ("gradients", "grads", "gradients"),
    ("optimizer", "optimizer", "optimizer state"),
    ("activations", "saved activations", "saved activations"),
    ("output_grad", "output's gradient", "output's gradient"),
    ("transient", "backward transient", "backward transient"),
)
BREAKDOWN_KEYS = tuple(key for key, _, _ in MEMORY_CATEGORIES)
TEXT_KEYS = ("message", "solver", "loss_fn", "graph_fingerprint")
INPUT_PREFIX = "xs_"  # trace_joint names the model's inputs xs_1, xs_2, ...
_ABSENT = object()


def read_text(path: str | Path) -> str:
    """The text of the plan file at ``path``; a PlanError naming the path if it cannot be read."""
    how = "give the path of a plan file written by: autoplan plan RUN.yaml --out PLAN.json"
    return user_files.read_text(path, what="plan file", how=how)


def plan_fields(text: str, *, source: str, out: str = "PLAN.json") -> dict[str, Any]:
    """The checked keyword arguments of ``Plan`` from a plan's JSON ``text``.

    ``source`` names the plan in messages (its path); ``out`` is where the fix's
    ``autoplan plan`` writes a new one.
    """
    return _Reader(source, out).fields(text)


def _key(base: str, k: str | int) -> str:
    """``base["k"]`` for a name, ``base[3]`` for a position."""
    return f"{base}[{json.dumps(k) if isinstance(k, str) else k}]"


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _example(num_axes: int) -> str:
    return f'"{"R" * num_axes}" (replicated) or "S(0){"R" * (num_axes - 1)}"'


class _Reader:
    """The checks of one plan's JSON; every one fails through :meth:`fail`."""

    def __init__(self, source: str, out: str) -> None:
        self.source, self.out = source, out
        self.num_axes, self.axes = 0, ()  # the recorded mesh's, once read
        self.parsed: dict[str, Placements] = {}  # a plan repeats few strings

    def fail(self, key: str | None, value: Any, problem: str, valid: str) -> NoReturn:
        """Raise: ``key`` (None: the whole file) holds ``value`` (or is missing), which
        ``problem``; ``valid`` says what a valid value looks like."""
        what = (
            "the file" if key is None
            else f"{key} is missing:" if value is _ABSENT
            else f"{key} = {_show(value)}"
        )  # fmt: skip
        raise PlanError(
            f"{self.source}: {what} {problem}. Fix: {valid}; or re-plan with "
            f"`autoplan plan RUN.yaml --out {self.out}`"
        )

    # -- value types -----------------------------------------------------------------

    def number(self, key: str, value: Any, *, finite: bool = True, signed: bool = False) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            self.fail(key, value, "is not a number", "give a number, e.g. 0.0")
        if finite and not math.isfinite(value):
            self.fail(key, value, "is not finite", "give a finite number, e.g. 0.0")
        if not signed and value < 0:
            self.fail(key, value, "is negative", "give a number >= 0")
        return value

    def count(self, key: str, value: Any, *, least: int = 0) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            self.fail(key, value, f"is not an integer >= {least}", f"give an integer >= {least}")
        return value

    def string(self, key: str, value: Any, choices: Sequence[str] = ()) -> str:
        if not isinstance(value, str):
            self.fail(key, value, "is not a string", 'give a string, e.g. ""')
        if choices and value not in choices:
            allowed = ", ".join(map(json.dumps, choices))
            self.fail(key, value, "is not allowed", f"give one of {allowed}")
        return value

    def mapping(self, key: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(key, value, "is not a JSON object", "give an object {...} keyed by name")
        return value

    def listing(self, key: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            self.fail(key, value, "is not a JSON array", "give an array [...]")
        return value

    def shape(self, key: str, value: Any) -> tuple[int, ...]:
        return tuple(self.count(_key(key, i), d) for i, d in enumerate(self.listing(key, value)))

    def placements(
        self, key: str, value: Any, *, shape: Sequence[int] | None = None, node: bool = False
    ) -> Placements:
        """One placement per mesh axis in the grammar the writer uses
        (:func:`autoplan.core.placements.parse`), sharding only dims ``shape`` has (when known);
        a node's entry may be ``-`` (no tensor)."""
        n, example = self.num_axes, _example(self.num_axes)
        valid = f"give one of {ALLOWED} per mesh axis, e.g. {example}"
        if not isinstance(value, str):
            self.fail(key, value, "is not a placement string", valid)
        if node and value == "-":
            return ()
        parsed = self.parsed.get(value)
        if parsed is None:
            try:
                parsed = parse(value)
            except PlanError:
                self.fail(key, value, "does not parse as placements", valid)
            self.parsed[value] = parsed
        if len(parsed) != n:
            axes = f"{n} axes ({', '.join(self.axes)})"
            problem = f"has {len(parsed)} placements but the mesh has {axes}"
            self.fail(key, value, problem, f"give one placement per mesh axis, e.g. {example}")
        if shape is not None:
            for p in parsed:
                d = sharded_dim(p)
                if d is not None and d >= len(shape):
                    problem = f"shards dim {d} of a tensor with {len(shape)} dims {list(shape)}"
                    dims = f"dims 0..{len(shape) - 1}" if shape else "no dim (a scalar)"
                    self.fail(key, value, problem, f"shard {dims}, e.g. {example}")
        return parsed

    # -- the plan --------------------------------------------------------------------

    def fields(self, text: str) -> dict[str, Any]:
        d = self.document(text)
        known = _plan_fields()
        for k in d:
            if k not in known:
                close = difflib.get_close_matches(k, list(known), n=1)
                hint = f" (did you mean {json.dumps(close[0])}?)" if close else ""
                self.fail(f"the key {json.dumps(k)}", d[k], "is not a plan key", f"remove it{hint}")
        for name, f in known.items():
            required = f.default is MISSING and f.default_factory is MISSING
            if required and name not in d and name != "timings":  # saved plans leave it out
                self.fail(name, _ABSENT, "every plan records it", "restore it from the original")
        out: dict[str, Any] = {"status": self.string("status", d["status"], STATUSES)}
        self.mesh(d, out)
        infeasible = out["status"] == "infeasible"
        for name in ("objective_us", "compute_us", "comm_us"):
            # an infeasible plan has no cost: null (older files: NaN)
            none = infeasible and d[name] is None
            out[name] = math.nan if none else self.number(name, d[name], finite=not infeasible)
        if d.get("bound_us") is not None:
            out["bound_us"] = self.number("bound_us", d["bound_us"], signed=True)
        out |= {name: self.string(name, d[name]) for name in TEXT_KEYS if name in d}
        if "memory_bytes" in d:
            out["memory_bytes"] = self.number("memory_bytes", d["memory_bytes"])
        if "graph_nodes" in d:
            out["graph_nodes"] = self.count("graph_nodes", d["graph_nodes"])
        for name in ("timings", "stats", "memory_breakdown"):
            values = self.mapping(name, d.get(name, {}))
            for k in values if name == "memory_breakdown" else ():
                self.string(f"the key {_key(name, k)}", k, BREAKDOWN_KEYS)
            signed = name == "stats"
            out[name] = {k: self.number(_key(name, k), v, signed=signed) for k, v in values.items()}
        sizes = self.mapping("ilp_size", d["ilp_size"])
        out["ilp_size"] = {k: self.count(_key("ilp_size", k), v) for k, v in sizes.items()}
        ops = self.listing("fallback_ops", d.get("fallback_ops", []))
        out["fallback_ops"] = tuple(
            self.string(_key("fallback_ops", i), o) for i, o in enumerate(ops)
        )
        out["config"] = self.config(self.mapping("config", d.get("config", {})))
        for part in (self.params, self.nodes, self.inputs, self.steps, self.collectives):
            part(d, out)
        return out

    def document(self, text: str) -> dict[str, Any]:
        """The JSON object ``text`` holds, each of its objects without a repeated key."""
        valid = "restore the file autoplan wrote"
        if not text.strip():
            self.fail(None, None, "is empty", valid)

        def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            obj = dict(pairs)
            if len(obj) < len(pairs):
                keys = [k for k, _ in pairs]
                twice = next(k for i, k in enumerate(keys) if k in keys[:i])
                self.fail(None, None, f"repeats the key {json.dumps(twice)} in one object", valid)
            return obj

        try:
            d = json.loads(text, object_pairs_hook=no_repeats)
        except json.JSONDecodeError as exc:
            where = f"{exc.msg}: line {exc.lineno} column {exc.colno}"
            self.fail(None, None, f"is not valid JSON ({where}): truncated or mistyped", valid)
        except RecursionError:
            self.fail(None, None, "is JSON nested too deeply to be a plan", valid)
        if not isinstance(d, dict):
            kind = "an array" if isinstance(d, list) else f"a JSON {type(d).__name__}"
            self.fail(None, None, f"holds {kind} ({_show(d)}), not a plan object", valid)
        return d

    def mesh(self, d: dict[str, Any], out: dict[str, Any]) -> None:
        sizes = self.listing("mesh_shape", d["mesh_shape"])
        if not sizes:
            self.fail("mesh_shape", sizes, "is empty", "give one size per mesh axis, e.g. [2, 4]")
        out["mesh_shape"] = tuple(
            self.count(_key("mesh_shape", i), s, least=1) for i, s in enumerate(sizes)
        )
        names = self.listing("axis_names", d["axis_names"])
        valid = 'give each mesh axis its own name, e.g. ["dp", "tp"]'
        if len(names) != len(sizes):
            self.fail("axis_names", names, f"names {len(names)} axes, not {len(sizes)}", valid)
        for i, name in enumerate(names):
            if not isinstance(name, str) or not name:
                self.fail(_key("axis_names", i), name, "is not a non-empty string", valid)
            if name in names[:i]:
                self.fail(_key("axis_names", i), name, "names two axes", valid)
        self.num_axes, self.axes = len(sizes), tuple(names)
        out["axis_names"] = self.axes

    def config(self, config: dict[str, Any]) -> dict[str, Any]:
        """Each option as :class:`~autoplan.core.config.PlanConfig` accepts it."""
        options = [f.name for f in fields(PlanConfig)]
        for name, value in config.items():
            key = _key("config", name)
            if name not in options:
                self.fail(key, value, "is not a plan option", f"options: {', '.join(options)}")
            try:
                if name == "topology":  # recorded by its device name
                    self.string(key, value)
                else:
                    PlanConfig(**{name: value})
            except (PlanError, TypeError) as exc:
                self.fail(key, value, "is not a valid value", str(exc).rstrip("."))
        return config

    def params(self, d: dict[str, Any], out: dict[str, Any]) -> None:
        shapes = self.mapping("param_shapes", d.get("param_shapes", {}))
        out["param_shapes"] = {
            fqn: self.shape(_key("param_shapes", fqn), s) for fqn, s in shapes.items()
        }
        placed = self.mapping("param_placements", d["param_placements"])
        out["param_placements"] = {}
        for fqn, text in placed.items():
            key = _key("param_placements", fqn)
            if shapes and fqn not in shapes:
                self.fail(key, text, "places a parameter param_shapes lacks", "remove it")
            shape = out["param_shapes"].get(fqn)
            out["param_placements"][fqn] = self.placements(key, text, shape=shape)
        unplaced = [fqn for fqn in shapes if fqn not in placed]
        if unplaced and out["status"] != "infeasible":
            key = _key("param_placements", unplaced[0])
            self.fail(key, _ABSENT, "param_shapes lists the parameter", "give its placements")

    def nodes(self, d: dict[str, Any], out: dict[str, Any]) -> None:
        nodes = self.mapping("node_placements", d["node_placements"])
        checked = {"-"}  # the placement strings found valid; a plan repeats a few of them
        for name, entry in nodes.items():
            if (
                type(entry) is dict
                and len(entry) == len(NODE_KEYS)
                and type(entry.get("op")) is str
                and type(entry.get("out")) is list
                and type(entry.get("in")) is list
                and checked.issuperset(entry["out"] + entry["in"])
            ):
                continue  # well formed, of checked strings: no key to build a message with
            key = _key("node_placements", name)
            if sorted(self.mapping(key, entry)) != list(NODE_KEYS):
                example = '{"op": "aten.mm.default", "out": ["S(0)R"], "in": ["S(0)R", "RR"]}'
                self.fail(key, entry, "does not hold exactly op, out, in", f"e.g. {example}")
            self.string(_key(key, "op"), entry["op"])
            for side in ("out", "in"):
                for i, text in enumerate(self.listing(_key(key, side), entry[side])):
                    self.placements(_key(_key(key, side), i), text, node=True)
                    checked.add(text)
        out["node_placements"] = nodes

    def inputs(self, d: dict[str, Any], out: dict[str, Any]) -> None:
        """Each input's shape and key; its placements shard only the dims its shape has."""
        shapes = self.listing("input_shapes", d.get("input_shapes", []))
        out["input_shapes"] = tuple(
            self.shape(_key("input_shapes", i), s) for i, s in enumerate(shapes)
        )
        keys = self.listing("input_keys", d.get("input_keys", []))
        for i, k in enumerate(keys):
            if not isinstance(k, (int, str)) or isinstance(k, bool):
                self.fail(_key("input_keys", i), k, "is not a position or a keyword", "e.g. 0")
        if keys and len(keys) != len(shapes):
            problem = f"has {len(keys)} keys for {len(shapes)} input_shapes"
            self.fail("input_keys", keys, problem, "give one key per input")
        out["input_keys"] = tuple(keys)
        nodes = out["node_placements"]
        placed = [n for n in nodes if n.startswith(INPUT_PREFIX)]
        if shapes and placed and len(placed) != len(shapes):
            problem = f"lists {len(shapes)} inputs but node_placements places {len(placed)}"
            self.fail("input_shapes", shapes, problem, "give one shape per input")
        for i, shape in enumerate(out["input_shapes"] if placed else ()):
            name = f"{INPUT_PREFIX}{i + 1}"
            if name in nodes and nodes[name]["out"]:
                key = _key(_key(_key("node_placements", name), "out"), 0)
                self.placements(key, nodes[name]["out"][0], shape=shape, node=True)

    def steps(self, d: dict[str, Any], out: dict[str, Any]) -> None:
        """The routes, recomputed nodes and checkpointing modes: each names graph nodes."""
        nodes = out["node_placements"]
        routes = self.mapping("routes", d.get("routes", {}))
        for where, via in routes.items():
            key = _key("routes", where)
            node, _, slot = where.rpartition(":")
            if node not in nodes or not slot.isdigit() or int(slot) >= len(nodes[node]["in"]):
                valid = 'key a route "node:slot" with a node of node_placements, e.g. "mm:0"'
                self.fail(key, via, "is not keyed by a planned node and input slot", valid)
            for i, text in enumerate(self.listing(key, via)):
                self.placements(_key(key, i), text)
        out["routes"] = routes
        recompute = self.listing("recompute", d.get("recompute", []))
        for i, name in enumerate(recompute):
            if not isinstance(name, str) or name not in nodes:
                valid = "list only nodes of node_placements"
                self.fail(_key("recompute", i), name, "is not a planned node", valid)
        out["recompute"] = recompute
        modes = self.mapping("checkpointing", d.get("checkpointing", {}))
        for layer, mode in modes.items():
            self.string(_key("checkpointing", layer), mode, CHECKPOINT_MODES)
        out["checkpointing"] = modes

    def collectives(self, d: dict[str, Any], out: dict[str, Any]) -> None:
        """The priced collectives by kind, and the buckets that merge some of them."""
        comm = self.mapping("comm", d.get("comm", {}))
        for kind, c in comm.items():
            key = _key("comm", kind)
            if sorted(self.mapping(key, c)) != list(COMM_KEYS):
                example = '{"count": 2, "bytes": 4096.0, "us": 14.4}'
                self.fail(key, c, "does not hold exactly count, bytes, us", f"e.g. {example}")
            for k in COMM_KEYS:
                self.number(_key(key, k), c[k])
        out["comm"] = comm
        buckets = self.listing("buckets", d.get("buckets", []))
        for i, b in enumerate(buckets):
            key = _key("buckets", i)
            if sorted(self.mapping(key, b)) != list(BUCKET_KEYS):
                valid = "give each bucket " + ", ".join(BUCKET_KEYS)
                self.fail(key, b, "does not hold exactly its fields", valid)
            self.string(_key(key, "kind"), b["kind"], sorted(comm))
            self.string(_key(key, "where"), b["where"], ("head", "tail"))
            self.count(_key(key, "members"), b["members"], least=2)
            for a, axis in enumerate(self.listing(_key(key, "axes"), b["axes"])):
                if self.count(_key(_key(key, "axes"), a), axis) >= self.num_axes:
                    valid = f"give a mesh axis in 0..{self.num_axes - 1}"
                    self.fail(_key(_key(key, "axes"), a), axis, "is not a mesh axis", valid)
            for k in ("bytes", "us", "us_alone"):
                self.number(_key(key, k), b[k])
        out["buckets"] = buckets


def _plan_fields() -> dict[str, Field[Any]]:
    """The fields of :class:`autoplan.result.plan.Plan` by name (imported here: plan imports us)."""
    from autoplan.result.plan import Plan

    return {f.name: f for f in fields(Plan)}
