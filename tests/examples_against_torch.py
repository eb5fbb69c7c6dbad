"""What the examples say they are, checked against torch's own ops and the reference documents' own numbers.

Not collected from tests/: tests/test_examples.py copies it, as test_examples_against_torch.py, into the folder
where it generates every example, and runs it there with their generated tests (it imports the ops by name).
The generated tests compare each op with its forward as written; this compares it with what the example says
it is, in float64, values and gradients, at a batch rank more than the spec's example."""

from __future__ import annotations

import attention
import clip_gradient
import clipped_relu
import cross_entropy
import layer_norm
import linear_relu
import logsumexp
import power
import pytest
import quadratic
import rms_norm
import rope
import scaled_activation
import smooth_l1
import split_and_transform
import stable_logsumexp
import straight_through
import swish
import torch
from torch.nn import functional

GENERATOR = torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=GENERATOR, dtype=torch.float64, requires_grad=True)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _targets() -> torch.Tensor:
    t = torch.randint(0, 5, (3, 6), generator=GENERATOR)
    t.view(-1)[::4] = -1  # ignored
    return t


#: name -> (the generated op, torch's, its inputs): each a function of the same arguments
CASES = {
    "swish": (swish.swish, lambda x, beta: x * torch.sigmoid(beta * x), lambda: (_randn(3, 4, 5), _randn())),
    "logsumexp": (logsumexp.logsumexp, lambda x: torch.logsumexp(x, -1), lambda: (_randn(3, 4, 5),)),
    "linear_relu": (
        linear_relu.linear_relu,
        lambda x, w, b: functional.relu(functional.linear(x, w, b)),
        lambda: (_randn(3, 4, 10), _randn(15, 10), _randn(15)),
    ),
    "quadratic": (quadratic.quadratic, lambda x, a, b, c: a * x**2 + b * x + c, lambda: (_randn(4, 5),) * 4),
    "power": (lambda x: power.power(x, 5), lambda x: x**5, lambda: (_randn(3, 4, 5),)),
    "scaled_activation_relu": (
        lambda x: scaled_activation.scaled_activation(x, 0.5, True),
        lambda x: 0.5 * torch.relu(x),
        lambda: (_randn(3, 4, 5),),
    ),
    "scaled_activation_tanh": (
        lambda x: scaled_activation.scaled_activation(x, 0.5, False),
        lambda x: 0.5 * torch.tanh(x),
        lambda: (_randn(3, 4, 5),),
    ),
    "stable_logsumexp": (
        stable_logsumexp.stable_logsumexp,
        lambda x: torch.logsumexp(x.flatten(), 0),
        lambda: ((_randn(3, 4) * 1000).detach().requires_grad_(),),
    ),
    "split_and_transform": (
        split_and_transform.split_and_transform,
        lambda x: (torch.relu(x), torch.relu(-x)),
        lambda: (_randn(3, 4, 5),),
    ),
    "smooth_l1": (
        lambda input, target: smooth_l1.smooth_l1(input, target, 0.5),
        lambda input, target: functional.smooth_l1_loss(input, target, reduction="none", beta=0.5),
        lambda: (_randn(3, 4, 5), _randn(3, 4, 5)),
    ),
    "clipped_relu": (
        lambda x: clipped_relu.clipped_relu(x, 2.0),
        lambda x: torch.clamp(x, 0, 2.0),
        lambda: ((_randn(3, 4, 5) * 3).detach().requires_grad_(),),
    ),
    "layer_norm": (
        layer_norm.layer_norm,
        lambda x, w, b, eps: functional.layer_norm(x, x.shape[-1:], w, b, eps),
        lambda: (_randn(3, 4, 16), _randn(16), _randn(16), 1e-5),
    ),
    "rms_norm": (
        rms_norm.rms_norm,
        lambda x, w, eps: functional.rms_norm(x, x.shape[-1:], w, eps),
        lambda: (_randn(3, 4, 16), _randn(16), 1e-6),
    ),
    "cross_entropy": (
        cross_entropy.cross_entropy,
        lambda z, t: functional.cross_entropy(z.flatten(0, -2), t.flatten(), ignore_index=-1, reduction="none").view(
            t.shape
        ),
        lambda: (_randn(3, 6, 5), _targets()),
    ),
    "attention": (
        lambda q, k, v: attention.attention(q, k, v, q.shape[-1]),
        functional.scaled_dot_product_attention,
        lambda: (_randn(2, 3, 4, 8), _randn(2, 3, 5, 8), _randn(2, 3, 5, 8)),
    ),
    "rope": (
        rope.rope,
        lambda x, cos, sin: x * cos + _rotate_half(x) * sin,
        lambda: (_randn(2, 3, 6, 8), _randn(6, 8), _randn(6, 8)),
    ),
}


def _floats(values):
    return [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]


@pytest.mark.parametrize("name", CASES)
def test_the_example_is_what_it_says(name):
    op, native, inputs = CASES[name]
    args = inputs()
    out, expected = op(*args), native(*args)
    out, expected = (out, expected) if isinstance(out, tuple) else ((out,), (expected,))
    torch.testing.assert_close(out, expected)
    upstream = [torch.randn(e.shape, generator=GENERATOR, dtype=e.dtype) for e in expected]
    tensors = _floats(args)
    grads = torch.autograd.grad(out, tensors, upstream)
    torch.testing.assert_close(grads, torch.autograd.grad(expected, tensors, upstream))


def test_the_textbooks_own_numbers():
    # Straight-through estimator: y = [0, 1, 1, 0], x.grad = [1, 1, 1, 1]
    x = torch.tensor([-0.5, 0.3, 1.2, -0.1], requires_grad=True)
    y = straight_through.straight_through(x)
    y.sum().backward()
    assert y.tolist() == [0, 1, 1, 0] and x.grad.tolist() == [1, 1, 1, 1]
    # Gradient clipping: d(sum(y**2))/dx = 2x = [2, 4, 6], clipped to 0.5
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (clip_gradient.clip_gradient(x, 0.5) ** 2).sum().backward()
    assert x.grad.tolist() == [0.5, 0.5, 0.5]
    # SplitAndTransform: x.grad = [-1, -1, 0, 1, 1] for pos.sum() + neg.sum()
    x = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0], requires_grad=True)
    pos, neg = split_and_transform.split_and_transform(x)
    (pos.sum() + neg.sum()).backward()
    assert x.grad.tolist() == [-1, -1, 0, 1, 1]
    # Clipped ReLU: the gradient is 1 where 0 < x < C, 0 elsewhere
    x = torch.tensor([-1.0, 0.5, 1.5, 2.5], requires_grad=True)
    clipped_relu.clipped_relu(x, 2.0).sum().backward()
    assert x.grad.tolist() == [0, 1, 1, 0]


def test_the_modules_are_sized_as_torchs():
    assert linear_relu.LinearRelu(7, 3).weight.shape == torch.nn.Linear(7, 3).weight.shape
    assert layer_norm.LayerNorm(12).weight.shape == torch.nn.LayerNorm(12).weight.shape
    assert rms_norm.RmsNorm(12).weight.shape == torch.nn.RMSNorm(12).weight.shape
