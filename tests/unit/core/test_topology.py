"""Tests for autoplan.core.topology: presets, validation, strict YAML loading, group_span."""

import math

import pytest
import yaml

from autoplan.core.topology import Device, Topology, group_span
from tests.helpers.paths import REPO

CONFIGS = REPO / "configs" / "topology"


def test_device_preset_has_datasheet_figures():
    """The H100 preset carries the SXM5 datasheet numbers (dense BF16, HBM3)."""
    h100 = Device.preset("h100")
    assert (h100.peak_bf16_tflops, h100.peak_fp32_tflops) == (989.0, 67.0)
    assert (h100.hbm_gbps, h100.memory_gib) == (3350.0, 80.0)
    assert Device.preset("H100") is h100


def test_unknown_device_preset_names_value_and_choices():
    """An unknown device name is rejected, naming it and the allowed names."""
    with pytest.raises(ValueError, match=r"'v100'.*a100, b200, h100, h200"):
        Device.preset("v100")


@pytest.mark.parametrize("name", ["h100", "h200", "a100", "b200"])
def test_topology_presets_exist(name):
    """Every documented topology preset builds and uses its own device."""
    topology = Topology.preset(name)
    assert topology.device is Device.preset(name)
    assert topology.gpus_per_node == 8


def test_topology_validation_names_field_value_and_rule():
    """A bad link figure is rejected with the field, the value and the rule."""
    with pytest.raises(ValueError, match=r"Topology.inter_node_gbps \(-1.0\) must be > 0"):
        Topology(inter_node_gbps=-1.0)
    with pytest.raises(ValueError, match=r"Topology.gpus_per_node \(0\) must be >= 1"):
        Topology(gpus_per_node=0)


@pytest.mark.parametrize(
    ("mesh", "axes", "gpus_per_node", "expected"),
    [
        ((8, 8), (1,), 8, (8, 1)),
        ((8, 8), (0,), 8, (1, 8)),
        ((8, 8), (0, 1), 8, (8, 8)),
        ((2, 4), (0,), 8, (2, 1)),
        ((2, 4), (1,), 8, (4, 1)),
        ((4, 2, 8), (0, 2), 8, (8, 4)),
        ((16,), (), 8, (1, 1)),
    ],
)
def test_group_span(mesh, axes, gpus_per_node, expected):
    """A mesh axis group maps to (ranks per node, nodes) under row-major rank layout."""
    p, m = group_span(mesh, axes, gpus_per_node)
    assert (p, m) == expected
    assert p * m == math.prod(mesh[a] for a in axes)


def test_group_span_rejects_uneven_groups_and_bad_axes():
    """A group with different rank counts per node, or a bad axis, is an error."""
    with pytest.raises(ValueError, match=r"same count on every node"):
        group_span((3, 4), (0, 1), 8)
    with pytest.raises(ValueError, match=r"axes \(2,\) must be distinct mesh axes"):
        group_span((8, 8), (2,), 8)


@pytest.mark.parametrize("name", ["h100", "a100"])
def test_yaml_configs_match_presets(name):
    """configs/topology/<name>.yaml loads to the preset of the same name."""
    path = CONFIGS / f"{name}.yaml"
    loaded = Topology.from_dict(yaml.safe_load(path.read_text()), source=str(path))
    assert loaded == Topology.preset(name)


def test_from_dict_unknown_key_names_key_and_file():
    """An unknown topology key is an error naming the key, its value and the file."""
    with pytest.raises(
        ValueError, match=r"cluster\.yaml: unknown topology key 'nvlink_gbps' \(value 900\)"
    ):
        Topology.from_dict({"device": "h100", "nvlink_gbps": 900}, source="cluster.yaml")


def test_from_dict_wrong_type_names_key_and_file():
    """A wrongly typed value is an error naming the key, the value and the file."""
    with pytest.raises(
        ValueError, match=r"cluster\.yaml: topology key 'gpus_per_node' has value '8'"
    ):
        Topology.from_dict({"gpus_per_node": "8"}, source="cluster.yaml")
    with pytest.raises(ValueError, match=r"cluster\.yaml: topology key 'nvls' has value 1"):
        Topology.from_dict({"nvls": 1}, source="cluster.yaml")


def test_from_dict_device_forms():
    """``device`` may be a preset name (taking that preset's links) or a field mapping."""
    assert Topology.from_dict({"device": "a100"}) == Topology.preset("a100")
    custom = {
        "name": "X",
        "peak_bf16_tflops": 1,
        "peak_fp32_tflops": 1,
        "hbm_gbps": 1,
        "memory_gib": 1,
    }
    topology = Topology.from_dict({"device": custom, "nvls": False})
    assert topology.device.name == "X" and topology.device.hbm_gbps == 1.0
    assert topology.intra_node_gbps == Topology().intra_node_gbps
    with pytest.raises(ValueError, match=r"f\.yaml: unknown device key 'tflops'"):
        Topology.from_dict({"device": {**custom, "tflops": 3}}, source="f.yaml")
    with pytest.raises(
        ValueError, match=r"f\.yaml: topology key 'device': Unknown device preset 'tpu'"
    ):
        Topology.from_dict({"device": "tpu"}, source="f.yaml")


def test_from_dict_bad_value_names_file():
    """A value of the right type that breaks a rule still names the file."""
    with pytest.raises(ValueError, match=r"f\.yaml: Topology.intra_node_gbps \(0.0\) must be > 0"):
        Topology.from_dict({"intra_node_gbps": 0}, source="f.yaml")
