"""The registry of supported functions (scaffold/functions.py): each entry parses, prints and is documented
as it says."""

from __future__ import annotations

import ast
import builtins
import math
import re
import warnings
from collections import Counter
from pathlib import Path

import mpmath
import pytest
import sympy
import torch

from scaffold import functions, stable
from scaffold.errors import DerivationError, ExpressionError
from scaffold.expression import parse_expression
from scaffold.printing import TorchPrinter, print_torch

REFERENCE = Path(__file__).parent.parent / "docs" / "reference" / "functions.md"
ENTRIES = functions.ENTRIES
USER = [e for e in ENTRIES if not e.internal]
SPELLINGS = [(e, s) for e in USER for s in e.spellings]
SYMBOLS = {name: sympy.Symbol(name, real=True) for name in ["x", *(f"a{i}" for i in range(1, 17))]}
#: Arguments where a symbol will not do: polygamma's order and Rational's parts are literal integers.
LITERAL_ARGUMENTS = {"polygamma": ["1"], "Rational": ["1", "3"], "log_argument": ["0", "1"]}
#: What the entries without a sympy class parse to, and digamma, which sympy writes polygamma(0, x).
PARSED_CLASS = {"sqrt": sympy.Pow, "cbrt": sympy.Pow, "Rational": sympy.Rational, "digamma": sympy.polygamma}
#: The named activations and clamp are the math they compute (what the rewrites then make of it).
PARSED_CLASS |= {"relu": sympy.Max, "silu": sympy.Mul, "gelu": sympy.Mul, "gelu_tanh": sympy.Mul, "mish": sympy.Mul}
PARSED_CLASS |= {"elu": sympy.Piecewise, "leaky_relu": sympy.Piecewise, "hardtanh": sympy.Min, "clamp": sympy.Max}
PARSED_CLASS |= {"hardsigmoid": sympy.Min, "hardswish": sympy.Mul}


def _call(spelling: str, entry: functions.Function, count: int) -> str:
    args = [*LITERAL_ARGUMENTS.get(entry.name, []), *SYMBOLS][:count]
    return f"{spelling}({', '.join(args)})"


def _resolve(dotted: str) -> object:
    """The object a printed name refers to, by getattr from its module: no eval."""
    head, *rest = dotted.split(".")
    obj = {"torch": torch, "math": math}.get(head) or getattr(builtins, head)
    for part in rest:
        obj = getattr(obj, part)
    return obj


def _arguments(entry: functions.Function, names: list[str]) -> list[sympy.Expr]:
    """Arguments for building an entry's expression: its literal integers, then the given symbols."""
    count = min(entry.arity)
    literal = [sympy.Integer(v) for v in LITERAL_ARGUMENTS.get(entry.name, [])][:count]
    return literal + [sympy.Symbol(n, real=True) for n in names[: count - len(literal)]]


@pytest.mark.parametrize(("entry", "spelling"), SPELLINGS, ids=[s for _, s in SPELLINGS])
def test_spelling_parses_to_its_class(entry, spelling):
    parsed = parse_expression(_call(spelling, entry, min(entry.arity)), SYMBOLS)
    assert isinstance(parsed, PARSED_CLASS.get(entry.name, entry.sympy))


@pytest.mark.parametrize(("entry", "spelling"), SPELLINGS, ids=[s for _, s in SPELLINGS])
def test_spelling_takes_exactly_its_arities(entry, spelling):
    for count in range(max(entry.arity) + 2):
        text = _call(spelling, entry, count)
        if count in entry.arity:
            parse_expression(text, SYMBOLS)
        else:
            with pytest.raises(ExpressionError, match=r"takes .* argument\(s\), got"):
                parse_expression(text, SYMBOLS)


def test_arities_are_the_sympy_classes():
    for entry in ENTRIES:
        nargs = getattr(entry.sympy, "nargs", sympy.S.Naturals0)
        assert all(n in nargs for n in entry.arity), entry.name


def test_no_two_entries_share_a_spelling_name_or_class():
    for what in (
        [s for e in ENTRIES for s in e.spellings],
        [e.name for e in ENTRIES],
        [e.sympy for e in ENTRIES if e.sympy is not None],
    ):
        assert [v for v, n in Counter(what).items() if n > 1] == []


def test_names():
    for entry in ENTRIES:
        assert entry.name == (entry.sympy.__name__ if entry.sympy is not None else entry.spellings[0])
        assert entry.internal or entry.name == entry.spellings[0]
        assert functions.by_class(entry.sympy) is entry or entry.sympy is None
        assert all(functions.by_spelling(s) is entry for s in entry.spellings)


def _point(entry: functions.Function) -> list[float]:
    """Arguments where the entry is defined: its literal integers, then -0.3 (or 0.3 above the low end of
    its domain, where its input is restricted), 0.7, ..."""
    literal = [int(v) for v in LITERAL_ARGUMENTS.get(entry.name, [])]
    first = -0.3
    if entry.domain is not None or entry.restricted:
        low = entry.domain.low if entry.domain is not None and entry.domain.low is not None else 0.0
        first = low + 0.3 if low >= 0 else 0.3
    return [*literal, first, 0.7, 0.9][: min(entry.arity)]


