"""Structured programs: forwards that reduce, normalize, multiply matrices or transpose.

* every op of tests/structured_catalogue.py against PyTorch's own implementation, values and gradients
  (float64), and its generated tests, which pass as generated and fail with a wrong backward;
* the stable forms: the textbook logsumexp, softmax and log_softmax are finite where torch's are (x = 1000);
* what backward saves: what a careful hand-written Function saves (softmax its output, a fused Linear+ReLU
  its inputs and a bool mask, norms the input and the per-row statistic);
* needs_input_grad skips the matrix products nobody needs;
* the language: its forms, and clear messages for the ones it refuses and for shapes that do not fit.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import math
import warnings
from pathlib import Path

import pytest
import torch
from torch.autograd import forward_ad
from torch.utils._python_dispatch import TorchDispatchMode

from scaffold import compile_op, generate_op, spec_from_mapping, write_files
from scaffold.bench import saved_bytes
from scaffold.errors import ScaffoldError, ScaffoldWarning

try:
    from .conftest import GeneratedRun, background_run, make_spec, run_pytest
    from .structured_catalogue import STRUCTURED
except ImportError:  # tests/ run as a plain folder, not a package
    from conftest import GeneratedRun, background_run, make_spec, run_pytest
    from structured_catalogue import STRUCTURED

_BY_NAME = {op.name: op for op in STRUCTURED}
_counter = itertools.count()


def _spec(name: str, policy: str = "memory"):
    return spec_from_mapping({**_BY_NAME[name].mapping(), "policy": policy}, source=f"{name}.toml")


@functools.cache
def _files(name: str, policy: str = "memory") -> dict[str, str]:
    return generate_op(_spec(name, policy))


def _module(name: str, folder: Path, policy: str = "memory"):
    (folder / f"{name}.py").write_text(_files(name, policy)[f"{name}.py"], encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location(f"_structured_{name}_{next(_counter)}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _inputs(name: str, seed: int = 0, shift: float = 0.0) -> tuple[list[torch.Tensor], list]:
    spec = _spec(name)
    domains = {d.name: d for d in compile_op(spec).domains}
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for t in spec.tensors:
        d = domains[t.name]
        x = torch.rand(t.shape, generator=generator, dtype=torch.float64) * (d.high - d.low) + d.low + shift
        tensors.append(x.requires_grad_())
    return tensors, [s.default for s in spec.scalars]


def _tuple(value) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def _every_op(folder: Path) -> GeneratedRun:
    """Every op's files in one folder, their generated tests in one pytest process (an ini file of its own
    makes the folder the rootdir, so no configuration above it applies)."""
    for op in STRUCTURED:
        for path, text in _files(op.name).items():
            (folder / path).write_text(text, encoding="utf-8")
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    return GeneratedRun(folder, ("--tb=short", str(folder)))


def test_the_catalogue_has_the_issues_ops():
    wanted = {
        "logsumexp_textbook", "softmax_textbook", "log_softmax_textbook", "soft_cross_entropy", "mse_mean",
        "rms_norm", "layer_norm", "linear_relu", "bilinear_form", "attention", "cosine_similarity",
        "l2_normalize", "softmax_entropy", "amax_rows", "gram", "logistic_nll", "sum_of_squares",
        "mean_variance", "log_softmax_and_logsumexp",
    }  # fmt: skip
    assert wanted <= set(_BY_NAME)
    assert _spec("layer_norm").forward.count("\n") == 3, "LayerNorm is written in four lines"


@pytest.mark.parametrize("name", list(_BY_NAME))
def test_matches_pytorch(name: str, tmp_path: Path):
    """Value and gradients (for a random upstream gradient) against PyTorch's own op, in float64."""
    module = _module(name, tmp_path)
    op = getattr(module, name)
    native = _BY_NAME[name].native
    inputs, scalars = _inputs(name)
    outs, expected = _tuple(op(*inputs, *scalars)), _tuple(native(*inputs, *scalars))
    assert len(outs) == len(expected)
    generator = torch.Generator().manual_seed(1)
    upstream = [torch.randn(e.shape, generator=generator, dtype=torch.float64) for e in expected]
    grads = torch.autograd.grad(outs, inputs, upstream, retain_graph=True)
    expected_grads = torch.autograd.grad(expected, inputs, upstream, retain_graph=True)
    for out, e in zip(outs, expected):
        assert out.shape == e.shape
        torch.testing.assert_close(out, e, rtol=1e-9, atol=1e-10)
    for x, grad, e in zip(inputs, grads, expected_grads):
        assert grad.shape == x.shape
        torch.testing.assert_close(grad, e, rtol=1e-8, atol=1e-10)
    # second derivatives, against torch's own double backward
    for got, want in zip(_hessian_vector(outs, inputs, upstream), _hessian_vector(expected, inputs, upstream)):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)


