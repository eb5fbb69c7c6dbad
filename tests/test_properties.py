"""Property-based search for forwards nobody wrote by hand, which scaffold must still get right.

* Random expression trees of the supported grammar must generate (or be refused with a ScaffoldError when
  they cancel to no tensor), and every generated op must pass its own gradcheck, gradgradcheck and
  reference tests: all run once, in one folder, by one pytest subprocess.
* Mutated valid forwards, odd well-formed trees and random text must generate valid Python or be refused
  with a ScaffoldError, never another exception, and quickly; the CLI exits 0 or 1 and on 1 writes nothing.

Examples are derandomized, so CI draws the same ones every run. What the search found (crashes, ops tested
where they are not defined) is fixed and kept as regression cases: FOUND must be refused cleanly, FOUND_OPS
must pass their own tests.
"""

from __future__ import annotations

import inspect
import itertools
import re
import time
import warnings

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scaffold import functions, generate_op, spec_from_mapping, write_files
from scaffold.cli import main
from scaffold.errors import ScaffoldError, ScaffoldWarning

from .conftest import examples, run_pytest

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
EXPRESSION_EXAMPLES = examples(80, 300)
TEXT_EXAMPLES = examples(1000, 3000)
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
ODD_CALLS = sorted(functions.spellings()) + ["Piecewise", "unknown"]
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

# --- bugs the search found, now fixed ---------------------------------------------------------------

# Inputs that once crashed generate_op (an exception other than ScaffoldError) or generated ops whose own
# tests failed; each must now be refused with a clear message: (forward, scalars).
FOUND = [
    # a numeric scalar or a tensor used as a condition
    ("Piecewise((x, alpha), (1, True))", SCALARS),
    ("Piecewise((x, n), (1, True))", SCALARS),
    ("Piecewise((x, (x > 0) | alpha), (1, True))", SCALARS),
    ("Piecewise((x, x), (1, True))", {}),
    ("Piecewise((x, ~x), (1, True))", {}),
    # constants that are not real, or nan, where sympy compares them
    ("Piecewise((x, log(-1) < x), (0, True))", {}),
    ("Piecewise((x, atan2(0, 0) < x), (0, True))", {}),
    ("Max(x, log(-1))", {}),
    ("x * Min(asin(2), 1)", {}),
    ("x * Max(2, erfinv(2))", {}),
    ("x * Heaviside(log(-1))", {}),
    # a power of a base below float's range
    ("x + (1e-200**2)**2", {}),
    # constants sympy leaves unevaluated, or scalar defaults, outside a function's domain
    ("x * atanh(2)", {}),
    ("x * sqrt(alpha)", {"alpha": {"type": "float", "default": -1.0}}),
    # never real, or real only where no tried interval is
    ("sqrt(sin(x) - 2)", {}),
    ("log(-cos(x))", {}),
]
# Ops that once generated tests drawing inputs where the forward is not finite; now they pass.
FOUND_OPS = {
    "found_overflow": ("exp(1000 * x)", ["x"], {}),  # mpmath never overflows; float64 does
    "found_nested_log": ("log(log(log(x)))", ["x"], {}),  # needs x > e
    "found_pole": ("log(3 / (x - 3))", ["x"], {}),  # needs x > 3
    "found_kink_through_division": ("Max(x / Max(x, 0), 0)", ["x"], {}),
    "found_product_in_log": ("log(cos(x * y))", ["x", "y"], {}),  # both small together
}


# --- helpers ---------------------------------------------------------------------------------------


def _tensors_in(forward: str) -> list[str]:
    return [name for name in ("x", "y") if re.search(rf"\b{name}\b", forward)]


def _mapping(name: str, forward: str, tensors: list[str], scalars: dict) -> dict:
    return {"name": name, "forward": forward, "tensors": {t: {"shape": SHAPE} for t in tensors}, "scalars": scalars}


def _generate(mapping: dict, durations: dict[str, float]) -> dict[str, str]:
    """generate_op's files; a ScaffoldError is re-raised once its message is checked."""
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():  # every scalar is declared, used by the tree or not
            warnings.filterwarnings("ignore", "prop.toml: forward: the scalar argument", ScaffoldWarning)
            return generate_op(spec_from_mapping(mapping, source="prop.toml"), **IN_PROCESS)
    except ScaffoldError as exc:
        assert isinstance(exc.message, str) and exc.message.strip(), f"empty message: {exc!r}"
        assert "Traceback" not in str(exc), str(exc)
        raise
    finally:
        durations[mapping["forward"]] = time.perf_counter() - start


def _assert_fast(durations: dict[str, float]) -> None:
    slowest = max(durations, key=durations.get)
    assert durations[slowest] < MAX_SECONDS, f"generating {slowest!r} took {durations[slowest]:.1f} s"


# --- 1. random expression trees -------------------------------------------------------------------

