"""Realistic formulas (tests/realistic.py) must generate, pass their own generated tests, and be accurate.

* ``test_formulas_generate``: every formula of FORMULAS and FOUND generates (a ScaffoldError is a failure
  unless the op is listed in EXPECTED_REFUSALS with a reason).
* ``test_generated_tests_pass``: all their generated test files, in one folder, run by one pytest
  subprocess; the failure message names every failing op and test.
* ``test_accuracy``: an independent check that does not trust the generated tests. For each op, the
  generated functional is evaluated (float64 and float32) at points that put each tensor in turn at
  extreme values (others at typical values), plus joint extremes, and its value, gradients and second
  derivatives are compared with the truth: the literal formula (stable primitives expanded by
  ``scaffold.stable.to_literal``) differentiated by sympy and evaluated by mpmath at 50 digits.
* ``test_random_compositions``: hypothesis builds forwards from realistic blocks (an activation or special
  function of an affine or scaled combination of tensors and scalars, wrapped by a loss or potential) and
  puts them through the same two checks. What it finds is kept in ``realistic.FOUND``.

The truth and the tolerances
----------------------------
Truth is taken where the literal formula and its derivative are real and finite at the point, with the
op's scalar defaults substituted exactly. Where the formula evaluates to 0/0 or sits exactly on a switch of
Abs/sign/Max/Min/Piecewise (a kink), it is the common one-sided limit (perturbing each tensor by ±1e-30
and ±1e-36, relative): ``x**n`` at 0 has derivative 0; where one-sided limits differ (a true kink, whose
derivative is a convention) or do not settle (a pole) the quantity is skipped. Points within 1e-9 of a
switch without being on it are skipped (keep away from kinks). Declared domains are respected;
undeclared tensors go wherever the formula is real (log and sqrt are real-only: no complex branch may make
a formula "real" again; lgamma is log|Gamma|, as torch.lgamma). Derivatives are checked only at points
where the value is representable in the dtype. The literal formula cancels catastrophically in tails
(1 - 1/(1 + exp(-x)) at x = 100), so each point is evaluated at 50 digits and then at 100, 400, 1200 and
5000 until two precisions agree.

A quantity ``t`` (value or first derivative) computed in dtype with unit roundoff ``u`` passes when
``|ours - t| <= rtol*|t| + atol + K*u*cond``, with float64: rtol 1e-6, atol 1e-10; float32: rtol 1e-3,
atol 1e-4; K = 8. ``cond = sum_i |x_i * d t / d x_i|`` is how much ``t`` moves when the inputs move by one
relative unit: even a correctly rounded evaluation of a sub-expression such as ``a*x`` perturbs the
result by that much (sin(a*x) at x = 1e4 cannot be right in float32 beyond ~1e-3 absolute). Truth is
evaluated at the dtype's rounded inputs, so input rounding is not counted twice. Quantities whose truth is
not representable in the dtype (|t| > 1e300 in float64, > 3e38 in float32) are skipped. Second
derivatives (each ``d2 f / dx_i dx_j``, from double backward) must be finite wherever the truth is
representable; in float64 they must also be close (rtol 1e-5, atol 1e-8, plus 1e3 unit roundoffs of the
largest second derivative at the point, for cancellations between terms).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import itertools
import math
import re
from pathlib import Path
from typing import Any

import mpmath
import pytest
import sympy
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sympy.codegen.cfunctions import exp2, expm1, hypot, log1p, log2, log10

from scaffold import generate_op, spec_from_mapping, write_files
from scaffold.errors import ScaffoldError
from scaffold.expression import parse_forward
from scaffold.stable import to_literal

from . import forked_pytest
from .conftest import THOROUGH, BackgroundPytest, examples, run_pytest
from .realistic import DEFAULT_TYPICAL, FORMULAS, FOUND, TYPICAL

# op name -> why scaffold may refuse it (empty: every realistic formula must generate).
EXPECTED_REFUSALS: dict[str, str] = {}
# Open problems, each failing its accuracy check today (strict: an op that passes again must be taken off
# this list). Recorded on the numerics issue's closing note.
KNOWN_PROBLEMS: dict[str, str] = {}
# Of those, the ones whose own generated tests fail too (strict as well).
KNOWN_GENERATED_FAILURES: dict[str, str] = {}

EXTREMES = (-1e4, -100.0, -30.0, -10.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 10.0, 30.0, 100.0, 1e4)
DIGITS = 50
PRECISIONS = (100, 400, 1200, 5000)  # digits tried after DIGITS until two agree
K_ROUNDINGS = 8
TOLERANCES = {  # dtype -> (rtol, atol, unit roundoff, largest representable truth)
    torch.float64: (1e-6, 1e-10, 2.0**-53, 1e300),
    torch.float32: (1e-3, 1e-4, 2.0**-24, 3e38),
}
HESSIAN_TOLERANCE = (1e-5, 1e-8)  # float64 only
SWITCH_EPS = 1e-9  # a switch function this close to 0 puts the point on a kink
PROPERTY_EXAMPLES = examples(10, 36)

ALL = [*FORMULAS, *FOUND]
_counter = itertools.count()


# --- generation ----------------------------------------------------------------------------------------------


def _spec(mapping: dict[str, Any]):
    return spec_from_mapping(mapping, source=f"{mapping['name']}.toml")


def _generate_all(mappings: list[dict[str, Any]], folder: Path) -> dict[str, str]:
    """Write every op's files into ``folder``; return {name: refusal message} for the refused ones."""
    refused = {}
    for mapping in mappings:
        try:
            write_files(generate_op(_spec(mapping), time_limit=None), folder)
        except ScaffoldError as exc:
            refused[mapping["name"]] = str(exc)
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    return refused


