"""torch.nn.functional's named activations and torch.clamp in expressions (issue 34): each the math torch computes,
equal to torch's own in value and gradient at two batch ranks; keywords by name or in order; the messages for a
name that is not a function (did you mean, every function listed, keywords of an unknown function)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - as torch's documentation writes it

from scaffold.errors import ExpressionError
from scaffold.expression import parse_forward

from .conftest import GeneratedRun, background_run, import_generated, make_spec

#: forward -> what torch computes, at inputs away from each kink (-3, -2, -1, 0, 1, 2, 3).
ACTIVATIONS = {
    "relu(x)": F.relu,
    "sigmoid(x)": torch.sigmoid,
    "tanh(x)": torch.tanh,
    "softplus(x)": F.softplus,
    "gelu(x)": F.gelu,
    "gelu_tanh(x)": functools.partial(F.gelu, approximate="tanh"),
    "silu(x)": F.silu,
    "mish(x)": F.mish,
    "elu(x)": F.elu,
    "elu(x, alpha=0.5)": functools.partial(F.elu, alpha=0.5),
    "leaky_relu(x)": F.leaky_relu,
    "leaky_relu(x, 0.2)": functools.partial(F.leaky_relu, negative_slope=0.2),
    "hardtanh(x)": F.hardtanh,
    "hardtanh(x, min_val=-2, max_val=0.5)": functools.partial(F.hardtanh, min_val=-2.0, max_val=0.5),
    "hardsigmoid(x)": F.hardsigmoid,
    "hardswish(x)": F.hardswish,
    "logsigmoid(x)": F.logsigmoid,
    "clamp(x, min=-1, max=2)": functools.partial(torch.clamp, min=-1, max=2),
    "clamp(x, max=0.5)": functools.partial(torch.clamp, max=0.5),
    "clamp(x, -0.5)": functools.partial(torch.clamp, min=-0.5),
    "where(x > 1, x, 0.1*x)": lambda x: torch.where(x > 1, x, 0.1 * x),
    "where((x < -1) | (x > 2), exp(-x*x), x)": lambda x: torch.where((x < -1) | (x > 2), torch.exp(-x * x), x),
}


def _away_from_kinks(shape: tuple[int, ...]) -> torch.Tensor:
    x = torch.linspace(-4.4, 4.4, torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
    kinks = torch.tensor([-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0], dtype=torch.float64)
    near = (x.unsqueeze(-1) - kinks).abs().amin(-1) < 0.05
    return torch.where(near, x + 0.1, x)


@pytest.mark.parametrize("forward", list(ACTIVATIONS))
def test_each_is_torchs_in_value_and_gradient_at_two_ranks(tmp_path, forward):
    name = f"activation{list(ACTIVATIONS).index(forward)}"
    op = getattr(import_generated(tmp_path, make_spec(name, forward)), name)
    for shape in [(4, 5), (2, 3, 5)]:
        x = _away_from_kinks(shape).requires_grad_()
        out = op(x)
        x_ref = x.detach().clone().requires_grad_()
        expected = ACTIVATIONS[forward](x_ref)
        torch.testing.assert_close(out, expected)
        upstream = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        (grad,) = torch.autograd.grad(out, x, upstream)
        (expected_grad,) = torch.autograd.grad(expected, x_ref, upstream)
        torch.testing.assert_close(grad, expected_grad)


SUMMED = " + ".join(f for f in ACTIVATIONS if "=" not in f and "," not in f and "where" not in f)


def _summed(folder):
    from scaffold.api import generate_op
    from scaffold.write import write_files

    write_files(generate_op(make_spec("activations", SUMMED)), folder)
    return GeneratedRun(folder)


@background_run(_summed)
def test_the_activations_summed_in_one_op_pass_their_generated_tests(background_results):
    assert background_results.returncode == 0, background_results.stdout[-3000:]


@pytest.mark.parametrize(
    ("forward", "message"),
    [
        ("sigmod(x)", "unknown function 'sigmod'\n  hint: did you mean 'sigmoid'? supported: Abs, abs, acos"),
        ("sofmax(x, dim=-1)", "unknown function 'sofmax'\n  hint: did you mean 'softmax'? supported:"),
        ("cummax(x, dim=-1)", "unknown function 'cummax'\n  hint: supported: Abs"),
        ("clamp(x)", "clamp() takes 2 or 3 argument(s), got 1\n  hint: write clamp(x, min=0, max=1)"),
        ("elu(x, beta=1)", "elu() got 'beta', an unknown keyword\n  hint: write elu(x, alpha=1.0)"),
        ("elu(x, 1, alpha=2)", "elu() got 'alpha', twice"),
        ("exp(x, base=2)", "exp() takes no keyword arguments"),
        ("where(x, 1, 0)", "expected a condition such as x > 0"),
        ("where(x > 0, x)", "where() takes 3 arguments, got 2\n  hint: write where(condition, value, otherwise)"),
    ],
)
def test_messages_name_the_function_and_suggest_the_fix(forward, message):
    with pytest.raises(ExpressionError) as raised:
        parse_forward(make_spec("m", forward))
    assert message in str(raised.value)


def test_the_hint_lists_every_function_the_reductions_included():
    with pytest.raises(ExpressionError) as raised:
        parse_forward(make_spec("m", "nope(x)"))
    hint = str(raised.value).split("supported: ")[1]
    for name in ["sum", "mean", "softmax", "log_softmax", "logsumexp", "amax", "amin", "transpose", "relu", "where"]:
        assert name in hint.split(", "), name
