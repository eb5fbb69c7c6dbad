"""Property-based search for forwards nobody wrote by hand, which scaffold must still get right.

* Random expression trees of the supported grammar must generate (or be refused with a ScaffoldError when
  they cancel to no tensor), and every generated op must pass its own gradcheck, gradgradcheck and
  reference tests: all run once, in one folder, by one pytest subprocess.
* Mutated valid forwards, odd well-formed trees and random text must generate valid Python or be refused
  with a ScaffoldError, never another exception, and quickly; the CLI exits 0 or 1 and on 1 writes nothing.

Examples are derandomized, so CI draws the same ones every run. Known bugs are pinned in KNOWN_CRASHES and
KNOWN_BROKEN_OPS: the properties report them as warnings, and their reproductions must keep failing as they
do today, so a fix makes these tests ask for the entry's removal.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import re
import sys
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scaffold import generate_op, spec_from_mapping, write_files
from scaffold.cli import main
from scaffold.errors import ScaffoldError
from scaffold.expression import FUNCTIONS

from .conftest import run_pytest

SHAPE = [3]
SCALARS = {
    "alpha": {"type": "float", "default": 0.7},
    "n": {"type": "int", "default": 3},
    "flag": {"type": "bool", "default": True},
}
CLI_SCALARS = ["--scalar", "alpha=0.7", "--scalar", "n:int=3", "--scalar", "flag=true"]
# The two library properties derive in this process: generate_op's worker process (its default) costs ~50 ms
# a call, ten times the work itself. The CLI property and test_every_template_generates go through the worker.
IN_PROCESS = {"time_limit": None} if "time_limit" in inspect.signature(generate_op).parameters else {}
MAX_SECONDS = 5.0  # for one generation of a small input: bad input must be refused quickly
EXPRESSION_EXAMPLES = 300
TEXT_EXAMPLES = 3000
CLI_EXAMPLES = 60

PROPERTY = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# --- strategies --------------------------------------------------------------------------------------

# Tensors weigh more than the rest, so that few trees use no tensor at all.
LEAVES = st.sampled_from(["x", "y", "x", "y", "alpha", "0.5", "2", "3", "1.5"])
UNARY = [
    "-({})", "({})**2", "({})**3", "exp({})", "log({})", "sqrt({})", "tanh({})", "sin({})", "cos({})",
    "erf({})", "atan({})", "log(1 + exp({}))", "1/(1 + exp(-({})))", "(exp({}) - 1)", "log(1 + ({})**2)",
    "Max({}, 0)",
]  # fmt: skip
BINARY = ["({} + {})", "({} - {})", "({} * {})", "({} / {})", "sqrt(({})**2 + ({})**2)"]


def expressions(depth: int = 3) -> st.SearchStrategy[str]:
    """Forward text: a tree of at most ``depth`` nested operations over LEAVES."""
    if depth == 0:
        return LEAVES
    sub = expressions(depth - 1)
    return st.one_of(
        LEAVES,
        st.builds(str.format, st.sampled_from(UNARY), sub),
        st.builds(str.format, st.sampled_from(BINARY), sub, sub),
    )


SEEDS = [
    "x * exp(-alpha * x)",
    "log(1 + exp(x))",
    "Piecewise((x**2/2, Abs(x) < 1), (Abs(x) - 0.5, True))",
    "Max(x, 0) + sqrt(y**2 + 1)",
    "x / (1 + exp(-alpha * x))",
    "Min(Max(x, 0), 6) * y**n",
    "Piecewise((x, flag), (-x, True)) + atan2(y, x)",
    "hypot(x, y) - log1p(x**2) * erf(y / 2)",
]
# What character edits insert: operators, brackets, quotes, names, numbers and unusual characters.
FRAGMENTS = [
    *"+-*/%^@<>=!~&|()[]{}'\"_.,:;#\\ 0123456789xyzeEaij",
    "**", "//", "==", "alpha", "True", "exp(", "Piecewise((", "lambda", "__import__", "1e400", "9" * 40,
    "ｘ", "é", "𝑥", "\x00", "\n", "\t", "\u200b",
]  # fmt: skip
# What token swaps put in place of a name, number or operator: the result mostly still parses.
TOKENS = [
    "exp", "log", "sqrt", "atan2", "hypot", "log1p", "acosh", "atanh", "erfinv", "polygamma", "Heaviside", "sign",
    "Rational", "Max", "Abs", "Piecewise", "pi", "E", "True", "False", "x", "y", "alpha", "n", "flag", "0", "1",
    "0.5", "-1", "64", "65", "1e-300", "+", "-", "*", "/", "**", "<", ">=", "==", "!=", "&", "|", "~", "and",
    "not", ",", "(", ")",
]  # fmt: skip


@st.composite
def mutated(draw) -> str:
    """A valid forward after 1 to 4 edits: a token swapped, or characters deleted, inserted or replaced."""
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 2, 3, 4]))):
        kind = draw(st.sampled_from(["swap", "delete", "insert", "replace"]))
        tokens = [m.span() for m in re.finditer(r"\w+|\*\*|[<>=!]=|\S", text)]
        if kind == "swap" and tokens:
            start, end = draw(st.sampled_from(tokens))
            text = text[:start] + draw(st.sampled_from(TOKENS)) + text[end:]
            continue
        i = draw(st.integers(0, len(text)))
        if kind == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 3)) :]
        else:
            text = text[:i] + draw(st.sampled_from(FRAGMENTS)) + text[i + (kind == "replace") :]
    return text


ODD_LEAVES = st.sampled_from(["x", "y", "alpha", "n", "flag", "True", "pi", "0", "-1", "64", "1e-300", "2.5"])
ODD_CALLS = sorted(FUNCTIONS) + ["Piecewise", "unknown"]
ODD_OPERATORS = ["+", "-", "*", "/", "**", "<", ">=", "==", "!=", "&", "|", "and", "or", "%", "//"]


def odd_trees(depth: int = 3) -> st.SearchStrategy[str]:
    """Well-formed Python over every function, operator and argument: wrong arities, conditions used as
    numbers and numbers as conditions, Piecewise, bool and int scalars."""
    if depth == 0:
        return ODD_LEAVES
    sub = odd_trees(depth - 1)
    return st.one_of(
        ODD_LEAVES,
        st.builds("{}({})".format, st.sampled_from(ODD_CALLS), sub),
        st.builds("{}({}, {})".format, st.sampled_from(ODD_CALLS), sub, sub),
        st.builds("({} {} {})".format, sub, st.sampled_from(ODD_OPERATORS), sub),
        st.builds("{}({})".format, st.sampled_from(["-", "~", "not "]), sub),
        st.builds("Piecewise(({}, {}), ({}, True))".format, sub, sub, sub),
    )


# Edited valid forwards and odd trees get past the parser; noise mostly does not.
TEXTS = st.one_of(
    mutated(),
    mutated(),
    odd_trees(),
    odd_trees(),
    st.lists(st.sampled_from(FRAGMENTS + TOKENS), max_size=12).map("".join),
    st.text(max_size=30),
)

# --- known bugs ------------------------------------------------------------------------------------

# generate_op raises something other than ScaffoldError: name -> (reproductions, exception types, message).
KNOWN_CRASHES = {
    # A float or int scalar used as a condition passes the parser; domain inference substitutes its default.
    "numeric_scalar_as_condition": (
        [
            "Piecewise((x, alpha), (1, True))",
            "Piecewise((x, n), (1, True))",
            "Piecewise((x, (x > 0) | alpha), (1, True))",
        ],
        (TypeError,),
        r"must be a Boolean|expecting bool or Boolean",
    ),
    # A non-real or nan constant (log(-1), asin(2), erfinv(2), atan2(0, 0)) in a comparison, Max/Min or Heaviside:
    # sympy raises while the parser builds the expression.
    "non_real_or_nan_constant": (
        [
            "Piecewise((x, log(-1) < x), (0, True))",
            "Piecewise((x, atan2(0, 0) < x), (0, True))",
            "Max(x, log(-1))",
            "x * Min(asin(2), 1)",
            "x * Max(2, erfinv(2))",
            "x * Heaviside(log(-1))",
        ],
        (TypeError, ValueError),
        r"Invalid (NaN )?comparison|is not comparable|defined only for Real Values|defined only for -1 <= x <= 1",
    ),
    # A power of a non-zero base below float's range: the size check takes log10(float(base)) = log10(0.0).
    "power_of_a_tiny_base": (["x + (1e-200**2)**2"], (ValueError,), r"math domain error"),
    # A kink of Max/Min over a division by a Max: domain inference's _affine gets zoo * x and float(zoo) fails.
    "kink_through_division_by_zero": (
        ["Max(x / Max(x, 0), 0)", "Min(x / Max(y, 0), 1)"],
        (TypeError,),
        r"Cannot convert complex to float",
    ),
}

# Ops scaffold generates whose own generated tests fail: name -> (forward, tensors, scalars).
KNOWN_BROKEN_OPS = {
    # Domains: when no interval it tries makes the forward finite and real, scaffold generates anyway.
    # A scalar default outside the forward's domain (the same constant, sqrt(-1), is refused): ValueError.
    "known_scalar_default": ("x * sqrt(alpha)", ["x"], {"alpha": {"type": "float", "default": -1.0}}),
    # A constant sympy leaves unevaluated although it is not real: math.atanh(2) raises.
    "known_non_real_constant": ("x * atanh(2)", ["x"], {}),
    # Real only for x in (pi/2, 3*pi/2), which no candidate interval finds: NaN.
    "known_domain_not_found": ("log(-cos(x))", ["x"], {}),
    # Real for no x at all, yet not refused: NaN.
    "known_never_real": ("sqrt(sin(x) - 2)", ["x"], {}),
    # The numeric check of the domains uses mpmath, which never overflows; float64 does: inf.
    "known_overflow": ("exp(1000 * x)", ["x"], {}),
    # A tensor is accepted as a condition: torch.where(x, ...) and ~x on a float tensor raise.
    "known_tensor_as_condition": ("Piecewise((x, x), (1, True))", ["x"], {}),
    "known_tensor_not_as_condition": ("Piecewise((x, ~x), (1, True))", ["x"], {}),
}


def _known_crash(exc: BaseException) -> str | None:
    """The KNOWN_CRASHES entry ``exc`` matches, if any: raised here, or in generate_op's worker process and
    re-raised as "RuntimeError: scaffold failed while ...: TypeError: ...; please report this"."""
    text = f"{type(exc).__name__}: {exc}"
    for key, (_, kinds, message) in KNOWN_CRASHES.items():
        names = "|".join(kind.__name__ for kind in kinds)
        if re.search(rf"\b({names}): \s*.*({message})", text, flags=re.DOTALL):
            return key
    return None


def _report(what: str, found: dict[str, list[str]]) -> None:
    if any(found.values()):
        warnings.warn(f"{what}: {found}", stacklevel=2)


# --- helpers ---------------------------------------------------------------------------------------


def _tensors_in(forward: str) -> list[str]:
    return [name for name in ("x", "y") if re.search(rf"\b{name}\b", forward)]


def _mapping(name: str, forward: str, tensors: list[str], scalars: dict) -> dict:
    return {"name": name, "forward": forward, "tensors": {t: {"shape": SHAPE} for t in tensors}, "scalars": scalars}


def _generate(mapping: dict, crashes: dict[str, list[str]], durations: dict[str, float]) -> dict[str, str] | None:
    """generate_op's files, None on a known crash; a ScaffoldError is re-raised once its message is checked."""
    start = time.perf_counter()
    try:
        return generate_op(spec_from_mapping(mapping, source="prop.toml"), **IN_PROCESS)
    except ScaffoldError as exc:
        assert isinstance(exc.message, str) and exc.message.strip(), f"empty message: {exc!r}"
        assert "Traceback" not in str(exc), str(exc)
        raise
    except Exception as exc:
        known = _known_crash(exc)
        if known is None:
            raise
        crashes.setdefault(known, []).append(mapping["forward"])
        return None
    finally:
        durations[mapping["forward"]] = time.perf_counter() - start


