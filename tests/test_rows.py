"""Fused mode's Triton kernels (issue 36, scaffold/rows.py): ops that work row by row along the last dimension
get a forward and a backward kernel, run here on the CPU in Triton's interpreter (tests/conftest.py turns it
on before Triton is imported). Each is checked against PyTorch's own op at two ranks, in float64 and in
bfloat16 (which the kernels accumulate in float32), with the kernels' launches counted: a fallback to the
op's Function would give the same numbers without testing the kernels. Speed is measured by
benchmarks/rows.py on a GPU, not here."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional

from scaffold import compile_op, generate_op
from scaffold.spec import spec_from_mapping
from scaffold.testing import triton_interprets
from scaffold.write import write_files

from .conftest import GeneratedRun, background_run, import_generated, make_spec
from .structured_catalogue import STRUCTURED

pytestmark = pytest.mark.skipif(not triton_interprets(), reason="needs Triton, its interpreter on (tests/conftest.py)")

CATALOGUE = {op.name: op for op in STRUCTURED}
LOGITS = {"shape": [4, 5]}
TARGETS = {"shape": [4], "dtype": "int64", "domain": [0, 4]}
CE = "logsumexp(z, dim=-1) - sum(z*one_hot(t, num_classes=5), dim=-1)"
NLL = "-squeeze(gather(log_softmax(z, dim=-1), dim=-1, index=unsqueeze(t, -1)), -1)"
#: the issue's ops beyond the catalogue's: integer-target cross-entropy, with torch's ignore_index, and NLL
INTEGER_TARGETS = {
    "ce_ignored": (
        make_spec("rows_ce_ignored", f"where(t == -100, 0, {CE})", {"z": LOGITS, "t": TARGETS}, fuse=True),
        lambda z, t: functional.cross_entropy(z.flatten(0, -2), t.flatten(), reduction="none").view(t.shape),
    ),
    "nll": (
        make_spec("rows_nll", NLL, {"z": LOGITS, "t": TARGETS}, fuse=True),
        lambda z, t: functional.nll_loss(
            functional.log_softmax(z, -1).flatten(0, -2), t.flatten(), reduction="none"
        ).view(t.shape),
    ),
}
ISSUE_OPS = ["rms_norm", "layer_norm", "softmax_textbook", "log_softmax_textbook", "soft_cross_entropy"]
ISSUE_OPS += ["logsumexp_textbook"]


#: sums and means over every row: each row's part from the kernel, added up on the host
WITH_IGNORED = {**TARGETS, "domain": [-1, 4]}
TOTALS = {
    "rows_ce_mean": (
        make_spec(
            "rows_ce_mean",
            f"sum(where(t != -1, {CE}, 0)) / sum(where(t != -1, 1.0, 0.0))",
            {"z": LOGITS, "t": WITH_IGNORED},
            fuse=True,
        ),
        lambda z, t: functional.cross_entropy(z.flatten(0, -2), t.flatten(), ignore_index=-1),
    ),
    "rows_mse": (
        make_spec("rows_mse", "mean((x - y)**2)", {"x": LOGITS, "y": LOGITS}, fuse=True),
        functional.mse_loss,
    ),
}


def _fused(name: str):
    """The catalogue op, fused, under a name of its own (other tests import modules of the catalogue's names)."""
    spec = spec_from_mapping(CATALOGUE[name].mapping(), source=f"{name}.toml")
    return dataclasses.replace(spec, fuse=True, name=f"rows_{name}")


def _draw(spec, batch: tuple[int, ...], width: int, dtype: torch.dtype, generator: torch.Generator):
    """The spec's tensors with rows of ``width`` in the leading shape ``batch`` (a weight: one row)."""
    tensors = []
    for t in spec.tensors:
        if t.dtype == "int64":
            target = torch.randint(0, width, batch, generator=generator)
            target.view(-1)[::3] = -100  # torch's ignore_index, where the op ignores it
            tensors.append(target)
            continue
        shape = (*batch, width) if len(t.shape) > 1 else (width,) if len(t.shape) == 1 else ()
        low, high = t.domain or (-2.0, 2.0)
        x = torch.rand(shape, generator=generator, dtype=torch.float64) * (high - low) + low
        tensors.append(x.to(dtype).requires_grad_())
    return tensors


#: torch's op at any rank (F.cross_entropy takes the classes from dim 1 of a 3-d input)
NATIVE = {"soft_cross_entropy": lambda z, t: -(t * functional.log_softmax(z, -1)).sum(-1)}


def _native(name: str):
    if name in NATIVE:
        return NATIVE[name]
    return CATALOGUE[name].native if name in CATALOGUE else INTEGER_TARGETS[name][1]


def _spec(name: str):
    return _fused(name) if name in CATALOGUE else INTEGER_TARGETS[name][0]


def _run(module, name, tensors, scalars):
    function = getattr(module, name)
    outs = function(*tensors, *scalars)
    return outs if isinstance(outs, tuple) else (outs,)


@pytest.mark.parametrize("batch", [(6,), (2, 3)], ids=["rank 2", "rank 3"])
@pytest.mark.parametrize("name", [*ISSUE_OPS, *INTEGER_TARGETS])
def test_the_issues_row_ops_equal_torchs_through_their_kernels(name, batch, tmp_path):
    spec = _spec(name)
    module = import_generated(tmp_path, spec)
    assert module.__dict__.get(f"{spec.camel}Rows") is not None, compile_op(spec).plan.rows_reason
    width = 5 if name in INTEGER_TARGETS else 7  # a row shorter than its block: the masked lanes matter
    tensors = _draw(spec, batch, width, torch.float64, torch.Generator().manual_seed(0))
    scalars = [s.default for s in spec.scalars]
    launched = module._forward_rows.launches, module._backward_rows.launches
    outs = _run(module, spec.name, tensors, scalars)
    expected = _native(name)(*tensors, *scalars)
    expected = expected if isinstance(expected, tuple) else (expected,)
    floats = [x for x in tensors if x.is_floating_point()]
    upstream = [torch.randn_like(e) for e in expected]
    grads = torch.autograd.grad(outs, floats, upstream)
    for out, want in zip(outs, expected):
        torch.testing.assert_close(out, want)
    for grad, want in zip(grads, torch.autograd.grad(expected, floats, upstream)):
        torch.testing.assert_close(grad, want)
    assert module._forward_rows.launches == launched[0] + 1 and module._backward_rows.launches == launched[1] + 1


@pytest.mark.parametrize("name", ["rms_norm", "soft_cross_entropy", "ce_ignored"])
def test_bfloat16_accumulates_in_float32_against_a_float64_reference(name, tmp_path):
    """Rows of 2048 in bfloat16: the kernels compute in float32, so each value and gradient is the float64
    reference (of the same bfloat16 inputs) rounded to bfloat16, within one unit in its last place; sums
    accumulated in bfloat16 over 2048 elements would be many units off."""
    spec = _spec(name)
    module = import_generated(tmp_path, spec)
    low = _draw(spec, (3,), 2048, torch.bfloat16, torch.Generator().manual_seed(1))
    exact = [x.detach().double().requires_grad_() if x.is_floating_point() else x for x in low]
    scalars = [s.default for s in spec.scalars]
    launched = module._forward_rows.launches, module._backward_rows.launches
    (out,) = _run(module, spec.name, low, scalars)
    (want,) = _run_native(name, exact, scalars)
    assert out.dtype == torch.bfloat16
    _assert_within_an_ulp(out, want, "value")
    upstream = torch.randn(want.shape, dtype=torch.float64).to(torch.bfloat16)
    floats = [x for x in low if x.is_floating_point()]
    grads = torch.autograd.grad(out, floats, upstream)
    wants = torch.autograd.grad(want, [x for x in exact if x.is_floating_point()], upstream.double())
    for grad, expected in zip(grads, wants):
        assert grad.dtype == torch.bfloat16
        _assert_within_an_ulp(grad, expected, "gradient")
    assert module._forward_rows.launches == launched[0] + 1 and module._backward_rows.launches == launched[1] + 1


def _assert_within_an_ulp(low: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    """``low`` (bfloat16) is ``exact`` rounded, within one unit in the last place (8 bits), or 1e-5 of the
    tensor's largest value where cancellation leaves a value near 0 (float32's own rounding)."""
    exact = exact.detach()
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
    error = (low.double() - exact).abs()
    allowed = ulp + 1e-5 * exact.abs().max()
    assert (error <= allowed).all(), f"{what}: {(error / ulp).max().item():.1f} units off"


def _run_native(name, tensors, scalars):
    out = _native(name)(*tensors, *scalars)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("batch", [(6,), (2, 3)], ids=["rank 2", "rank 3"])
@pytest.mark.parametrize("name", list(TOTALS))
def test_a_mean_over_every_row_adds_up_each_rows_part(name, batch, tmp_path):
    """Mean cross-entropy with an ignored class (the Liger form: a masked sum over a count) and MSE: the
    forward kernel writes each row's part, the host adds them up and divides; backward's kernel takes the
    totals' gradients."""
    spec, native = TOTALS[name]
    module = import_generated(tmp_path, spec)
    generator = torch.Generator().manual_seed(5)
    z = torch.randn(*batch, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    if name == "rows_ce_mean":
        other = torch.randint(0, 5, batch, generator=generator)
        other.view(-1)[::3] = -1
    else:
        other = torch.randn(*batch, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    launched = module._forward_rows.launches, module._backward_rows.launches
    out = getattr(module, name)(z, other)
    expected = native(z, other)
    torch.testing.assert_close(out, expected)
    floats = [x for x in (z, other) if x.is_floating_point()]
    for grad, want in zip(torch.autograd.grad(out, floats), torch.autograd.grad(expected, floats)):
        torch.testing.assert_close(grad, want)
    assert (module._forward_rows.launches, module._backward_rows.launches) == (launched[0] + 1, launched[1] + 1)
    assert torch.autograd.gradgradcheck(lambda z: getattr(module, name)(z, other), (z,))


def test_a_second_derivative_differentiates_the_derived_function(tmp_path):
    spec = _fused("layer_norm")
    module = import_generated(tmp_path, spec)
    x, weight, bias = _draw(spec, (2, 3), 6, torch.float64, torch.Generator().manual_seed(2))
    out = module.rows_layer_norm(x, weight, bias, 1e-5)
    expected = functional.layer_norm(x, (6,), weight, bias, 1e-5)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, weight, bias), upstream, create_graph=True)
    wants = torch.autograd.grad(expected, (x, weight, bias), upstream, create_graph=True)
    probe = [torch.randn_like(g) for g in grads]
    second = torch.autograd.grad(sum((g * p).sum() for g, p in zip(grads, probe)), (x, weight), allow_unused=True)
    second_want = torch.autograd.grad(sum((g * p).sum() for g, p in zip(wants, probe)), (x, weight))
    for got, want in zip(second, second_want):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradgradcheck(lambda *t: module.rows_layer_norm(*t, 1e-5), (x, weight, bias))


def test_only_the_needed_gradients_are_written(tmp_path):
    module = import_generated(tmp_path, _fused("rms_norm"))
    x, weight = _draw(_fused("rms_norm"), (4,), 9, torch.float64, torch.Generator().manual_seed(3))
    weight = weight.detach()
    (grad,) = torch.autograd.grad(module.rows_rms_norm(x, weight, 1e-6).sum(), x)
    torch.testing.assert_close(grad, torch.autograd.grad(functional.rms_norm(x, (9,), weight, 1e-6).sum(), x)[0])
    source = (tmp_path / "rows_rms_norm.py").read_text()
    assert "need_weight=grad_weight is not None" in source and "if need_weight:" in source


def test_where_the_kernels_cannot_stand_in_the_function_runs(tmp_path, monkeypatch):
    """Without the interpreter on the CPU, inside torch.func transforms, under autocast, with a weight of
    another length broadcast, and where a dim counted from the front is not the last (another rank): the
    op's Function, the same result, and no kernel launched."""
    module = import_generated(tmp_path / "norm", _fused("rms_norm"))
    x, weight = _draw(_fused("rms_norm"), (4,), 8, torch.float64, torch.Generator().manual_seed(4))
    expected = functional.rms_norm(x, (8,), weight, 1e-6)
    launched = module._forward_rows.launches
    with monkeypatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "0")
        torch.testing.assert_close(module.rows_rms_norm(x, weight, 1e-6), expected)
    torch.testing.assert_close(torch.func.vmap(lambda r: module.rows_rms_norm(r, weight, 1e-6))(x), expected)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert module.rows_rms_norm(x.float(), weight.float(), 1e-6).dtype == torch.float32
    assert module._forward_rows.launches == launched
    columns = make_spec("columns_last", "softmax(x, dim=1)", {"x": {"shape": [4, 6]}}, fuse=True)
    softmax = import_generated(tmp_path / "columns", columns)
    y = torch.randn(2, 4, 6, dtype=torch.float64)
    torch.testing.assert_close(softmax.columns_last(y), torch.softmax(y, 1))  # dim 1 at rank 3 is not the last
    assert softmax._forward_rows.launches == 0
    torch.testing.assert_close(softmax.columns_last(y[0]), torch.softmax(y[0], 1))  # at rank 2 it is
    assert softmax._forward_rows.launches == 1


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("linear_relu", "neither a row, one per row, nor a weight"),  # a product with a matrix
        ("softmax_temperature_columns", "normalizes along another dimension than the last"),
        ("amin_all", "reduces over other dimensions than the last"),
        ("gram", "Transposed"),
    ],
)
def test_ops_that_do_not_work_row_by_row_keep_torch_compile_and_say_why(name, why):
    plan = compile_op(_fused(name)).plan
    assert plan.rows is None and why in plan.rows_reason
    source = generate_op(_fused(name), time_limit=None)[f"rows_{name}.py"]
    assert "_forward_kernel" not in source and "_runtime.Fused(_forward" in source


