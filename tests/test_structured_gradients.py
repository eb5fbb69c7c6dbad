"""Custom gradients in ops that reduce, normalize or multiply matrices (issue 33): ``[gradients]`` gives what
backward returns for a tensor, over the forward's values (its reductions, softmaxes and products among them),
the arguments and ``grad``; a reduced output's ``grad`` has the reduced dimensions back as size 1."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest
import torch

from scaffold import generate_op, spec_from_mapping, write_files
from scaffold.errors import ScaffoldError

from .conftest import GeneratedRun, background_run, make_spec

# fairseq's LogSumExpMoE (fairseq/modules/... as in "Mixture Models for Diverse Machine Translation", Shen et
# al. 2019): logsumexp over the experts forward, the given posterior backward; the posterior takes no gradient.
LOGSUMEXP_MOE = {
    "name": "logsumexp_moe",
    "forward": "logsumexp(logp, dim=-1)",
    "tensors": {"logp": {"shape": [8, 4]}, "posterior": {"shape": [8, 4]}},
    "gradients": {"logp": "grad * posterior"},
}
# straight-through estimators around a reduction: the row maximum passes the gradient to every element, or
# spreads it by the softmax of the row (which only backward computes)
AMAX_STE = {
    "name": "amax_ste",
    "forward": "amax(x, dim=-1)",
    "tensors": {"x": {"shape": [8, 4]}},
    "gradients": {"x": "grad"},
}
SOFT_AMAX_STE = {
    "name": "soft_amax_ste",
    "forward": "amax(x, dim=-1)",
    "tensors": {"x": {"shape": [8, 4]}},
    "scalars": {"tau": {"default": 0.5}},
    "gradients": {"x": "grad * softmax(x / tau, dim=-1)"},
}
# the exact gradient written by hand over a step the forward keeps, beside a derived one (w's)
SCALED_LOGSUMEXP = {
    "name": "scaled_logsumexp",
    "forward": "lse = logsumexp(x, dim=-1, keepdim=True)\nlse * w",
    "tensors": {"x": {"shape": [8, 4]}, "w": {"shape": [8, 1]}},
    "gradients": {"x": "grad * w * exp(x - lse)"},
}
# several outputs, each with its own upstream gradient
TWO_OUTPUTS = {
    "name": "lse_and_max",
    "forward": "lse = logsumexp(x, dim=-1)\ntop = amax(x, dim=-1)",
    "outputs": ["lse", "top"],
    "tensors": {"x": {"shape": [8, 4]}},
    "gradients": {"x": "grad_lse * softmax(x, dim=-1) + grad_top"},
}
EXAMPLES = [
    LOGSUMEXP_MOE,
    AMAX_STE,
    SOFT_AMAX_STE,
    SCALED_LOGSUMEXP,
    TWO_OUTPUTS,
    {**LOGSUMEXP_MOE, "name": "logsumexp_moe_op", "target": "custom_op"},
    {**SCALED_LOGSUMEXP, "name": "scaled_logsumexp_fused", "fuse": True},
]

_counter = itertools.count()


class FairseqLogSumExpMoE(torch.autograd.Function):
    """fairseq's, as it is there."""

    @staticmethod
    def forward(ctx, logp, posterior, dim=-1):
        ctx.save_for_backward(posterior)
        ctx.dim = dim
        return torch.logsumexp(logp, dim=dim)

    @staticmethod
    def backward(ctx, grad_output):
        (posterior,) = ctx.saved_tensors
        grad_logp = grad_output.unsqueeze(ctx.dim) * posterior
        return grad_logp, None, None


def _files(mapping: dict) -> dict[str, str]:
    return generate_op(spec_from_mapping(mapping, source=f"{mapping['name']}.toml"))