def _assert_fast(durations: dict[str, float]) -> None:
    slowest = max(durations, key=durations.get)
    assert durations[slowest] < MAX_SECONDS, f"generating {slowest!r} took {durations[slowest]:.1f} s"


def _inputs_not_finite(directory: Path, name: str) -> bool:
    """Whether the forward or its gradient is not finite (or raises) at the inputs its generated test draws.

    Such an op fails its tests because scaffold chose inputs where the forward is undefined (the domain bugs
    of KNOWN_BROKEN_OPS), not because a derivative is wrong.
    """
    import torch

    sys.path.insert(0, str(directory))
    try:
        module = importlib.import_module(f"test_{name}")
        inputs = module.make_inputs("cpu")
        try:
            out = module.reference(*inputs, *module.SCALARS)
            grads = torch.autograd.grad(out.sum(), inputs)
        except (ValueError, OverflowError, ZeroDivisionError):  # math.sqrt of a negative scalar, say
            return True
        return not all(torch.isfinite(t).all() for t in (out, *grads))
    finally:
        sys.path.remove(str(directory))
        for module_name in (name, f"test_{name}"):
            sys.modules.pop(module_name, None)


# --- 1. random expression trees -------------------------------------------------------------------

# Why a tree of the grammar may be refused: it cancels to something without a tensor (x - x), or to 1/0.
ALLOWED_REFUSALS = re.compile(r"does not depend on any tensor|declared but not used|division by zero|infinite")


