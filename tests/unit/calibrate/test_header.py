"""A calibrated topology file's header: how it was measured, and which collectives its link
figures price, the ones no fit covers (autoplan.calibrate.header)."""

from __future__ import annotations

from autoplan.calibrate.fit_links import FitError
from autoplan.calibrate.header import header_lines
from autoplan.calibrate.settings import Settings
from autoplan.core.measured import OPS, Calibration, CollectiveFits, LinkFit
from autoplan.core.topology import Device, Topology

FIT = LinkFit(latency_us=400.0, step_us=600.0, busbw_gbps=0.7)
ERRORS = {"intra.all_reduce": FitError(0.15, 0.4, 8), "matmul_fp32": FitError(0.1, 0.3, 15)}


def _topology(per_node: int, intra: tuple[str, ...], inter: tuple[str, ...]) -> Topology:
    return Topology(
        device=Device("cpu test", 0.2, 0.05, 40.0, 6.0, 1.0, 1.0, 1.2),
        gpus_per_node=per_node,
        intra_node_gbps=0.7 if intra else Topology().intra_node_gbps,
        inter_node_gbps=0.7 if inter else Topology().inter_node_gbps,
        nvls=False,
        collectives=CollectiveFits(
            intra=tuple((op, FIT) for op in intra), inter=tuple((op, FIT) for op in inter)
        ),
        calibration=Calibration("2026-11-28T10:00:00+00:00", "2.13.0+cpu", "gloo", (2, 2),
                                ("dp", "tp")),
    )  # fmt: skip


def _lines(topology: Topology, world: int = 4) -> dict[str, str]:
    lines = header_lines(topology, Settings(), ERRORS, world, "cpu.yaml")
    return {line.split(":", 1)[0]: line for line in lines}


def test_a_one_node_calibration_prices_only_groups_across_nodes_with_its_link_figures():
    """All four ops fitted inside a node: intra_node_gbps is said to be a copy of the fits,
    the link figures price every collective across nodes, inter_node_gbps is unmeasured."""
    lines = _lines(_topology(4, OPS, ()))
    link = lines["link figures"]
    assert "intra_node_gbps is a copy of the highest busbw_gbps fitted inside a node" in link
    assert link.endswith("only the collectives no fit covers (every collective across nodes)")
    assert "inter_node_gbps" not in link
    assert lines["not measured, kept from the h100 preset"].endswith(
        "intra_node_latency_us, inter_node_latency_us, inter_node_gbps"
    )
    assert "intra_node_gbps" not in lines["model"]


def test_fits_on_both_link_classes_leave_the_link_figures_nothing_to_price():
    """Every op fitted inside and across nodes: both gbps figures are copies and price
    nothing; neither is listed as unmeasured."""
    lines = _lines(_topology(2, OPS, OPS), world=4)
    link = lines["link figures"]
    assert "inter_node_gbps is a copy of the highest busbw_gbps fitted across nodes" in link
    assert link.endswith("(none: every collective has a fit)")
    assert "_gbps" not in lines["not measured, kept from the h100 preset"]


def test_without_a_fit_inside_a_node_intra_node_gbps_is_listed_as_not_measured():
    """Only groups across nodes measured (one rank per node): intra_node_gbps is the
    preset's, said so, and prices every collective inside a node; ops left out of a fitted
    link class are named."""
    lines = _lines(_topology(1, (), ("all_reduce", "all_gather")))
    assert "intra_node_gbps" in lines["not measured, kept from the h100 preset"]
    link = lines["link figures"]
    assert "intra_node_gbps is a copy" not in link
    assert link.endswith(
        "(every collective inside a node and reduce_scatter, all_to_all across nodes)"
    )
    assert lines["job"].startswith("job: mesh dp=2 x tp=2, 4 gloo ranks on 4 nodes (1 per node)")
