"""split_step: a recorded joint program cut into forward, backward and inference programs
that compute what the joint program did, with the handed values named."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from autoplan.runtime.split_step import (
    collective_ops,
    forward_only,
    placeholders,
    saved_values,
    split_joint,
)


def _joint(primals: list[torch.Tensor], tangents: list[torch.Tensor]) -> list[torch.Tensor]:
    """y = tanh(x @ w); the joint program returns y and w's gradient."""
    x, w = primals
    (dy,) = tangents
    h = x @ w
    y = torch.tanh(h)
    dh = dy * (1 - y * y)
    return [y, x.t() @ dh]


def _recorded() -> tuple[torch.fx.GraphModule, list[torch.Tensor], list[torch.Tensor]]:
    primals = [torch.randn(4, 3), torch.randn(3, 5)]
    tangents = [torch.randn(4, 5)]
    with torch.no_grad():
        gm = make_fx(_joint)(primals, tangents)
    return gm, primals, tangents


def test_forward_then_backward_compute_what_the_joint_program_did():
    """Forward's outputs and backward's gradient, fed through the handed values, equal the
    joint program's results; the inference program returns the output alone."""
    torch.manual_seed(0)
    gm, primals, tangents = _recorded()
    want = gm(primals, tangents)
    forward, backward = split_joint(gm, 1)
    saved, backward_inputs = saved_values(forward, backward, 1, ("input x", "parameter w"))
    out = forward(*primals)
    handed = list(out[1:])
    assert len(handed) == len(saved) and -1 in backward_inputs
    args = [handed[i] if i >= 0 else tangents[-1 - i] for i in backward_inputs]
    (grad,) = backward(*args)
    torch.testing.assert_close(out[0], want[0])
    torch.testing.assert_close(grad, want[1])
    (alone,) = forward_only(forward, 1)(*primals)
    torch.testing.assert_close(alone, want[0])


def test_a_handed_placeholder_is_named_and_the_rest_are_activations():
    """The input the backward reads is saved under the name it was given, the computed tanh
    as an activation with its shape and bytes; backward placeholders map to saved slots and
    the cotangent (-1); no collectives anywhere."""
    torch.manual_seed(0)
    gm, *_ = _recorded()
    forward, backward = split_joint(gm, 1)
    saved, backward_inputs = saved_values(forward, backward, 1, ("input x", "parameter w"))
    got = [(s.name, s.what, s.shape, s.dtype, s.nbytes) for s in saved]
    assert got == [
        ("primals_1", "input x", (4, 3), torch.float32, 48),
        ("tanh", "activation", (4, 5), torch.float32, 80),
    ]
    assert backward_inputs == (0, 1, -1)
    assert [p.name for p in placeholders(forward)] == ["primals_1", "primals_2"]
    assert not collective_ops(forward) and not collective_ops(backward)