def _hessian_vector(outs, inputs, upstream) -> list[torch.Tensor]:
    """The gradient of the sum of the first input's gradient: second derivatives (zeros where there are none)."""
    total = sum((o * u).sum() for o, u in zip(outs, upstream))
    first = torch.autograd.grad(total, inputs, create_graph=True)[0]
    if not first.requires_grad:  # the gradient is constant in every input (a sum, amax)
        return [torch.zeros_like(x) for x in inputs]
    second = torch.autograd.grad(first.sum(), inputs, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(second, inputs)]


@pytest.mark.parametrize(
    "name", ["logsumexp_textbook", "softmax_textbook", "log_softmax_textbook", "log_softmax_and_logsumexp"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_textbook_forms_are_finite_where_torchs_ops_are(name: str, dtype: torch.dtype, tmp_path: Path):
    """At x = 1000 the textbook forms overflow (exp(1000) is inf); the generated op is torch's."""
    module = _module(name, tmp_path)
    inputs, scalars = _inputs(name, shift=1000.0)
    x = inputs[0].detach().to(dtype).requires_grad_()
    outs, expected = _tuple(getattr(module, name)(x, *scalars)), _tuple(_BY_NAME[name].native(x, *scalars))
    for out, e in zip(outs, expected):
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, e)
    grad = torch.autograd.grad(sum(o.sum() for o in outs), x)[0]
    expected_grad = torch.autograd.grad(sum(e.sum() for e in expected), x)[0]
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad, expected_grad)


_F64 = 8  # bytes per float64 element


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("softmax_textbook", 8 * 16 * _F64),  # its output only
        ("logsumexp_textbook", (8 * 16 + 8) * _F64),  # its input and output
        ("linear_relu", (8 * 16 + 32 * 16) * _F64 + 8 * 32),  # x, weight and a bool mask: not x @ w.T + b
        ("rms_norm", (8 * 16 + 16 + 8) * _F64),  # x, weight and 1/sqrt(mean square + eps) of each row
        ("layer_norm", (8 * 16 + 16 + 8 + 8) * _F64),  # x, weight, the mean and 1/sqrt(var + eps) of each row
        ("attention", (8 * 16 + 6 * 16 + 6 * 16) * _F64),  # q, k, v: the probabilities recomputed from them
        ("soft_cross_entropy", (8 * 16 + 8 * 16) * _F64),  # target and log_softmax
        ("mse_mean", 8 * 16 * _F64),  # input - target, not both inputs
        ("softmax_entropy", 8 * 16 * _F64),  # log_softmax: the softmax beside it is its exp
        ("mlp_two_layers", (8 * 16 + 16 * 32 + 32 * 4) * _F64),  # the inputs: x @ w1 recomputed, no mask
        ("bilinear_form", (8 * 16 + 16 * 12 + 8 * 12) * _F64),  # the inputs: x @ m recomputed
        ("log_softmax_and_logsumexp", 8 * 16 * _F64),  # log_probs: the softmax logsumexp's gradient needs
        ("max_rows", 2 * 8 * 16),  # two bool masks, x > y and x < y: not x and y
    ],
)
def test_saves_what_a_hand_written_function_saves(name: str, expected: int, tmp_path: Path):
    """Under the default policy "memory": products and softmaxes recomputed from what backward keeps anyway."""
    module = _module(name, tmp_path)
    inputs, scalars = _inputs(name)
    assert saved_bytes(getattr(module, name), [*inputs, *scalars]) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("attention", (8 * 16 + 6 * 16 + 6 * 16 + 8 * 6) * _F64),  # q, k, v and the probabilities
        ("mlp_two_layers", (8 * 16 + 16 * 32 + 32 * 4 + 8 * 32) * _F64),  # x @ w1, and no mask beside it
        ("bilinear_form", (8 * 16 + 16 * 12 + 8 * 12 + 8 * 12) * _F64),  # the inputs and x @ m
        ("layer_norm", (8 * 16 + 16 + 8 + 8) * _F64),  # as under "memory": per-row statistics are kept
    ],
)
def test_the_policy_time_keeps_products_and_softmaxes(name: str, expected: int, tmp_path: Path):
    module = _module(name, tmp_path, "time")
    inputs, scalars = _inputs(name)
    assert saved_bytes(getattr(module, name), [*inputs, *scalars]) == expected