def test_random_expressions_generate_and_pass_their_own_tests(tmp_path):
    ops: dict[str, str] = {}  # op name -> forward
    refused: dict[str, str] = {}  # forward -> message
    crashes: dict[str, list[str]] = {}
    durations: dict[str, float] = {}

    @settings(PROPERTY, max_examples=EXPRESSION_EXAMPLES)
    @given(expressions())
    def generate_or_refuse(forward):
        tensors = _tensors_in(forward)
        assume(tensors)
        if forward in refused or forward in ops.values():
            return
        name = f"prop_{len(ops)}"
        scalars = {"alpha": SCALARS["alpha"]} if re.search(r"\balpha\b", forward) else {}
        try:
            files = _generate(_mapping(name, forward, tensors, scalars), crashes, durations)
        except ScaffoldError as exc:
            assert ALLOWED_REFUSALS.search(exc.message), f"{forward!r} refused: {exc}"
            refused[forward] = exc.message
            return
        if files is not None:
            assert sorted(files) == [f"{name}.py", f"test_{name}.py"]
            write_files(files, tmp_path)
            ops[name] = forward

    generate_or_refuse()
    _assert_fast(durations)
    assert len(ops) >= 2 * len(refused), f"most trees should generate; refused: {refused}"
    _report("known crashes (KNOWN_CRASHES) hit", crashes)

    for name, (forward, tensors, scalars) in KNOWN_BROKEN_OPS.items():
        write_files(generate_op(spec_from_mapping(_mapping(name, forward, tensors, scalars), source="known")), tmp_path)
    result = run_pytest(tmp_path, "-k", "gradcheck or reference", "-rf")
    output = result.stdout[-6000:] + result.stderr[-2000:]
    assert re.search(r"\d+ passed", result.stdout), output
    failed = set(re.findall(r"^FAILED test_(\w+?)\.py::", result.stdout, flags=re.MULTILINE))

    fixed = [forward for name, (forward, *_) in KNOWN_BROKEN_OPS.items() if name not in failed]
    assert not fixed, f"these pass their tests now: remove them from KNOWN_BROKEN_OPS: {fixed}"
    failing = sorted(failed & set(ops))
    # An op whose forward is not finite at its own test inputs has the domain bugs of KNOWN_BROKEN_OPS.
    domain_bugs = [name for name in failing if _inputs_not_finite(tmp_path, name)]
    wrong = [f"{name}: {ops[name]}" for name in failing if name not in domain_bugs]
    assert not wrong, "generated ops fail their own tests:\n" + "\n".join(wrong) + "\n" + output
    _report("domain bugs (KNOWN_BROKEN_OPS) hit", {"not finite at the test inputs": [ops[n] for n in domain_bugs]})