# Why a tree of the grammar may be refused: it cancels to something without a tensor (x - x), or to 1/0.
# Or it is nowhere real, or real only where no tried test interval is (log(x - exp(x))).
ALLOWED_REFUSALS = re.compile(
    r"does not depend on any tensor|declared but not used|division by zero|infinite|no test inputs were found"
)


def test_random_expressions_generate_and_pass_their_own_tests(tmp_path):
    ops: dict[str, str] = {}  # op name -> forward
    refused: dict[str, str] = {}  # forward -> message
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
            files = _generate(_mapping(name, forward, tensors, scalars), durations)
        except ScaffoldError as exc:
            assert ALLOWED_REFUSALS.search(exc.message), f"{forward!r} refused: {exc}"
            refused[forward] = exc.message
            return
        assert sorted(files) == ["_scaffold_runtime.py", f"{name}.py", f"test_{name}.py"]
        write_files(files, tmp_path)
        ops[name] = forward

    generate_or_refuse()
    _assert_fast(durations)
    assert len(ops) >= 2 * len(refused), f"most trees should generate; refused: {refused}"
    for name, (forward, tensors, scalars) in FOUND_OPS.items():
        write_files(generate_op(spec_from_mapping(_mapping(name, forward, tensors, scalars), source="found")), tmp_path)
        ops[name] = forward
    result = run_pytest(tmp_path, "-k", "gradcheck or reference", "-rf")
    output = result.stdout[-6000:] + result.stderr[-2000:]
    failed = sorted(set(re.findall(r"^FAILED test_(\w+?)\.py::", result.stdout, flags=re.MULTILINE)))
    wrong = [f"{name}: {ops.get(name)}" for name in failed]
    assert result.returncode == 0 and not wrong, "generated ops fail their own tests:\n" + "\n".join(wrong) + output


# --- 2. mutated and random text -------------------------------------------------------------------


def test_random_text_generates_or_is_refused_quickly():
    durations: dict[str, float] = {}

    @settings(PROPERTY, max_examples=TEXT_EXAMPLES)
    @given(TEXTS)
    def generate_or_refuse(forward):
        # Tensors: the ones the text names, else x; scalars: all three kinds, used or not.
        mapping = _mapping("op", forward, _tensors_in(forward) or ["x"], SCALARS)
        try:
            files = _generate(mapping, durations)
        except ScaffoldError:
            return
        for path, text in files.items():
            compile(text, path, "exec")  # the generated files are valid Python

    generate_or_refuse()
    _assert_fast(durations)


@pytest.mark.parametrize(("forward", "scalars"), FOUND, ids=[f for f, _ in FOUND])
def test_found_inputs_are_refused_cleanly(forward, scalars):
    mapping = _mapping("op", forward, _tensors_in(forward), scalars)
    with pytest.raises(ScaffoldError) as info:
        generate_op(spec_from_mapping(mapping, source="found.toml"))
    assert info.value.message.strip() and "Traceback" not in str(info.value)


def test_cli_exits_0_or_1_and_writes_nothing_on_error(tmp_path, capsys):
    counter = itertools.count()

    @settings(PROPERTY, max_examples=CLI_EXAMPLES)
    @given(st.one_of(st.sampled_from(SEEDS), mutated(), TEXTS))  # the seeds: some texts generate
    def run_cli(forward):
        out = tmp_path / f"out{next(counter)}"
        flag = ["--forward", forward]
        declared = [a for t in _tensors_in(forward) or ["x"] for a in ("--tensor", t)] + CLI_SCALARS
        capsys.readouterr()
        code = main(["new", "op", "m", *flag, *declared, "-o", str(out)])
        captured = capsys.readouterr()
        assert code in (0, 1), code
        if code == 0:
            assert sorted(p.name for p in out.iterdir()) == ["_scaffold_runtime.py", "m.py", "test_m.py"]
        else:
            assert not out.exists(), f"{forward!r} was refused but wrote {list(out.iterdir())}"
            assert captured.err.startswith("scaffold: error:"), captured.err
            assert "Traceback" not in captured.err, captured.err

    run_cli()


def test_cli_forward_starting_with_minus(tmp_path):
    # argparse alone would take '-x*y' for an option and exit 2
    assert main(["new", "op", "m", "--forward", "-x*y", "--tensor", "x", "--tensor", "y", "-o", str(tmp_path)]) == 0


def test_every_template_generates():
    """Each template of the trees, on x (and y), generates: a typo in one would only ever be refused."""
    for template in UNARY + BINARY:
        forward = template.format(*["x", "y"][: template.count("{}")])
        mapping = _mapping("op", forward, _tensors_in(forward), {})
        assert sorted(generate_op(spec_from_mapping(mapping, source="t"))) == [
            "_scaffold_runtime.py",
            "op.py",
            "test_op.py",
        ], forward