def _generate_all_on_two_cores(mappings: list[dict[str, Any]], folder: Path) -> dict[str, str]:
    """:func:`_generate_all`, every other op in a forked process (tests/forked_pytest.py): generating the
    realistic ops is otherwise the suite's longest stretch on one of CI's two cores."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=forked_pytest.context()) as pool:
        others = pool.submit(_generate_all, mappings[1::2], folder)
        refused = _generate_all(mappings[::2], folder)
        return {**refused, **others.result()}


# torch.compile's checks trace code that is the same in every elementwise op but for the forward printed as
# written: the catalogue's ops run them (tests/test_catalogue.py), these run every other check; under
# SCAFFOLD_THOROUGH=1, all of them.
_NOT_COMPILED = () if THOROUGH else ("-k", "not test_compile and not test_compiled_model")
GENERATED_TEST_ARGS = ("-rfE", "--tb=line", "-W", "ignore::DeprecationWarning", *_NOT_COMPILED)


def _run_generated_tests(folder: Path) -> tuple[list[str], str]:
    """Run every generated test file in ``folder`` in one pytest process: (["op: test - message"], output)."""
    return _failures(run_pytest(folder, *GENERATED_TEST_ARGS))


def _failures(result) -> tuple[list[str], str]:
    """(["op: test - message"], output) of a pytest run over generated test files."""
    output = result.stdout + result.stderr
    failures = []
    for line in output.splitlines():
        match = re.match(r"(FAILED|ERROR) test_(\w+)\.py(?:::(\S+))?(?: - (.*))?", line)
        if match:
            kind, op, test, message = match.groups()
            failures.append(f"{op}: {test or kind} - {(message or '').strip()[:300]}")
    if result.returncode not in (0, 1) or (result.returncode == 1 and not failures):
        failures.append(f"pytest exited {result.returncode}:\n" + "\n".join(output.splitlines()[-40:]))
    return failures, output


@pytest.fixture(scope="module")
def realistic_folder(tmp_path_factory):
    """Every formula's files in one folder, {name: refusal}, and their generated tests running in the
    background while the accuracy tests run here (test_generated_tests_pass, last, waits for them)."""
    folder = tmp_path_factory.mktemp("realistic")
    refused = _generate_all_on_two_cores(ALL, folder)
    mp = pytest.MonkeyPatch()
    mp.setenv("COLUMNS", "1000")  # the short summary keeps the whole message
    try:
        run = BackgroundPytest(folder, *GENERATED_TEST_ARGS)
    finally:
        mp.undo()
    yield folder, refused, run
    run.close()


def test_formulas_are_well_formed():
    names = [m["name"] for m in ALL]
    assert len(FORMULAS) >= 45
    assert len(set(names)) == len(names), "op names must be unique"
    assert not set(EXPECTED_REFUSALS) - set(names)


def test_formulas_generate(realistic_folder):
    _, refused, _ = realistic_folder
    unexpected = {name: message for name, message in refused.items() if name not in EXPECTED_REFUSALS}
    assert not unexpected, "refused:\n" + "\n".join(f"{n}: {m}" for n, m in unexpected.items())
    generated = {name for name in EXPECTED_REFUSALS if name not in refused}
    assert not generated, f"listed in EXPECTED_REFUSALS but generated: {sorted(generated)}"


# --- the truth ------------------------------------------------------------------------------------------------


def _heaviside(x, h=0.5):
    return mpmath.mpf(1) if x > 0 else mpmath.mpf(0) if x < 0 else mpmath.mpf(h)


def _dirac(x, *_):
    return mpmath.mpf(0) if x != 0 else mpmath.inf


def _log(x):
    if x < 0:  # real arithmetic: no branch of the complex log may make a formula "real" again
        raise ValueError("log of a negative number")
    return mpmath.log(x)


def _sqrt(x):
    if x < 0:
        raise ValueError("sqrt of a negative number")
    return mpmath.sqrt(x)


def _pow(base, exponent):
    if base < 0 and exponent != int(exponent):  # real arithmetic: (-1)**2.5 is not real, even if a ratio of two is
        raise ValueError("a negative number to a non-integer power")
    return mpmath.power(base, exponent)


class _RealPow(sympy.Function):
    """``base**exponent`` evaluated in real arithmetic (lambdify prints it as a call to _pow)."""


def _real_powers(expr: sympy.Expr) -> sympy.Expr:
    return expr.replace(
        lambda e: e.is_Pow and not e.exp.is_Integer and e.exp != sympy.S.Half,  # sqrt is _sqrt already
        lambda e: _RealPow(*e.args),
    )


def _loggamma(x):
    return mpmath.log(abs(mpmath.gamma(x)))  # torch.lgamma's log|Gamma(x)|, real for negative x too


MPMATH = [
    {
        "Heaviside": _heaviside,
        "DiracDelta": _dirac,
        "log": _log,
        "sqrt": _sqrt,
        "loggamma": _loggamma,
        "_RealPow": _pow,
    },
    "mpmath",
]
_EXPAND = {
    log1p: lambda u: sympy.log(1 + u),
    expm1: lambda u: sympy.exp(u) - 1,
    exp2: lambda u: 2**u,
    log2: lambda u: sympy.log(u) / sympy.log(2),
    log10: lambda u: sympy.log(u) / sympy.log(10),
    hypot: lambda a, b: sympy.sqrt(a**2 + b**2),
}


def _literal(mapping: dict[str, Any]) -> tuple[sympy.Expr, list[sympy.Symbol], list[Any]]:
    """The forward as written, scalars replaced by their defaults (exactly): (expr, tensor symbols, scalars)."""
    spec = _spec(mapping)
    parsed = parse_forward(spec)
    expr = to_literal(parsed.expr)
    for function, expand in _EXPAND.items():
        expr = expr.replace(lambda e, f=function: isinstance(e, f), lambda e, g=expand: g(*e.args))
    values = {}
    for s in spec.scalars:
        symbol = parsed.symbols[s.name]
        if s.type == "bool":
            values[symbol] = sympy.true if s.default else sympy.false
        elif s.type == "int":
            values[symbol] = sympy.Integer(s.default)
        else:
            values[symbol] = sympy.Rational(s.default)  # the float's exact binary value
    expr = expr.subs(values)
    return expr, [parsed.symbols[t.name] for t in spec.tensors], [s.default for s in spec.scalars]


def _switches(expr: sympy.Expr) -> list[sympy.Expr]:
    """Expressions whose zeros are the kinks of ``expr``: Abs/sign/Heaviside arguments, Max/Min
    differences, Piecewise conditions."""
    out = []
    for e in sympy.preorder_traversal(expr):
        if isinstance(e, (sympy.Abs, sympy.sign, sympy.Heaviside)):
            out.append(e.args[0])
        elif isinstance(e, (sympy.Max, sympy.Min)):
            out.extend(a - b for a, b in itertools.combinations(e.args, 2))
        elif isinstance(e, sympy.Piecewise):
            for _, condition in e.args:
                for rel in sympy.preorder_traversal(condition):
                    if isinstance(rel, sympy.core.relational.Relational):
                        out.append(rel.lhs - rel.rhs)
    return out


class Truth:
    """mpmath evaluation of a formula's value, gradient and Hessian at 50 digits."""

    def __init__(self, mapping: dict[str, Any]) -> None:
        expr, self.symbols, self.scalars = _literal(mapping)
        n = len(self.symbols)
        grads = [sympy.diff(expr, s) for s in self.symbols]
        hessian = [[sympy.diff(grads[i], self.symbols[j]) if j >= i else None for j in range(n)] for i in range(n)]
        for i, j in itertools.product(range(n), repeat=2):
            if j < i:
                hessian[i][j] = hessian[j][i]
        self.quantities = [expr, *grads, *[hessian[i][j] for i in range(n) for j in range(n)]]
        self.functions = [sympy.lambdify(self.symbols, _real_powers(q), modules=MPMATH) for q in self.quantities]
        self.switch_functions = [sympy.lambdify(self.symbols, s, modules=MPMATH) for s in _switches(expr)]
        self.n = n
        self.cache: dict[tuple[float, ...], list] = {}

    @staticmethod
    def _real(value) -> mpmath.mpf | None:
        if isinstance(value, mpmath.mpc):
            if value.imag != 0:
                return None
            value = value.real
        try:
            value = mpmath.mpf(value)
        except (TypeError, ValueError):
            return None
        return value if mpmath.isfinite(value) else None

    def _evaluate(self, k: int, point: list):
        try:
            return self._real(self.functions[k](*point))
        except (ZeroDivisionError, ValueError, OverflowError, TypeError):
            return None

    def _on_switch(self, point: list) -> str | None:
        """ "on" where a switch function is exactly 0, "near" where it is within SWITCH_EPS of 0."""
        state = None
        for g in self.switch_functions:
            try:
                value = self._real(g(*point))
            except (ZeroDivisionError, ValueError, OverflowError, TypeError):
                continue
            if value is not None and value == 0:
                state = "on"
            elif value is not None and abs(value) <= SWITCH_EPS:
                return "near"
        return state

    def _limit(self, k: int, moved: list[list]):
        """The common one-sided limit of quantity k: along every tensor from at least one side, for both
        step sizes, all agreeing; else None."""
        values = [self._evaluate(k, m) for m in moved]
        per_tensor = [[v for v in values[4 * i : 4 * i + 4] if v is not None] for i in range(self.n)]
        if not all(len(v) >= 2 for v in per_tensor):
            return None
        limits = [v for v in values if v is not None]
        low, high = min(limits), max(limits)
        scale = max(abs(low), abs(high))
        agree = high - low <= mpmath.mpf("1e-12") * scale + mpmath.mpf("1e-20")
        return (low + high) / 2 if agree and scale < 1e300 else None

    def at(self, values: list[float]) -> list:
        """Every quantity at the point (None where not real and finite, or a convention at a kink)."""
        key = tuple(values)
        if key not in self.cache:
            self.cache[key] = self._settled(values)
        return self.cache[key]

    def _settled(self, values: list[float]) -> list:
        """The quantities at increasing precision until two precisions agree: the literal formula cancels
        catastrophically in tails (1 - 1/(1 + exp(-x)) at x = 100 needs 44 more digits than its value)."""
        previous = self._at(values, DIGITS)
        result: list = [None] * len(previous)
        pending = set(range(len(previous)))
        for digits in PRECISIONS:
            current = self._at(values, digits, pending)
            for k in list(pending):
                a, b = previous[k], current[k]
                if a is None and b is None and digits >= PRECISIONS[1]:
                    pending.discard(k)  # not real or not finite at two high precisions: it is not
                elif a is not None and b is not None:
                    with mpmath.workdps(digits):
                        if abs(a - b) <= mpmath.mpf("1e-15") * max(abs(a), abs(b)) + mpmath.mpf("1e-60"):
                            result[k] = b
                            pending.discard(k)
            if not pending:
                break
            previous = current
        if result[0] is None:
            return [None] * len(result)
        return result

    def _at(self, values: list[float], digits: int, which: set[int] | None = None) -> list:
        """The quantities ``which`` (default: all; None for the others) at ``digits`` digits."""
        with mpmath.workdps(digits):
            point = [mpmath.mpf(v) for v in values]
            on_switch = self._on_switch(point)
            if on_switch == "near":  # the tiny steps below would not cross the kink: keep away
                return [None] * len(self.functions)
            moved = []  # each tensor moved by -h1, -h2, +h1, +h2 (relative)
            for i, sign, h in itertools.product(range(self.n), (-1, 1), (mpmath.mpf("1e-30"), mpmath.mpf("1e-36"))):
                m = list(point)
                m[i] = point[i] + sign * h * max(1, abs(point[i]))
                moved.append(m)
            result = []
            for k in range(len(self.functions)):
                if which is not None and k not in which:
                    result.append(None)
                    continue
                value = None if on_switch else self._evaluate(k, point)
                if value is None:
                    value = self._limit(k, moved)
                if k == 0 and value is None:  # no derivative where the value itself is not finite
                    return [None] * len(self.functions)
                result.append(value)
            return result