# --- 2. mutated and random text -------------------------------------------------------------------


def test_random_text_generates_or_is_refused_quickly():
    crashes: dict[str, list[str]] = {}
    durations: dict[str, float] = {}

    @settings(PROPERTY, max_examples=TEXT_EXAMPLES)
    @given(TEXTS)
    def generate_or_refuse(forward):
        # Tensors: the ones the text names, else x; scalars: all three kinds, used or not.
        mapping = _mapping("op", forward, _tensors_in(forward) or ["x"], SCALARS)
        try:
            files = _generate(mapping, crashes, durations)
        except ScaffoldError:
            return
        for path, text in (files or {}).items():
            compile(text, path, "exec")  # the generated files are valid Python

    generate_or_refuse()
    _assert_fast(durations)
    _report("known crashes (KNOWN_CRASHES) hit", crashes)


@pytest.mark.parametrize(
    "forward", [f for forwards, *_ in KNOWN_CRASHES.values() for f in forwards], ids=lambda f: f[:40]
)
def test_known_crashes_still_crash(forward):
    """Pinned bugs: generate_op raises something other than ScaffoldError. Fixed? Remove from KNOWN_CRASHES."""
    mapping = _mapping("op", forward, _tensors_in(forward), SCALARS)
    with pytest.raises(Exception) as info:
        generate_op(spec_from_mapping(mapping, source="known.toml"))
    assert _known_crash(info.value) is not None, repr(info.value)