def _module(mapping: dict, folder: Path):
    name = mapping["name"]
    (folder / f"{name}.py").write_text(_files(mapping)[f"{name}.py"], encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location(f"_custom_{name}_{next(_counter)}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, name)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64).requires_grad_()


def _examples(folder: Path) -> GeneratedRun:
    for mapping in EXAMPLES:
        write_files(_files(mapping), folder)
    return GeneratedRun(folder, ("-rs",))


@background_run(_examples)
def test_the_examples_generate_ops_whose_tests_pass(background_results):
    result = background_results
    assert result.returncode == 0, result.stdout[-3000:]
    assert "every tensor has a custom gradient" in result.stdout  # the straight-through ones: no gradcheck


@pytest.mark.parametrize("shape", [(8, 4), (2, 3, 5)])
def test_logsumexp_moe_is_fairseqs(shape: tuple[int, ...], tmp_path: Path):
    op = _module(LOGSUMEXP_MOE, tmp_path)
    logp, posterior = _randn(*shape, seed=0), _randn(*shape, seed=1)
    fair_logp, fair_posterior = (t.detach().clone().requires_grad_() for t in (logp, posterior))
    out, expected = op(logp, posterior), FairseqLogSumExpMoE.apply(fair_logp, fair_posterior)
    torch.testing.assert_close(out, expected)
    upstream = _randn(*shape[:-1], seed=2).detach()
    (grad_logp, grad_posterior) = torch.autograd.grad(out, [logp, posterior], upstream)
    (expected_logp,) = torch.autograd.grad(expected, [fair_logp], upstream)
    torch.testing.assert_close(grad_logp, expected_logp)
    assert torch.equal(grad_posterior, torch.zeros(shape, dtype=torch.float64))  # fairseq's None


def test_a_straight_through_reduction_passes_the_gradient_to_every_element(tmp_path: Path):
    op = _module(AMAX_STE, tmp_path)
    x = _randn(8, 4, seed=0)
    upstream = _randn(8, seed=1).detach()
    (grad,) = torch.autograd.grad(op(x), [x], upstream)
    assert torch.equal(grad, upstream.unsqueeze(-1).expand(8, 4))


def test_a_gradient_may_read_a_softmax_only_backward_computes(tmp_path: Path):
    source = _files(SOFT_AMAX_STE)["soft_amax_ste.py"]
    forward = source.split("    def forward(", 1)[1].split("def setup_context(", 1)[0]
    assert "softmax" not in forward  # forward computes and keeps nothing for it
    op = _module(SOFT_AMAX_STE, tmp_path)
    x = _randn(8, 4, seed=0)
    upstream = _randn(8, seed=1).detach()
    (grad,) = torch.autograd.grad(op(x), [x], upstream)
    torch.testing.assert_close(grad, upstream.unsqueeze(-1) * torch.softmax(x.detach() / 0.5, dim=-1))


def test_a_custom_gradient_is_differentiated_again_through_what_it_reads(tmp_path: Path):
    """Written exactly, the custom gradient's second derivative is plain autograd's of the forward."""
    op = _module(SCALED_LOGSUMEXP, tmp_path)
    x, w = _randn(8, 4, seed=0), _randn(8, 1, seed=1)
    upstream, weights = _randn(8, 1, seed=2).detach(), _randn(8, 4, seed=3).detach()

    def second(f):
        (grad_x,) = torch.autograd.grad(f(x, w), [x], upstream, create_graph=True)
        return torch.autograd.grad(grad_x, [x, w], weights)

    torch.testing.assert_close(second(op), second(lambda x, w: torch.logsumexp(x, -1, keepdim=True) * w))


def _wrong_custom_gradient(folder: Path) -> GeneratedRun:
    files = _files(LOGSUMEXP_MOE)
    right = "grad_output.unsqueeze(-1) * posterior"
    assert right in files["logsumexp_moe.py"]
    files["logsumexp_moe.py"] = files["logsumexp_moe.py"].replace(right, f"{right} * 2")
    write_files(files, folder)
    return GeneratedRun(folder, ("-k", "matches_reference or second_shape"))


@background_run(_wrong_custom_gradient)
def test_a_wrong_custom_gradient_fails_the_generated_tests(background_results):
    result = background_results
    assert result.returncode == 1, result.stdout[-3000:]
    assert "2 failed" in result.stdout


@pytest.mark.parametrize(
    ("forward", "tensors", "gradient", "message"),
    [
        (
            "2*logsumexp(x, dim=-1)",  # grad (4,) against p (4, 4): along the wrong dimension
            {"x": {"shape": [4, 4]}, "p": {"shape": [4, 4]}},
            "grad * p",
            "gradients.x: grad (shape [4]) has fewer dimensions than the gradient of 'x' (shape [4, 4])",
        ),
        (
            "logsumexp(x, dim=-1)",
            {"x": {"shape": [4, 8]}, "p": {"shape": [4, 6]}},
            "grad * p",
            "gradients.x: the gradient of 'x' has shape [4, 6], which does not broadcast to the shape of 'x', [4, 8]",
        ),
        (
            "sum(x, dim=-1)",
            {"x": {"shape": [4, 8]}, "p": {"shape": [8, 4]}},
            "grad * p",
            "the gradient of 'x' combines tensors whose shapes do not broadcast together: grad [4, 1], p [8, 4]",
        ),
        (
            "sum(x, dim=-1)",
            {"x": {"shape": [4, 8]}},
            "grad * sum(grad * x, dim=-1)",
            "gradients.x: the gradient reads sum(grad*x, dim=-1), a reduction, softmax or product of the upstream",
        ),
    ],
)
def test_custom_gradients_that_cannot_be_right_are_refused(forward, tensors, gradient, message):
    with pytest.raises(ScaffoldError) as caught:
        generate_op(make_spec("op", forward, tensors, gradients={"x": gradient}))
    assert message in str(caught.value)