# --- the accuracy check ----------------------------------------------------------------------------------------


def _domains(mapping) -> dict[str, tuple[float, float] | None]:
    return {name: tuple(t["domain"]) if "domain" in t else None for name, t in mapping["tensors"].items()}


def _typical(mapping, typical: dict[str, float]) -> dict[str, float]:
    out = {}
    for name, domain in _domains(mapping).items():
        value = typical.get(name, DEFAULT_TYPICAL)
        if domain is not None and not domain[0] <= value <= domain[1]:
            value = (domain[0] + domain[1]) / 2
        out[name] = value
    return out


def accuracy_points(mapping, typical: dict[str, float]) -> list[tuple[float, ...]]:
    """Each tensor in turn at its extremes (others typical), then every tensor at the same extreme."""
    names = list(mapping["tensors"])
    domains = _domains(mapping)
    base = _typical(mapping, typical)

    def candidates(name):
        d = domains[name]
        if d is None:
            return EXTREMES
        return tuple(sorted({*(c for c in EXTREMES if d[0] <= c <= d[1]), float(d[0]), float(d[1])}))

    points = []
    for name in names:
        for c in candidates(name):
            points.append(tuple(c if n == name else base[n] for n in names))
    for c in EXTREMES:
        points.append(tuple(c if c in candidates(n) else base[n] for n in names))
    return list(dict.fromkeys(points))