def test_cli_exits_0_or_1_and_writes_nothing_on_error(tmp_path, capsys):
    counter = itertools.count()
    crashes: dict[str, list[str]] = {}

    @settings(PROPERTY, max_examples=CLI_EXAMPLES)
    @given(st.one_of(st.sampled_from(SEEDS), mutated(), TEXTS))  # the seeds: some texts generate
    def run_cli(forward):
        out = tmp_path / f"out{next(counter)}"
        # argparse reads a value that starts with '-' (and has no space) as an option: see
        # test_cli_forward_starting_with_minus. After '=' it is a value.
        flag = [f"--forward={forward}"] if forward.startswith("-") else ["--forward", forward]
        declared = [a for t in _tensors_in(forward) or ["x"] for a in ("--tensor", t)] + CLI_SCALARS
        capsys.readouterr()
        try:
            code = main(["new", "op", "m", *flag, *declared, "-o", str(out)])
        except Exception as exc:
            if _known_crash(exc) is None:
                raise
            crashes.setdefault(_known_crash(exc), []).append(forward)
            return
        captured = capsys.readouterr()
        assert code in (0, 1), code
        if code == 0:
            assert sorted(p.name for p in out.iterdir()) == ["m.py", "test_m.py"]
        else:
            assert not out.exists(), f"{forward!r} was refused but wrote {list(out.iterdir())}"
            assert captured.err.startswith("scaffold: error:"), captured.err
            assert "Traceback" not in captured.err, captured.err

    run_cli()
    _report("known crashes (KNOWN_CRASHES) hit", crashes)


@pytest.mark.xfail(raises=SystemExit, strict=True, reason="argparse takes '-x*y' for an option and exits 2")
def test_cli_forward_starting_with_minus(tmp_path):
    assert main(["new", "op", "m", "--forward", "-x*y", "--tensor", "x", "--tensor", "y", "-o", str(tmp_path)]) == 0


def test_every_template_generates():
    """Each template of the trees, on x (and y), generates: a typo in one would only ever be refused."""
    for template in UNARY + BINARY:
        forward = template.format(*["x", "y"][: template.count("{}")])
        mapping = _mapping("op", forward, _tensors_in(forward), {})
        assert sorted(generate_op(spec_from_mapping(mapping, source="t"))) == ["op.py", "test_op.py"], forward
