"""Where ops are defined (domain inference) and the inputs their generated tests use.

* inference restricts only what needs restricting: a logit takes both signs, ``Abs(x)**p`` any x;
* supports (open or closed ends) and special points (closed ends, zeros of a power's base);
* the extreme-input values stay inside a declared or inferred support;
* the extreme-input grid grows linearly with the number of tensors, and still pairs a tiny input of one
  tensor with a huge one of another;
* small test shapes keep the example shapes' broadcasting pattern;
* the generated tests, run in a subprocess, pass on a correct op and catch the known wrong derivatives
  (``n*x**n/x`` at x = 0, ``s*(1 - s)`` of a saturated sigmoid in float32).
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest
import torch

from scaffold import compile_op, generate_op, rules, write_files
from scaffold.domain import InputDomain, Support
from scaffold.render import _extremes, small_shapes
from scaffold.testing import OpTests

from .conftest import GeneratedRun, background_run, import_generated, make_spec, run_pytest

INF = math.inf
FOCAL = "(1 - 1/(1 + exp(-x)))**gamma * log(1/(1 + exp(-x)))"


def _domains(forward: str, tensors: dict | None = None, scalars: dict | None = None) -> dict[str, InputDomain]:
    return {d.name: d for d in compile_op(make_spec("op", forward, tensors, scalars)).domains}


def _float(default: float) -> dict:
    return {"type": "float", "default": default}


def test_focal_logits_take_both_signs():
    (x,) = _domains(FOCAL, scalars={"gamma": _float(2.0)}).values()
    assert x.low < 0 < x.high
    assert x.support == Support()  # sigmoid and its complement are positive: nothing to restrict
    extremes = _extremes(x)
    assert min(extremes) == -1e4 and max(extremes) == 1e4


@pytest.mark.parametrize(
    ("forward", "scalars", "support", "special"),
    [
        ("x**n", {"n": _float(1.0)}, Support(0.0, INF, low_closed=True), (0.0,)),
        ("x**n", {"n": _float(-0.5)}, Support(0.0, INF), ()),  # a pole at 0, not a special point
        ("x**n", {"n": {"type": "int", "default": 3}}, Support(), ()),  # an integer power
        ("Abs(x)**p", {"p": _float(1.5)}, Support(), (0.0,)),  # the base is never negative
        ("(x - 1)**1.5", {}, Support(1.0, INF, low_closed=True), (1.0,)),
        ("sqrt(x)", {}, Support(0.0, INF, low_closed=True), (0.0,)),
        ("log(x)", {}, Support(0.0, INF), ()),
        ("log(2*x - 1)", {}, Support(0.5, INF), ()),
        ("log(x**2 + 1)", {}, Support(), ()),
        ("log1p(x)", {}, Support(-1.0, INF), ()),
        ("atanh(x)", {}, Support(-1.0, 1.0), ()),
        ("asin(x)", {}, Support(-1.0, 1.0, True, True), (-1.0, 1.0)),
        ("acosh(x)", {}, Support(1.0, INF, low_closed=True), (1.0,)),
        ("log(1 + exp(x))", {}, Support(), ()),
    ],
)
def test_supports_and_special_points(forward, scalars, support, special):
    (x,) = _domains(forward, scalars=scalars).values()
    assert (x.support, x.special) == (support, special)
    assert x.low in x.support and x.high in x.support


def test_a_negative_int_power_is_a_pole_to_avoid():
    (x,) = _domains("x**n", scalars={"n": {"type": "int", "default": -2}}).values()
    assert (x.support, x.avoid, x.low, x.high) == (Support(), (0.0,), -3.0, 3.0)


def test_arguments_not_provably_in_range_are_left_to_the_numeric_check():
    p = _domains("log(p / (1 - p))", {"p": {}})["p"]
    assert 0 < p.low < p.high < 1
    x, y = _domains("sqrt(x * y)", {"x": {}, "y": {}}).values()
    assert x.low > 0 and y.low > 0  # found numerically, not forced on every tensor


def test_a_declared_domain_is_the_closed_support():
    d = _domains("x * exp(log_sigma)", {"x": {}, "log_sigma": {"domain": [-2.0, 2.0]}})["log_sigma"]
    assert (d.support, d.special) == (Support(-2.0, 2.0, True, True), (-2.0, 2.0))
    assert _extremes(d) == (-2.0, -1.0, -1e-3, 1e-3, 1.0, 2.0)


@pytest.mark.parametrize(
    ("support", "avoid", "expected"),
    [
        (Support(), (), (-1e4, -100.0, -30.0, -10.0, -1.0, -1e-3, 1e-3, 1.0, 10.0, 30.0, 100.0, 1e4)),
        (Support(), (0.0,), (-1e4, -100.0, -30.0, -10.0, -1.0, 1.0, 10.0, 30.0, 100.0, 1e4)),
        (Support(0.0, INF), (), (1e-3, 1.0, 10.0, 30.0, 100.0, 1e4)),
        (Support(1.0, INF, low_closed=True), (), (1.001, 2.0, 11.0, 31.0, 101.0, 10001.0)),
        (Support(-1.0, 1.0), (), (-0.999, -0.5, -1e-3, 1e-3, 0.5, 0.999)),
        (Support(0.5, 2.0, True, True), (), (0.5, 0.875, 1.25, 1.625, 2.0)),
    ],
)
def test_extremes_stay_inside_the_support(support, avoid, expected):
    d = InputDomain("x", -1.0, 1.0, avoid, "test", support)
    assert _extremes(d) == expected
    assert all(v in support for v in expected)


def test_small_shapes_keep_the_broadcasting_pattern():
    tensors = {
        "x": {"shape": [32, 64, 10, 10]},
        "w": {"shape": [64, 1, 1], "learnable": True},
        "b": {"shape": [10], "learnable": True},
        "c": {"shape": []},
    }
    spec = make_spec("op", "x * w + b + c", tensors)
    shapes = small_shapes(spec)
    assert shapes == [(2, 2, 3, 4), (2, 1, 1), (4,), ()]
    for t, small in zip(spec.tensors, shapes):
        assert len(small) == len(t.shape)
        assert [n == 1 for n in small] == [n == 1 for n in t.shape]
    # Dimensions equal in the example stay equal (here the last, 10 in x and b); others differ.
    assert shapes[0][-1] == shapes[2][-1] and len(set(shapes[0][1:])) == 3
    assert small_shapes(make_spec("op", "x * y", {"x": {"shape": [4, 1]}, "y": {"shape": [1, 5]}})) == [
        (3, 1),
        (1, 4),
    ]


def _import(path: Path, name: str):
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _op_tests(files: dict[str, str], folder: Path, monkeypatch) -> OpTests:
    """The OpTests object of a generated test file (its OP), imported from ``folder``."""
    monkeypatch.syspath_prepend(str(folder))
    write_files(files, folder)
    (test_file,) = [name for name in files if name.startswith("test_")]
    return _import(folder / test_file, f"_{test_file[:-3]}").OP


def test_extreme_grid_grows_linearly(tmp_path, monkeypatch):
    rows = {}
    for n in (1, 2, 4, 6):
        names = [f"x{i}" for i in range(n)]
        forward = " + ".join(f"{a}*{b}" for a, b in zip(names, names[1:] + names[:1]))
        op = _op_tests(generate_op(make_spec(f"grid{n}", forward, {name: {} for name in names})), tmp_path, monkeypatch)
        columns = torch.stack(op.extreme_columns())
        assert columns.shape[0] == n
        rows[n] = columns.shape[1]
        # Each tensor takes each of its extremes with the others at their typical values.
        for i, tensor in enumerate(op.inputs):
            typical = [other.typical for other in op.inputs]
            for value in tensor.extremes:
                row = typical[:i] + [value] + typical[i + 1 :]
                assert (columns.T == columns.new_tensor(row)).all(dim=1).any(), (tensor.name, value)
    assert rows[1] == 12
    assert all(rows[n] <= 5 * 12 * n for n in rows)  # 12 values, at most 5 companions each
    assert rows[6] < 4**6  # the old cartesian product of 4 values per tensor


def test_extreme_grid_pairs_a_tiny_value_with_a_huge_one(tmp_path, monkeypatch):
    tensors = {"x": {}, "beta": {"shape": [], "learnable": True}}
    op = _op_tests(generate_op(make_spec("swishb", "x / (1 + exp(-2*beta*x))", tensors)), tmp_path, monkeypatch)
    rows = {tuple(row) for row in torch.stack(op.extreme_columns()).T.tolist()}
    # sigmoid(2 * 1e4 * 1e-3) rounds to 1 in float32: s*(1 - s) there is 0, not 2e-9.
    assert {(1e4, 1e-3), (-1e4, -1e-3), (1e-3, 1e4)} <= rows


# Hand-written modules with the derivative bugs scaffold used to generate: the generated tests must fail.
_BUGGY_POWER = """
import torch
from torch import nn