def test_an_elementwise_op_keeps_torch_compile():
    spec = make_spec("gelu_rows", "x/2*(1 + erf(x/sqrt(2)))", {"x": {"shape": [4, 8]}}, fuse=True)
    assert "elementwise" in compile_op(spec).plan.rows_reason


def _generated(folder):
    runs = {}
    for name in ("rms_norm", "logsumexp_textbook", "ce_ignored", "rows_ce_mean"):
        write_files(generate_op(TOTALS[name][0] if name in TOTALS else _spec(name)), folder / name)
        runs[name] = GeneratedRun(folder / name, ("-k", "not compile", "-rA"))
    return runs


@background_run(_generated)
def test_the_generated_tests_of_row_ops_pass_and_check_the_kernels(background_results):
    for name, result in background_results.items():
        assert result.returncode == 0, (name, result.stdout[-3000:])
        assert re.search(r"PASSED \S*::test_row_kernels\[cpu\]", result.stdout), result.stdout[-2000:]


def test_the_kernels_compile_for_an_h100(tmp_path):
    """Triton's own compiler (not its interpreter) builds each kernel for sm_90 down to a cubin, bfloat16 and
    float64: the issue's ops, a total and a weight summed over rows (tests/rows_compile.py)."""
    pytest.importorskip("triton.backends.nvidia")
    specs = [_spec(name) for name in ("rms_norm", "layer_norm", "log_softmax_textbook", "ce_ignored", "nll")]
    specs += [TOTALS["rows_ce_mean"][0], TOTALS["rows_mse"][0]]
    description = {}
    for spec in specs:
        write_files(generate_op(spec), tmp_path)
        kernels = compile_op(spec).plan.rows
        description[spec.name] = {
            "tensors": [a.name for a in kernels.tensors],
            "int64": [a.name for a in kernels.tensors if a.integer],
            "summed": [a.name for a in kernels.accumulated],
            "scalars": {s.name: s.type for s in spec.scalars},
        }
    (tmp_path / "ops.json").write_text(json.dumps(description))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).parent / "rows_compile.py"
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(tmp_path / "ops.json")],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("compiled ") == 4 * len(specs), result.stdout


@pytest.mark.parametrize(
    ("forward", "tensors", "clash"),
    [
        ("softmax(x, dim=-1) * settings", {"x": {"shape": [4, 8]}, "settings": {"shape": [8]}}, "'settings'"),
        (
            "probs = softmax(x, dim=-1)\nprobs_max = amax(x, dim=-1, keepdim=True)\nprobs*probs_max",
            {"x": {}},
            "'probs_max'",
        ),
        ("out0 = softmax(x, dim=-1)\nout0 * 2", {"x": {"shape": [4, 8]}}, "'out0'"),
    ],
)
def test_names_the_kernels_code_uses_keep_torch_compile(forward, tensors, clash):
    spec = make_spec("clash", forward, {n: {"shape": [4, 8], **t} for n, t in tensors.items()}, fuse=True)
    plan = compile_op(spec).plan
    assert plan.rows is None and clash in plan.rows_reason
