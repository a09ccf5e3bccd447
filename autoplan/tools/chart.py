"""Where a plan's time goes, by layer kind, and a PNG chart of it for both mm modes.

Input: a :class:`~autoplan.tools.rebuild.Rebuilt` plan (or two, one per mm mode).
Output: ``{kind: {"compute_us", "comm_us"}}`` summing exactly to the plan's
compute and comm, and a bar chart (matplotlib, Agg backend) of it.

Kinds: attention, feed_forward, norm, embedding, output, other. A parameter's
kind comes from its FQN (``layers.0.attention.wq.weight`` -> attention). The
traced graph carries no module metadata (``make_fx`` of ``functional_call``),
so a graph node gets the kind of the nearest node that reads a parameter
directly, looking *forward* from a forward node (RMSNorm's pow/mean/rsqrt
feed the multiply by ``norm.weight``: norm; attention's softmax feeds the
``wo`` projection: attention) and *backward* from a backward node (the
backward of a module starts where the gradient flows out of the module after
it, so it inherits from the node that produced its incoming gradient). The
residual adds fall to the kind of the norm that reads them; the loss and
anything reached from no parameter is ``other``. A node's comm is the
redistribution of its inputs (a parameter's: its gradient's reduction), so
every edge is counted once.
"""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path

from autoplan.core import user_files
from autoplan.tools.rebuild import Rebuilt
from autoplan.trace.capture import TracedGraph

KINDS = ("attention", "feed_forward", "norm", "embedding", "output", "other")
_RULES = (
    ("norm", r"norm|(^|\.)ln_?\w*(\.|$)|layernorm"),
    ("embedding", r"embed|(^|\.)wte(\.|$)|(^|\.)wpe(\.|$)"),
    ("output", r"(^|\.)output(\.|$)|lm_head"),
    ("attention", r"attention|(^|\.)attn(\.|$)|self_attn"),
    ("feed_forward", r"feed_forward|(^|\.)mlp(\.|$)|(^|\.)ffn(\.|$)|(^|\.)w[123](\.|$)"),
)


def layer_kind(fqn: str) -> str:
    """``layers.0.attention_norm.weight`` -> norm; ``layers.1.feed_forward.w2.weight`` -> feed_forward."""
    for kind, pattern in _RULES:
        if re.search(pattern, fqn):
            return kind
    return "other"


def node_kinds(traced: TracedGraph) -> dict[str, str]:
    """Kind of every graph node (see the module docstring for the rule)."""
    nodes = [n for n in traced.gm.graph.nodes if n.op != "output"]
    kind_of_param = {
        p: layer_kind(f) for p, f in zip(traced.params, traced.param_fqns, strict=True)
    }
    users = {n.name: [u.name for u in n.users if u.op != "output"] for n in nodes}
    inputs = {n.name: [a.name for a in n.all_input_nodes] for n in nodes}
    forward = set(traced.outputs)
    for n in reversed(nodes):  # ancestors of the outputs are the forward pass
        if n.name in forward:
            forward.update(inputs[n.name])
    grads = {
        g: kind_of_param[p]
        for p, f in zip(traced.params, traced.param_fqns, strict=True)
        if (g := traced.grads.get(f)) is not None
    }
    # A parameter's views and casts (t, view, _to_copy: every input derives from
    # the same parameter) stand for the parameter itself.
    derived: dict[str, str] = dict(kind_of_param)
    for n in nodes:
        srcs = {derived.get(a) for a in inputs[n.name]}
        if inputs[n.name] and len(srcs) == 1 and (src := next(iter(srcs))) is not None:
            derived[n.name] = src
    kinds: dict[str, str] = dict(derived)
    for n in nodes:  # seeds: nodes reading a parameter, and the gradients
        read = [derived[a] for a in inputs[n.name] if a in derived]
        if n.name in grads:
            kinds[n.name] = grads[n.name]
        elif read and n.name not in kinds:
            kinds[n.name] = read[0]
    queue = deque(kinds)
    # Multi-source BFS: a forward node hands its kind to its producers, a backward
    # node to its users, never across the forward/backward boundary.
    while queue:
        v = queue.popleft()
        for w in inputs[v] if v in forward else users[v]:
            if w in kinds or (w in forward) != (v in forward):
                continue
            kinds[w] = kinds[v]
            queue.append(w)
    return {n.name: kinds.get(n.name, "other") for n in nodes}


def cost_by_kind(rb: Rebuilt) -> dict[str, dict[str, float]]:
    """Compute and comm microseconds of the plan per kind; the sums are the plan's totals."""
    kinds = node_kinds(rb.traced)
    out = {k: {"compute_us": 0.0, "comm_us": 0.0} for k in KINDS}
    for v in rb.table.nodes:
        compute, comm = rb.node_cost(v)
        entry = out[kinds.get(v, "other")]
        entry["compute_us"] += compute
        entry["comm_us"] += comm
    return out


def write_chart(
    by_mode: dict[str, dict[str, dict[str, float]]], path: str | Path, title: str
) -> None:
    """Grouped bars: per kind, compute and comm (ms) of each mode side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(by_mode)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    width = 0.8 / len(modes)
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    for m, mode in enumerate(modes):
        xs = [k + (m - (len(modes) - 1) / 2) * width for k in range(len(KINDS))]
        compute = [by_mode[mode][k]["compute_us"] / 1e3 for k in KINDS]
        comm = [by_mode[mode][k]["comm_us"] / 1e3 for k in KINDS]
        color = colors[m % len(colors)]
        ax.bar(xs, compute, width, color=color, label=f"{mode} compute")
        ax.bar(
            xs,
            comm,
            width,
            bottom=compute,
            color=color,
            alpha=0.45,
            hatch="//",
            label=f"{mode} comm",
        )
    ax.set_xticks(range(len(KINDS)), KINDS)
    ax.set_ylabel("estimated time per step (ms)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    try:
        with user_files.replacing(path) as tmp:
            fig.savefig(tmp, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)