@pytest.mark.parametrize("policy", ["memory", "time"])
@pytest.mark.parametrize("needed", [(True, False, False), (False, True, False), (False, False, True)])
def test_a_recomputed_product_gives_the_same_gradients(policy: str, needed, tmp_path: Path):
    """The bilinear form under either policy, each input alone needing its gradient: the same as PyTorch's."""
    module = _module("bilinear_form", tmp_path, policy)
    inputs, _ = _inputs("bilinear_form")
    inputs = [x.detach().requires_grad_(n) for x, n in zip(inputs, needed)]
    wanted = [x for x in inputs if x.requires_grad]
    native = _BY_NAME["bilinear_form"].native
    torch.testing.assert_close(
        torch.autograd.grad(module.bilinear_form(*inputs).sum(), wanted),
        torch.autograd.grad(native(*inputs).sum(), wanted),
    )


class _CountProducts(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.matmul):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("needed", "products"), [((True, False, False), 1), ((False, True, False), 1), ((False, False, True), 0)]
)
def test_needs_input_grad_skips_products_nobody_needs(needed, products: int, tmp_path: Path):
    module = _module("linear_relu", tmp_path)
    inputs, _ = _inputs("linear_relu")
    inputs = [x.detach().requires_grad_(n) for x, n in zip(inputs, needed)]
    out = module.linear_relu(*inputs)
    with _CountProducts() as counter:
        torch.autograd.grad(out.sum(), [x for x in inputs if x.requires_grad])
    assert counter.count == products


def test_a_gram_matrix_backward_is_one_product(tmp_path: Path):
    """x @ transpose(x): x's two shares of the gradient, g @ x and g^T @ x, join before the product."""
    module = _module("gram", tmp_path)
    inputs, _ = _inputs("gram")
    out = module.gram(*inputs)
    with _CountProducts() as counter:
        torch.autograd.grad(out.sum(), inputs)
    assert counter.count == 1


def _backward_source(name: str) -> str:
    source = _files(name)[f"{name}.py"]
    return source.split("def _backward(", 1)[1].split("\n\n\n", 1)[0]


def _forward_source(source: str) -> str:
    """The Function's forward in a generated module."""
    return source.split("    def forward(", 1)[1].split("def setup_context(", 1)[0]


def test_a_norms_statistic_is_hoisted_and_saved():
    """1/sqrt(var + eps) is computed once per row in forward and saved: backward has no root to take, and
    neither var nor the mean square is kept (saved bytes: test_saves_what_a_hand_written_function_saves)."""
    for name, saved in [("layer_norm", "x, weight, mu, rsqrt"), ("rms_norm", "x, weight, rsqrt")]:
        source = _files(name)[f"{name}.py"]
        assert "        rsqrt = torch.rsqrt(" in _forward_source(source)
        assert f"ctx.save_for_backward({saved})" in source
        backward = _backward_source(name)
        assert "sqrt" not in backward.replace("rsqrt", ""), backward
        assert "rsqrt**3" in backward
    program = compile_op(_spec("cosine_similarity")).program
    assert [v.name for v in program.values if v.name in program.hoisted] == ["rsqrt"]


def test_elementwise_steps_share_their_work_as_elementwise_ops_do():
    """A structured op's elementwise steps get the elementwise plan's code: a repeated subexpression in
    forward computed once, mish from one sigmoid (not PyTorch's mish, two sigmoids' worth on a CPU), and
    backward's products distributed where the gradients then share a factor with grad_output."""
    forward = _forward_source(_files("linear_gelu_learned")["linear_gelu_learned.py"])
    assert "tmp0 = bias + product" in forward and "return tmp0 * torch.sigmoid(1.702 * tmp0)" in forward, forward
    spec = make_spec("mean_mish", "mean(x*tanh(softplus(x)), dim=-1)", {"x": {"shape": [4, 8]}})
    forward = _forward_source(generate_op(spec)["mean_mish.py"])
    assert forward.count("torch.sigmoid(x)") == 1 and "functional.mish" not in forward, forward
    assert "tmp0 = grad_output * torch.sigmoid(h)" in _backward_source("swiglu")