def _value(entry: functions.Function) -> float:
    """The entry's value at its point, as sympy evaluates it (the stable primitives by their formulas)."""
    expr = entry.sympy(*(sympy.Integer(v) if isinstance(v, int) else sympy.Float(v, 30) for v in _point(entry)))
    return float(sympy.N(stable.to_literal(expr), 30))


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.torch or e.kernel], ids=lambda e: e.name)
def test_torch_form_prints_and_exists_in_torch(entry):
    name = entry.torch or entry.kernel
    function = _resolve(name)
    args = [v if isinstance(v, int) else torch.tensor(v, dtype=torch.float64) for v in _point(entry)]
    if entry.kernel:  # kernel(grad, arg): the derivative times grad = 1
        args = [torch.tensor(1.0, dtype=torch.float64), *args]
    assert float(function(*args)) == pytest.approx(_value(entry), rel=1e-9), name
    expr = entry.sympy(*_arguments(entry, ["x", "y"]))
    if entry.kernel:  # fused with the gradient it multiplies
        expr = sympy.Symbol("grad", real=True) * expr
    text = print_torch(expr, {"x", "y", "grad"}, where="test").text
    if entry.name in PRINTED_OTHERWISE:
        assert PRINTED_OTHERWISE[entry.name] in text and name not in text, text
    else:
        assert text.startswith(name + "("), text


#: Functions printed with other kernels than their torch form: xlogy and xlog1py as a product with log or log1p
#: where x is not 0 (torch.xlogy and torch.special.xlog1py have no vectorized CPU kernel: 3 and 10 times log's
#: and log1p's time).
PRINTED_OTHERWISE = {"xlogy": "torch.log(", "xlog1py": "torch.log1p("}


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.math], ids=lambda e: e.name)
def test_math_form_prints_and_exists(entry):
    assert _resolve(entry.math)(*_point(entry)) == pytest.approx(_value(entry), rel=1e-9), entry.math
    text = print_torch(entry.sympy(*_arguments(entry, ["alpha", "beta"])), set(), where="test").text
    assert text.startswith(entry.math + "("), text


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.reciprocal_of], ids=lambda e: e.name)
def test_reciprocal_prints_as_one_over_its_reciprocal(entry):
    text = print_torch(entry.sympy(sympy.Symbol("x", real=True)), {"x"}, where="test").text
    assert text == f"(1 / {functions.by_class(entry.reciprocal_of).torch}(x))"


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.printable], ids=lambda e: e.name)
def test_printable_entries_print(entry):
    if entry.printer_method:
        assert hasattr(TorchPrinter, f"_print_{entry.sympy.__name__}"), entry.name
    text = print_torch(entry.sympy(*_arguments(entry, ["x", "y"])), {"x", "y"}, where="test").text
    assert text


def test_unprintable_entries_are_refused():
    for entry in ENTRIES:
        if entry.sympy is not None and not entry.printable:  # xexpy: lowering writes it out first
            with pytest.raises(DerivationError, match="no torch translation"):
                print_torch(entry.sympy(*_arguments(entry, ["x", "y"])), {"x", "y"}, where="test")


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.mpmath], ids=lambda e: e.name)
def test_mpmath_form_is_the_literal_formula(entry):
    point = [0.3, 0.7][: min(entry.arity)]
    expected = sympy.N(entry.sympy.literal(*map(sympy.Float, point)), 30)
    assert float(entry.mpmath(*map(mpmath.mpf, point))) == pytest.approx(float(expected), rel=1e-12)


def test_a_function_with_a_domain_is_guarded_in_branches():
    for entry in ENTRIES:
        if entry.domain is not None:
            assert entry.restricted or entry.growing, entry.name


def test_the_reference_lists_every_spelling():
    """The generated language reference's table of elementwise functions (docs/reference/functions.md, written
    by scripts/reference.py; tests/test_docs.py checks that it is up to date) names each spelling once."""
    text = REFERENCE.read_text(encoding="utf-8")
    marker = text.index("## Elementwise functions")
    rows = []
    for line in text[marker:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    listed = [m for row in rows[2:] for m in re.findall(r"`([A-Za-z_]\w*)`", row.split(" | ")[0])]
    assert sorted(listed) == sorted(functions.spellings())


def test_the_registry_depends_on_no_stage():
    """functions.py imports sympy and stable.py's classes only; stable.py imports no stage after it."""
    scaffold = Path(functions.__file__).parent
    for module, allowed in (("functions", {"stable"}), ("stable", set())):
        tree = ast.parse((scaffold / f"{module}.py").read_text(encoding="utf-8"))
        local = {
            alias.name if node.module is None else node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level > 0
            for alias in node.names
        }
        assert local <= allowed, module


@pytest.mark.parametrize("entry", [e for e in functions.ENTRIES if e.kernel], ids=lambda e: e.name)
def test_fused_kernels_work_under_forward_mode_and_vmap(entry):
    # A kernel the printer uses in backward is differentiated in forward mode by torch.func.hessian
    # (forward-over-reverse) and batched by vmap: aten's silu_backward and mish_backward can do neither.
    kernel = eval(entry.kernel, {"torch": torch})  # noqa: S307 - a name from the registry, not user text
    grad, x = torch.rand(2, 3, dtype=torch.float64), torch.rand(2, 3, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "not yet implemented the batching rule"
        torch.func.jvp(kernel, (grad, x), (grad, x))
        torch.func.vmap(kernel)(grad, x)
