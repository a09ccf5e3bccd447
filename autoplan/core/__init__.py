"""The shared vocabulary every stage speaks: errors, the planning config, placements,
meshes, the hardware description, graph reading, and the one torch adapter.

In: nothing of autoplan (torch, PuLP's name list aside). Out: :class:`PlanError`,
:class:`~autoplan.core.config.PlanConfig`, placement parsing and printing, the
:class:`~autoplan.core.topology.Topology` a cost model reads, fake meshes, the model's
inputs as flat tensors, user files written safely, a JSON codec driven by type hints
(:mod:`~autoplan.core.codec`), and
:mod:`~autoplan.core.torch_adapter`, the only module that imports torch's private
modules (DTensor's placements and rules, fake tensors), re-exporting what the rest needs.

May import: nothing above it (``tests/unit/test_layers.py`` checks every folder's imports).
"""