def _import(path: Path):
    module_spec = importlib.util.spec_from_file_location(f"_realistic_{path.stem}_{next(_counter)}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _fmt(x) -> str:
    return "None" if x is None else f"{float(x):.9g}"


def check_accuracy(mapping, folder: Path, typical: dict[str, float] | None = None) -> list[str]:
    """Every disagreement of the generated op with the mpmath truth, as one line each."""
    name = mapping["name"]
    typical = TYPICAL.get(name, {}) if typical is None else typical
    truth = Truth(mapping)
    functional = getattr(_import(folder / f"{name}.py"), name)
    names = list(mapping["tensors"])
    n = len(names)
    points = accuracy_points(mapping, typical)
    problems = []
    for dtype, (rtol, atol, unit, biggest) in TOLERANCES.items():
        inputs = [torch.tensor([p[i] for p in points], dtype=dtype, requires_grad=True) for i in range(n)]
        with torch.enable_grad():
            out = functional(*inputs, *truth.scalars)
            grads = torch.autograd.grad(out.sum(), inputs, create_graph=True)
            hessian = []  # hessian[j][i]: d2 f / dx_i dx_j, elementwise
            for g in grads:
                column = (
                    torch.autograd.grad(g.sum(), inputs, allow_unused=True, retain_graph=True)
                    if g.requires_grad
                    else [None] * n
                )
                hessian.append([torch.zeros_like(out) if h is None else h.detach() for h in column])
        ours = [out.detach(), *[g.detach() for g in grads]]
        rounded = [[float(x) for x in inp.detach().tolist()] for inp in inputs]
        for k in range(len(points)):
            values = [rounded[i][k] for i in range(n)]
            exact = truth.at(values)
            if exact[0] is None or abs(exact[0]) > biggest:
                continue  # derivatives are checked where the value itself is representable
            where = ", ".join(f"{a}={_fmt(v)}" for a, v in zip(names, values))
            with mpmath.workdps(DIGITS):  # sums of 50-digit numbers stay exact enough
                for q, label in enumerate(["value", *[f"d/d{a}" for a in names]]):
                    t = exact[q]
                    if t is None or abs(t) > biggest:
                        continue
                    # cond: how far the quantity moves when every input moves by one relative unit
                    parts = exact[1 : 1 + n] if q == 0 else exact[1 + n + (q - 1) * n : 1 + n + q * n]
                    cond = sum(abs(v * d) for v, d in zip(values, parts) if d is not None)
                    ours_value = ours[q][k].item()
                    tol = float(rtol * abs(t) + atol + K_ROUNDINGS * unit * cond)
                    if not math.isfinite(ours_value) or abs(ours_value - t) > tol:
                        problems.append(
                            f"{name} {str(dtype)[6:]} {label} at ({where}): ours {_fmt(ours_value)},"
                            f" truth {_fmt(t)} (tolerance {tol:.2g})"
                        )
                entries = [v for v in exact[1 + n :] if v is not None]
                largest = max((abs(v) for v in entries), default=0)
                for i, j in itertools.product(range(n), repeat=2):
                    if j < i:
                        continue
                    t = exact[1 + n + i * n + j]
                    if t is None or abs(t) > biggest:
                        continue
                    ours_value = hessian[j][i][k].item()
                    bad = not math.isfinite(ours_value)
                    if dtype == torch.float64:
                        rtol_h, atol_h = HESSIAN_TOLERANCE
                        bad = bad or abs(ours_value - t) > rtol_h * abs(t) + atol_h + 1e3 * unit * largest
                    if bad:
                        problems.append(
                            f"{name} {str(dtype)[6:]} d2/d{names[i]}d{names[j]} at ({where}):"
                            f" ours {_fmt(ours_value)}, truth {_fmt(t)}"
                        )
    return problems


@pytest.mark.parametrize("mapping", ALL, ids=[m["name"] for m in ALL])
def test_accuracy(mapping, realistic_folder):
    folder, refused, _ = realistic_folder
    if mapping["name"] in refused:
        pytest.skip(f"refused (test_formulas_generate reports it): {refused[mapping['name']]}")
    problems = check_accuracy(mapping, folder)
    if mapping["name"] in KNOWN_PROBLEMS:
        assert problems, f"{mapping['name']} passes now: take it off KNOWN_PROBLEMS"
        pytest.xfail(KNOWN_PROBLEMS[mapping["name"]])
    assert not problems, f"{len(problems)} disagreements with the 50-digit truth:\n" + "\n".join(problems[:30])


# --- random realistic compositions -----------------------------------------------------------------------------

# Inner arguments: affine or scaled combinations of tensors and scalars.
INNER = ["w*x + b", "(x - y)/c", "alpha*x", "x*y", "x", "x + b", "w*(x - y)"]
# Activations and special functions of the inner argument U.
ACTIVATIONS = [
    "U/(1 + exp(-U))", "log(1 + exp(U))", "tanh(U)", "erf(U)", "0.5*U*(1 + erf(U/sqrt(2)))",
    "Piecewise((U, U > 0), (alpha*(exp(U) - 1), True))", "sqrt(U**2 + 1)", "1/(1 + exp(-U))",
    "U*tanh(log(1 + exp(U)))", "Max(U, 0)", "log(1/(1 + exp(-U)))", "exp(-U**2)", "atan(U)", "U/(1 + Abs(U))",
    "Abs(U)**p", "U**n", "U*Min(Max(U + 3, 0), 6)/6", "0.5*U*(1 + tanh(0.8*(U + 0.044715*U**3)))", "sin(U)",
    "log(cosh(U))",
]  # fmt: skip
# Losses and potentials wrapped around the activation V; t is a target (a label in [0, 1] for the
# classification losses).
WRAPS = [
    ("V", False), ("(V - t)**2", False), ("log(cosh(V - t))", False), ("log(1 + ((V - t)/c)**2)", False),
    ("sqrt((V - t)**2 + eps**2)", False),
    ("Piecewise((0.5*(V - t)**2, Abs(V - t) <= delta), (delta*(Abs(V - t) - 0.5*delta), True))", False),
    ("-(t*log(1/(1 + exp(-(V)))) + (1 - t)*log(1 - 1/(1 + exp(-(V)))))", True),
    ("-(1 - 1/(1 + exp(-(V))))**gamma*log(1/(1 + exp(-(V))))", False), ("exp(V) - t*V", False),
    ("4*((1/(1 + (V)**2))**6 - (1/(1 + (V)**2))**3)", False), ("(1 - exp(-(V - t)))**2", False),
    ("gamma*V**2/2", False),
]  # fmt: skip
PROP_TENSORS = {
    "x": {"shape": [4, 5]},
    "y": {"shape": [4, 5]},
    "w": {"shape": [5], "learnable": True, "init": 1.0},
    "b": {"shape": [], "learnable": True, "init": 0.0},
}
PROP_SCALARS = {
    "alpha": {"type": "float", "default": 1.0},
    "c": {"type": "float", "default": 0.5},
    "p": {"type": "float", "default": 1.5},
    "n": {"type": "int", "default": 3},
    "eps": {"type": "float", "default": 1e-3},
    "delta": {"type": "float", "default": 1.0},
    "gamma": {"type": "float", "default": 2.0},
}
PROP_TYPICAL = {"x": 0.7, "y": 0.3, "w": 1.0, "b": 0.1, "t": 0.25}

PROPERTY = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=PROPERTY_EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def composition_mapping(name: str, forward: str, label: bool = False) -> dict[str, Any]:
    """The spec mapping of a composed forward: the tensors and scalars it names."""
    used = set(re.findall(r"[A-Za-z_]\w*", forward))
    tensors = {k: v for k, v in PROP_TENSORS.items() if k in used}
    if "t" in used:
        tensors["t"] = {"shape": [4, 5], **({"domain": [0.0, 1.0]} if label else {})}
    scalars = {k: v for k, v in PROP_SCALARS.items() if k in used}
    return {"name": name, "forward": forward, "tensors": tensors, "scalars": scalars}


def _compose(inner: str, activation: str, wrap: str) -> str:
    return wrap.replace("V", f"({activation.replace('U', f'({inner})')})")


def test_random_compositions(tmp_path, monkeypatch):
    mappings: dict[str, dict[str, Any]] = {}

    @PROPERTY
    @given(st.sampled_from(INNER), st.sampled_from(ACTIVATIONS), st.sampled_from(WRAPS))
    def collect(inner, activation, wrap):
        forward = _compose(inner, activation, wrap[0])
        if any(m["forward"] == forward for m in mappings.values()):
            return
        name = f"composed_{len(mappings)}"
        mappings[name] = composition_mapping(name, forward, wrap[1])

    collect()
    refused = _generate_all(list(mappings.values()), tmp_path)
    problems: dict[str, list[str]] = {name: [f"refused: {m}"] for name, m in refused.items()}
    monkeypatch.setenv("COLUMNS", "1000")
    failures, _ = _run_generated_tests(tmp_path)
    for line in failures:
        problems.setdefault(line.split(":", 1)[0], []).append(line)
    for name, mapping in mappings.items():
        if name not in refused:
            problems[name] = problems.get(name, []) + check_accuracy(mapping, tmp_path, PROP_TYPICAL)
    failing = {name: found for name, found in problems.items() if found}
    assert not failing, (
        f"{len(failing)} of {len(mappings)} compositions fail (add each failing forward to realistic.FOUND):\n"
        + "\n".join(
            f"{mappings[name]['forward']!r} ({len(found)} problems):\n    " + "\n    ".join(found[:4])
            for name, found in failing.items()
        )
    )


def test_generated_tests_pass(realistic_folder):
    generated_test_failures, _ = _failures(realistic_folder[2].wait())
    failing = {f.split(":", 1)[0] for f in generated_test_failures}
    failures = [f for f in generated_test_failures if f.split(":", 1)[0] not in KNOWN_GENERATED_FAILURES]
    assert not failures, f"{len(failures)} generated tests failed:\n" + "\n".join(failures)
    passing = sorted(set(KNOWN_GENERATED_FAILURES) - failing)
    assert not passing, f"their generated tests pass now: take {passing} off KNOWN_GENERATED_FAILURES"