def test_a_centred_value_is_not_summed_in_backward():
    """sum(mean(x) - x) over the mean's dimensions is zero: the variance's share of the mean's gradient is not
    computed (values and second derivatives against torch: test_matches_pytorch)."""
    assert ".sum(" not in _backward_source("mean_variance")
    assert _backward_source("layer_norm").count(".sum(") == 2  # mu's and rsqrt's, and the learned ones after
    assert "if grad_average_returned is not None" in _backward_source("mean_variance")


def test_functions_bind_arguments_without_inspecting_forward(tmp_path: Path, monkeypatch):
    """Function.apply binds its arguments to forward's signature on every call (the op's own calls run a twin
    whose forward takes ctx, which it does not bind); the generated module computes that signature once."""
    import inspect

    module = _module("layer_norm", tmp_path)
    inputs, scalars = _inputs("layer_norm")

    def refuse(*args, **kwargs):
        raise AssertionError("forward's signature inspected again")

    monkeypatch.setattr(inspect, "_signature_from_function", refuse)
    module.layer_norm(*inputs, *scalars).sum().backward()
    module.LayerNormFunction.apply(*inputs, *scalars)[0].sum().backward()  # the result, then what backward reads


def test_a_part_hoisted_from_a_parameter_follows_the_parameters_shape_at_call_time(tmp_path: Path):
    """``1/theta`` and ``k*log(theta)`` are hoisted out of the formula (computed once, as theta is declared
    []); given theta and k per element, their gradients are summed to those shapes at call time, not over
    everything (before: every element of theta's gradient was the total, silently)."""
    forward = "log(sum(exp(x), dim=-1, keepdim=True)) - x/theta - k*log(theta)"
    tensors = {"x": {"shape": [4, 5]}, "k": {"shape": []}, "theta": {"shape": [], "domain": [0.5, 2.0]}}
    (tmp_path / "hoisted.py").write_text(generate_op(make_spec("hoisted", forward, tensors))["hoisted.py"])
    module_spec = importlib.util.spec_from_file_location(f"_hoisted_{next(_counter)}", tmp_path / "hoisted.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    x = torch.randn(4, 5, dtype=torch.float64)
    for shape in [(), (4, 5), (4, 1)]:
        k = torch.full(shape, 2.0, dtype=torch.float64).add_(torch.rand(shape, dtype=torch.float64)).requires_grad_()
        theta = torch.full(shape, 1.5, dtype=torch.float64).add_(torch.rand(shape, dtype=torch.float64))
        theta.requires_grad_()
        expected = torch.logsumexp(x, -1, keepdim=True) - x / theta - k * torch.log(theta)
        got = torch.autograd.grad(module.hoisted(x, k, theta).sum(), (k, theta))
        torch.testing.assert_close(got, torch.autograd.grad(expected.sum(), (k, theta)), rtol=1e-12, atol=1e-12)


def test_a_factor_read_from_a_parameter_is_not_taken_out_of_a_sum_over_its_dimensions(tmp_path: Path):
    """sigma's gradient sums over the rows; 1/nu (nu declared []) is constant along them in the example and
    was taken out of that sum as a factor: given nu per element, each element of sigma's gradient was the sum
    times every row's 1/nu, silently (Student's t negative log-likelihood through the structured path)."""
    forward = "log(sum(exp(x), dim=-1, keepdim=True)) + log(sigma) + (nu + 1)/2*log(1 + (x/sigma)**2/nu)"
    tensors = {"x": {"shape": [4, 5]}, "sigma": {"shape": [5], "domain": [0.5, 2.0]}, "nu": {"shape": []}}
    (tmp_path / "student.py").write_text(generate_op(make_spec("student", forward, tensors))["student.py"])
    module_spec = importlib.util.spec_from_file_location(f"_student_{next(_counter)}", tmp_path / "student.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, dtype=torch.float64, generator=generator)
    sigma = torch.rand(5, dtype=torch.float64, generator=generator).add_(1).requires_grad_()
    for shape in [(), (4, 5)]:
        nu = torch.rand(shape, dtype=torch.float64, generator=generator).add_(1).requires_grad_()
        expected = (
            torch.logsumexp(x, -1, keepdim=True) + torch.log(sigma) + (nu + 1) / 2 * torch.log1p((x / sigma) ** 2 / nu)
        )
        got = torch.autograd.grad(module.student(x, sigma, nu).sum(), (sigma, nu))
        torch.testing.assert_close(got, torch.autograd.grad(expected.sum(), (sigma, nu)), rtol=1e-12, atol=1e-12)


def test_a_part_over_scalars_alone_is_python_math(tmp_path: Path):
    """A repeated part of an elementwise node that reads only scalars (the wing loss's 1/eps) is a Python number:
    what reads it alone takes math's functions (torch.log of a float is a TypeError)."""
    wing = "Piecewise((w*log(1 + Abs(d)/eps), Abs(d) < w), (Abs(d) - (w - w*log(1 + w/eps)), True))"
    spec = make_spec(
        "row_wing",
        wing.replace("d", "sum(x, dim=-1) - y"),
        {"x": {"shape": [4, 5]}, "y": {"shape": [4]}},
        {"w": {"type": "float", "default": 10.0}, "eps": {"type": "float", "default": 2.0}},
    )
    (tmp_path / "row_wing.py").write_text(generate_op(spec)["row_wing.py"], encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location(f"_row_wing_{next(_counter)}", tmp_path / "row_wing.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    x = (torch.randn(4, 5, dtype=torch.float64) * 8).requires_grad_()
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    d = x.sum(-1) - y
    w, eps = 10.0, 2.0
    expected = torch.where(d.abs() < w, w * torch.log1p(d.abs() / eps), d.abs() - (w - w * math.log(1 + w / eps)))
    out = module.row_wing(x, y, w, eps)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(out.sum(), (x, y))
    torch.testing.assert_close(got, torch.autograd.grad(expected.sum(), (x, y)), rtol=1e-12, atol=1e-12)


def _jvp_source(name: str) -> str:
    source = _files(name)[f"{name}.py"]
    return source.split("    def jvp(", 1)[1].split("\n\n\n", 1)[0]


def test_jvp_takes_the_tangents_autograd_materializes(tmp_path: Path):
    """With one output, setup_context keeps autograd's default materialize_grads: jvp gets zeros for an input
    without a tangent (as from torch.func.jvp), so it does not test each tangent for None. An op with several
    outputs turns materializing off: its jvp fills a missing tangent with zeros."""
    assert "_tangent is None" not in _jvp_source("matvec")
    assert "x_tangent = torch.zeros_like(x) if x_tangent is None else x_tangent" in _jvp_source(
        "log_softmax_and_logsumexp"
    )
    module = _module("matvec", tmp_path)
    (w, x), _ = _inputs("matvec")
    tangent = torch.randn(x.shape, dtype=torch.float64)

    def tangent_of(op):  # x's tangent only: w's is materialized as zeros
        with forward_ad.dual_level():
            return forward_ad.unpack_dual(op(w.detach(), forward_ad.make_dual(x.detach(), tangent))).tangent

    torch.testing.assert_close(tangent_of(module.matvec), tangent_of(_BY_NAME["matvec"].native), rtol=1e-9, atol=1e-10)


@background_run(_every_op)
def test_generated_tests_pass(background_results):
    """Every op's generated tests, as generated, in one pytest process."""
    result = background_results
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-80:])
    assert result.returncode == 0, f"generated tests failed (exit {result.returncode}):\n{tail}"


WRONG_BACKWARD = ["attention", "layer_norm", "linear_relu", "mean_variance"]


def _wrong_backwards(folder: Path) -> GeneratedRun:
    for name in WRONG_BACKWARD:
        files = dict(_files(name))
        head, tail = files[f"{name}.py"].split("    def backward(", 1)
        body, rest = tail.split("\n        return ", 1)
        returned, after = rest.split("\n", 1)
        scaled = f"tuple(None if g is None else g * 1.01 for g in ({returned.rstrip(',')},))"
        files[f"{name}.py"] = f"{head}    def backward({body}\n        return {scaled}\n{after}"
        for path, text in files.items():
            (folder / path).write_text(text, encoding="utf-8")
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    return GeneratedRun(folder, ("-k", "gradcheck or reference or float32 or hessian or jacrev", str(folder)))


@background_run(_wrong_backwards)
def test_generated_tests_catch_a_wrong_backward(background_results):
    """backward's gradients scaled by 1.01, in four ops (one pytest process): gradcheck, the reference
    comparison, float32, the hessian and jacrev fail for each."""
    result = background_results
    for name in WRONG_BACKWARD:
        failed = result.stdout.count(f"test_{name}.py::")
        assert failed >= 5, f"{name}: only {failed} failed\n" + result.stdout[-3000:]
        assert f"test_{name}.py::test_jacrev[cpu]" in result.stdout, f"{name}: jacrev passed\n" + result.stdout[-3000:]


def test_a_structured_op_is_checked_in_float32_at_extreme_inputs(tmp_path: Path):
    """A logsumexp computed as written, log(exp(x).sum()), is right in float64 wherever the reference is
    finite (exp(100) fits float64) and overflows in float32 at x = 100: its generated test_extreme_inputs
    (every element drawn from the extremes, float32 against float64 element by element where the value fits
    float32) fails, and no other check does."""
    files = dict(_files("logsumexp_textbook"))
    module = files["logsumexp_textbook.py"]
    assert module.count("torch.logsumexp(x, dim=-1)") == 2  # the Function's forward and the compiled twin's
    files["logsumexp_textbook.py"] = module.replace("torch.logsumexp(x, dim=-1)", "torch.log(torch.exp(x).sum(dim=-1))")
    write_files(files, tmp_path)
    result = run_pytest(tmp_path, "-k", "not cuda and not compile and not module and not checkpoint")
    failed = sorted(line.split(" - ")[0] for line in result.stdout.splitlines() if line.startswith("FAILED"))
    assert failed == ["FAILED test_logsumexp_textbook.py::test_extreme_inputs[cpu]"], result.stdout[-4000:]
    assert "value in float32 at extreme inputs is inf, float64 gives 100.0" in result.stdout


# -- the language --------------------------------------------------------------------------------------------


def _error(forward: str, tensors: dict, **extra) -> str:
    with pytest.raises(ScaffoldError) as info:
        generate_op(make_spec("op", forward, tensors, **extra), time_limit=None)
    return str(info.value)


@pytest.mark.parametrize(
    ("forward", "message"),
    [
        ("sum(x, 1)", "sum() takes one expression and dim and keepdim as keywords (got 2 positional"),
        ("sum(x, dim=())", "sum() got dim=(), which names no dimension"),
        ("mean(x, axis=1)", "mean() got 'axis', an unknown keyword"),
        ("sum(x, dim=1.5)", "sum() takes dimensions as literal integers"),
        ("sum(x, dim=-1, keepdim=1)", "sum() takes keepdim=True or keepdim=False"),
        ("softmax(x)", "softmax() needs the dimension it normalizes along"),
        ("softmax(x, dim=-1, keepdim=True)", "softmax() got 'keepdim', an unknown keyword"),
        ("transpose(x, 0)", "transpose() takes an expression and two dimensions"),
        ("h = sum\nh", "'sum' is a function; call it"),
    ],
)
def test_forms_the_language_refuses(forward: str, message: str):
    assert message in _error(forward, {"x": {"shape": [4, 8]}})


def test_shapes_that_do_not_fit_are_refused_naming_the_line():
    message = _error("h = x @ w\nsum(h, dim=-1)", {"x": {"shape": [4, 8]}, "w": {"shape": [4, 8]}})
    assert "line 1" in message
    assert "@ of x (shape [4, 8]) and w (shape [4, 8]): the inner dimensions 8 and 4 differ" in message
    message = _error("s = sum(x, dim=2)\ns * 2", {"x": {"shape": [4, 8]}})
    assert "line 1" in message and "dim=2 is out of range for x (shape [4, 8]) (valid: -2 to 1)" in message
    message = _error("x * sum(x, dim=-1)", {"x": {"shape": [4, 8]}})
    assert "do not broadcast together: sum(x, dim=-1) [4], x [4, 8]" in message
    assert "keepdim=True" in message
    message = _error("sum(x, dim=(1, 1))", {"x": {"shape": [4, 8]}})
    assert "names a dimension of x (shape [4, 8]) twice" in message
    message = _error("sum(x, dim=(0, -2))", {"x": {"shape": [4, 8]}})  # the same at rank 2, not at rank 3
    assert "counts some dimensions from the front and some from the back" in message


def test_example_shapes_need_not_broadcast_when_the_forward_multiplies_matrices():
    spec = make_spec("op", "x @ transpose(w, 0, 1)", {"x": {"shape": [4, 8]}, "w": {"shape": [6, 8]}})
    program = compile_op(spec).program
    assert program.outputs[0].shape == (4, 6)


def test_reductions_shapes_follow_torch():
    def shape(forward: str, x_shape: list[int]) -> tuple[int, ...]:
        return compile_op(make_spec("op", forward, {"x": {"shape": x_shape}})).program.outputs[0].shape

    assert shape("sum(x)", [4, 8]) == ()
    assert shape("mean(x, dim=0)", [4, 8]) == (8,)
    assert shape("amax(x, dim=(0, 2), keepdim=True)", [3, 4, 5]) == (1, 4, 1)
    assert shape("logsumexp(x, dim=-1)", [3, 4, 5]) == (3, 4)
    assert shape("softmax(x, dim=1)", [3, 4]) == (3, 4)
    assert shape("transpose(x, 0, 2)", [3, 4, 5]) == (5, 4, 3)
    assert shape("x @ transpose(x, -1, -2)", [2, 3, 4]) == (2, 3, 3)


def test_a_structured_op_works_from_the_command_line(tmp_path: Path):
    from scaffold.cli import main

    args = ["new", "op", "rowsum", "--forward", "sum(x**2, dim=-1)", "--tensor", "x=4,8", "--output-dir", str(tmp_path)]
    assert main(args) == 0
    assert "def backward" in (tmp_path / "rowsum.py").read_text()
    assert (tmp_path / "test_rowsum.py").is_file()


def test_an_argument_may_be_called_mean():
    """The structural spellings are not reserved: a Gaussian's mean stays an argument, and calling it says so."""
    tensors = {"x": {}, "mean": {}, "var": {"domain": [0.5, 2.0]}}
    files = generate_op(make_spec("gaussian_nll", "(x - mean)**2 / (2*var) + log(var) / 2", tensors), time_limit=None)
    assert "def gaussian_nll(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor)" in files["gaussian_nll.py"]
    message = _error("mean(x, dim=-1) * mean", {"x": {"shape": [4, 8]}, "mean": {"shape": [4]}})
    assert "'mean' is an argument or step, not a function" in message
    assert "rename the argument or step 'mean' to call mean()" in message


def test_fused_mode_runs_forward_and_backward_through_torch_compile(tmp_path: Path, monkeypatch):
    """fuse = true: _forward and _backward go through _runtime.Fused (here torch.compile is the identity, so the
    wiring is checked without compiling; the generated tests compile it for real)."""
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda function, **options: compiled.append(function) or function)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU tensors without Triton's interpreter: not the row kernels
    mapping = {**_BY_NAME["layer_norm"].mapping(), "fuse": True}
    files = generate_op(spec_from_mapping(mapping, source="layer_norm.toml"), time_limit=None)
    assert '_fused_forward = _runtime.Fused(_forward, "layer_norm")' in files["layer_norm.py"]
    (tmp_path / "layer_norm.py").write_text(files["layer_norm.py"], encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location("_fused_layer_norm", tmp_path / "layer_norm.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    inputs, scalars = _inputs("layer_norm")
    out = module.layer_norm(*inputs, *scalars)
    grads = torch.autograd.grad(out.sum(), inputs)
    expected = _BY_NAME["layer_norm"].native(*inputs, *scalars)
    torch.testing.assert_close(out, expected)
    for grad, want in zip(grads, torch.autograd.grad(expected.sum(), inputs)):
        torch.testing.assert_close(grad, want)
    assert [f.__name__ for f in compiled] == ["_forward", "_backward"]


@pytest.mark.parametrize("name", ["soft_cross_entropy", "softmax_entropy", "kl_softmax"])
def test_fused_mode_keeps_a_softmaxs_statistics_not_the_softmax(name: str, tmp_path: Path, monkeypatch):
    """fuse = true: a log_softmax of an input is recomputed in backward from its row maximum and log-sum,
    which forward keeps (no tensor of the input's size is written for it); a second derivative differentiates
    the log_softmax itself. torch.compile is the identity here; the generated tests compile it for real."""
    monkeypatch.setattr(torch, "compile", lambda function, **options: function)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU tensors without Triton's interpreter: not the row kernels
    mapping = {**_BY_NAME[name].mapping(), "fuse": True}
    source = generate_op(spec_from_mapping(mapping, source=f"{name}.toml"), time_limit=None)[f"{name}.py"]
    assert "ctx.mark_non_differentiable(tmp" in source
    assert "log_probs" not in source.split("ctx.save_for_backward(", 1)[1].split(")", 1)[0]
    assert "if torch.is_grad_enabled() else" in source
    (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location(f"_fused_{name}", tmp_path / f"{name}.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    inputs, scalars = _inputs(name)
    outs, expected = _tuple(getattr(module, name)(*inputs, *scalars)), _tuple(_BY_NAME[name].native(*inputs))
    upstream = [torch.randn_like(e) for e in expected]
    for out, e in zip(outs, expected):
        torch.testing.assert_close(out, e)
    grads = torch.autograd.grad(outs, inputs, upstream, retain_graph=True)
    for grad, want in zip(grads, torch.autograd.grad(expected, inputs, upstream, retain_graph=True)):
        torch.testing.assert_close(grad, want)
    for got, want in zip(_hessian_vector(outs, inputs, upstream), _hessian_vector(expected, inputs, upstream)):
        torch.testing.assert_close(got, want)


def test_fused_backward_runs_eagerly_where_a_hidden_outputs_gradient_is_given(tmp_path: Path, monkeypatch):
    """A hidden output's gradient is not None only in a second derivative or a gradcheck: backward's eager
    code runs there, so that torch.compile does not compile backward once more for each case of them (a
    cosine similarity's four hidden outputs hit Dynamo's recompile limit in its gradcheck)."""
    monkeypatch.setattr(torch, "compile", lambda function, **options: function)
    mapping = {**_BY_NAME["cosine_similarity"].mapping(), "fuse": True}
    source = generate_op(spec_from_mapping(mapping, source="cosine.toml"), time_limit=None)["cosine_similarity.py"]
    (tmp_path / "cosine_fused.py").write_text(source, encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location("_fused_cosine", tmp_path / "cosine_fused.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    calls = []
    fused = module._fused_backward
    monkeypatch.setattr(module, "_fused_backward", lambda *args: calls.append(1) or fused(*args))
    inputs, _ = _inputs("cosine_similarity")
    outs = module.CosineSimilarityFunction.apply(*inputs)
    torch.autograd.grad(outs[0].sum(), inputs, retain_graph=True)
    assert calls == [1]
    grads = torch.autograd.grad(outs[0].sum() + outs[1].sum(), inputs)
    assert calls == [1], "a hidden output's gradient went through the compiled backward"
    expected = torch.autograd.grad(
        (
            (inputs[0] * inputs[1]).sum(-1) / torch.sqrt((inputs[0] ** 2).sum(-1) * (inputs[1] ** 2).sum(-1))
            + (inputs[0] ** 2).sum(-1)
        ).sum(),
        inputs,
    )
    for grad, want in zip(grads, expected):
        torch.testing.assert_close(grad, want)


def test_a_flat_tensor_or_unused_scalar_of_a_structured_op_is_a_warning():
    """As for an elementwise op: a tensor no gradient reaches (only through a step, or only through a
    condition) and a scalar the forward never reads are named, once each; a smooth op warns of nothing."""
    tensors = {"x": {"shape": [4, 5]}, "y": {"shape": [4, 5]}}
    ops = {
        "steps": ("sum(sign(x) * y, dim=-1)", {}),
        "unused": ("softmax(x, dim=-1) * y", {"s": {"default": 1.0}}),
        "smooth": ("sum(x * y, dim=-1) * s", {"s": {"default": 1.0}}),
    }
    messages = {}
    for name, (forward, scalars) in ops.items():
        mapping = {"name": name, "forward": forward, "tensors": tensors, "scalars": scalars}
        spec = spec_from_mapping(mapping, source=f"{name}.toml")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            generate_op(spec, time_limit=None)
        messages[name] = [str(w.message) for w in caught if issubclass(w.category, ScaffoldWarning)]
    assert [m.split("\n")[0] for m in messages["steps"]] == [
        "steps.toml: forward: the gradient with respect to 'x' is zero everywhere: it enters only through "
        "sign(x), flat away from the jump; training will not move x"
    ]
    assert [m.split("\n")[0] for m in messages["unused"]] == [
        "unused.toml: forward: the scalar argument 's' is not used in the forward; the op still takes it"
    ]
    assert messages["smooth"] == []


def test_partial_derivatives_in_the_docstring_read_as_math():
    """The Function's docstring writes derivative kernels and stable forms as their formulas, as an
    elementwise op's does (tanh_grad(tanh(u)) is 1 - tanh(u)**2, xexpy(a, b) is a*exp(b))."""
    texts = {name: _files(name)[f"{name}.py"] for name in ("matvec", "row_sum_times_exp", "cauchy_rows")}
    assert "d out / d product = 1 - tanh(product)**2" in texts["matvec"]
    assert "d out / d h = total*exp(h)" in texts["row_sum_times_exp"]
    # (the note "Rewritten with xexpy: ..." names the stable form the code uses; the partials do not)
    partials = [line for text in texts.values() for line in text.splitlines() if "d out / d " in line]
    assert len(partials) >= 3 and "d out / d total = exp(h)" in "\n".join(partials)
    assert not any(kernel in line for line in partials for kernel in ("tanh_grad", "xexpy", "log_argument"))