class PowfFunction(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, n):
        return x**n

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, n = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        ctx.n = n

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return (grad_output * ctx.n * x**ctx.n / x if ctx.needs_input_grad[0] else None), None

    @staticmethod
    def jvp(ctx, x_tangent, *_):
        (x,) = ctx.saved_tensors
        return ctx.n * x_tangent * x**ctx.n / x


def powf(x, n=1.0):
    return PowfFunction.apply(x, n)


class Powf(nn.Module):
    def __init__(self, n=1.0):
        super().__init__()
        self.n = n

    def forward(self, x):
        return powf(x, self.n)

    def extra_repr(self):
        return f"n={self.n!r}"
"""

_BUGGY_SWISH = """
import torch
from torch import nn


class SwishbFunction(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, beta):
        return x * torch.sigmoid(2 * beta * x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, beta = inputs
        ctx.save_for_backward(x, beta)
        ctx.save_for_forward(x, beta)
        ctx.shapes = x.shape, beta.shape

    @staticmethod
    def _partials(x, beta):
        s = torch.sigmoid(2 * beta * x)
        ds = s * (1 - s)  # 0 in float32 where s rounds to 1
        return s + 2 * beta * x * ds, 2 * x**2 * ds

    @staticmethod
    def backward(ctx, grad_output):
        x, beta = ctx.saved_tensors
        dx, dbeta = SwishbFunction._partials(x, beta)
        grads = [(grad_output * d).sum_to_size(shape) for d, shape in zip((dx, dbeta), ctx.shapes)]
        return tuple(g if needed else None for g, needed in zip(grads, ctx.needs_input_grad))

    @staticmethod
    def jvp(ctx, x_tangent, beta_tangent):
        x, beta = ctx.saved_tensors
        dx, dbeta = SwishbFunction._partials(x, beta)
        return dx * x_tangent + dbeta * beta_tangent


def swishb(x, beta):
    return SwishbFunction.apply(x, beta)


class Swishb(nn.Module):
    def __init__(self):
        super().__init__()
        self.beta = nn.Parameter(torch.tensor(1.0))

    def forward(self, x):
        return swishb(x, self.beta)
"""


def _known_bugs(folder: Path) -> dict[str, GeneratedRun]:
    ops = [
        ("powf", "x**n", {"x": {}}, {"n": _float(1.0)}, _BUGGY_POWER),
        ("swishb", "x / (1 + exp(-2*beta*x))", {"x": {}, "beta": {"shape": [], "learnable": True}}, {}, _BUGGY_SWISH),
        (
            "big",
            "x * w + b",
            {"x": {"shape": [32, 64, 10, 10]}, "w": {"shape": [64, 1, 1], "learnable": True}, "b": {"shape": [10]}},
            {},
            None,
        ),
    ]
    for name, forward, tensors, scalars, buggy in ops:
        write_files(generate_op(make_spec(name, forward, tensors, scalars)), folder / "generated")
        if buggy is not None:
            write_files(generate_op(make_spec(name, forward, tensors, scalars)), folder / "buggy")
            (folder / "buggy" / f"{name}.py").write_text(buggy, encoding="utf-8")
    with_bugs = GeneratedRun(folder / "buggy", ("-k", "not cuda"))
    return {"generated": GeneratedRun(folder / "generated"), "buggy": with_bugs}


@background_run(_known_bugs)
def test_generated_tests_pass_and_catch_known_bugs(background_results):
    result = background_results["generated"]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    result = background_results["buggy"]
    failed = sorted(line.split(" - ")[0] for line in result.stdout.splitlines() if line.startswith("FAILED"))
    # The hand-written modules define jvp on the Function they call: Dynamo refuses them (test_compile,
    # test_compiled_model); they compute in autocast's bfloat16, not in the float32 scaffold documents; the
    # hand-written Swishb has no reset_parameters.
    assert failed == [
        "FAILED test_powf.py::test_autocast[cpu]",
        "FAILED test_powf.py::test_compile[cpu]",
        "FAILED test_powf.py::test_compiled_model[cpu]",
        "FAILED test_powf.py::test_special_points[cpu]",
        "FAILED test_swishb.py::test_autocast[cpu]",
        "FAILED test_swishb.py::test_compile[cpu]",
        "FAILED test_swishb.py::test_compiled_model[cpu]",
        "FAILED test_swishb.py::test_extreme_inputs[cpu]",
        "FAILED test_swishb.py::test_reset_parameters",
    ], result.stdout[-4000:]
    assert "x at special points is nan where the reference's is 1.0, at {'x': 0.0}" in result.stdout
    assert "beta in float32 at extreme inputs" in result.stdout


def test_the_special_points_of_every_tensor_are_tested(tmp_path, monkeypatch):
    tensors = {"x": {}, "y": {"domain": [0.0, 1.0]}}
    files = generate_op(make_spec("op", "Abs(x)**p * y", tensors, {"p": _float(1.5)}))
    op = _op_tests(files, tmp_path, monkeypatch)
    assert [i.special for i in op.inputs] == [(0.0,), (0.0, 1.0)]
    assert "def test_special_points(device):" in files["test_op.py"]
    # No special point, no test.
    assert "test_special_points" not in generate_op(make_spec("op", "x * y", {"x": {}, "y": {}}))["test_op.py"]


def test_module_parameters_keep_their_example_shapes(tmp_path, monkeypatch):
    tensors = {"x": {"shape": [32, 64, 10, 10]}, "w": {"shape": [64, 1, 1], "learnable": True}}
    op = _op_tests(generate_op(make_spec("op", "x * w", tensors)), tmp_path, monkeypatch)
    assert [i.shape for i in op.inputs] == [(2, 2, 3, 4), (2, 1, 1)]
    assert [i.module_shape for i in op.inputs] == [(2, 64, 3, 4), (64, 1, 1)]


def test_a_removable_singularity_is_a_special_point_where_the_limit_is_tested(tmp_path, monkeypatch):
    """Planck's x**3/expm1(x) is 0/0 at x = 0 as written (so is the reference): the op computes its Taylor
    polynomial near 0, and the generated test compares it with the reference's limit there. Without the
    polynomial, the same test fails."""
    spec = make_spec("planck", "x**3/(exp(x) - 1)", {"x": {}})
    files = generate_op(spec)
    assert _op_tests(files, tmp_path / "inspected", monkeypatch).inputs[0].special == (0.0,)
    # The polynomial, up to x**10, the branch of a where (named: the statement is long).
    assert re.search(r"out_then = \(\s*\(tmp2\*\*10\)\s*\.mul_\(-1 / 1209600\)", files["planck.py"])
    assert "return torch.where(tmp1, out_then, out_else)" in files["planck.py"]
    write_files(files, tmp_path / "generated")
    result = run_pytest(tmp_path / "generated")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]

    monkeypatch.setattr(rules, "remove_singularities", lambda expr, tensors: (expr, set()))
    write_files({**files, "planck.py": generate_op(spec, time_limit=None)["planck.py"]}, tmp_path / "buggy")
    result = run_pytest(tmp_path / "buggy", "-k", "not cuda")
    failed = sorted(line.split(" - ")[0] for line in result.stdout.splitlines() if line.startswith("FAILED"))
    assert failed == ["FAILED test_planck.py::test_special_points[cpu]"], result.stdout[-4000:]
    assert "value at special points is nan where the reference's is 1.00000000" in result.stdout  # x**2 at 1e-4


def test_a_divergence_is_no_removable_singularity_and_costs_no_series(monkeypatch):
    """lgamma(nu/2) + log(nu)/2 is inf - inf at nu = 0 without a finite limit (student_t_nll's normaliser):
    told apart from its values near 0 before sympy's series is asked (it took half a minute to fail), while
    x/expm1(x) still gets its polynomial."""
    import sympy

    from scaffold.stable import expm1, remove_singularities

    nu, x = sympy.Symbol("nu", real=True), sympy.Symbol("x", real=True)
    divergent = sympy.loggamma((nu + 1) / 2) - sympy.loggamma(nu / 2) - sympy.log(nu * sympy.pi) / 2
    assert divergent.subs(nu, 0) is sympy.nan  # what makes it a candidate
    series, asked = sympy.Expr.series, []

    def counted_series(self, *args, **kwargs):
        asked.append(self)
        return series(self, *args, **kwargs)

    monkeypatch.setattr(sympy.Expr, "series", counted_series)
    assert remove_singularities(divergent, {nu}) == (divergent, set())
    assert not asked, f"series of {asked[0]} was asked for"
    patched, variables = remove_singularities(x / expm1(x), {x})
    assert variables == {x} and isinstance(patched, sympy.Piecewise)


def test_a_removable_singularity_of_a_structured_op_is_a_special_point_where_it_is_finite(tmp_path):
    """sin(x)/x inside a row sum is 0/0 at x = 0 as written: the node computes its Taylor polynomial near 0
    (as an elementwise op does), 0 is a special point of x, and the op's value and gradient there are the
    limits: 1 per element, and 0."""
    spec = make_spec("sinc_rows", "sum(sin(x)/x, dim=-1)", {"x": {"shape": [8, 16]}})
    (x,) = compile_op(spec).domains
    assert x.special == (0.0,)
    module = import_generated(tmp_path, spec)
    zeros = torch.zeros(3, 5, dtype=torch.float64, requires_grad=True)
    value = module.sinc_rows(zeros)
    (grad,) = torch.autograd.grad(value.sum(), zeros)
    torch.testing.assert_close(value, torch.full((3,), 5.0, dtype=torch.float64))
    torch.testing.assert_close(grad, torch.zeros_like(zeros))
