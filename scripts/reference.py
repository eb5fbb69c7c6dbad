"""Writes docs/reference/functions.md, the spec language reference, from scaffold's own registries.

Every function the parser takes (``expression.FUNCTION_NAMES``: the registry of :mod:`scaffold.functions`,
``structural.SPELLINGS`` and the parser's own ``Piecewise`` and ``where``) and every key of a spec file gets
a row. The torch form, the derivative and what backward saves are not written by hand: each row's example is
compiled by scaffold (``compile_op``) and the row shows what the plan makes of it. A spelling or key this
script has no example or description for stops it with an error naming it, so the page cannot leave one out.

    python scripts/reference.py           # write docs/reference/functions.md
    python scripts/reference.py --check   # exit 1 if the checked-in page is not what this writes
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from scaffold import compile_op, functions, spec, structural
from scaffold.expression import CONSTANTS, FUNCTION_NAMES
from scaffold.spec import spec_from_mapping

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "functions.md"

#: Example calls where the registry's arity alone does not make one.
CALLS = {
    "polygamma": "polygamma(1, x)",
    "Rational": "Rational(1, 3)*x",
    "clamp": "clamp(x, min=-1.0, max=1.0)",
}

X = {"x": {"shape": [3, 4]}}
XY = {"x": {"shape": [3, 4]}, "y": {"shape": [3, 4]}}
T = {"x": {"shape": [3, 4]}, "t": {"shape": [3], "dtype": "int64", "domain": [0, 3]}}

#: The parser's structural calls, its own forms and its syntax: (form, example, tensors, torch equivalent).
STRUCTURAL = {
    "sum": ("sum(e, dim=D, keepdim=False)", "sum(x, dim=-1)", X, "`torch.sum`; D omitted: every dimension"),
    "mean": ("mean(e, dim=D, keepdim=False)", "mean(x, dim=-1)", X, "`torch.mean`"),
    "logsumexp": ("logsumexp(e, dim=D, keepdim=False)", "logsumexp(x, dim=-1)", X, "`torch.logsumexp`"),
    "amax": ("amax(e, dim=D, keepdim=False)", "amax(x, dim=-1)", X, "`torch.amax`"),
    "amin": ("amin(e, dim=D, keepdim=False)", "amin(x, dim=-1)", X, "`torch.amin`"),
    "softmax": ("softmax(e, dim=D)", "softmax(x, dim=-1)", X, "`torch.softmax`"),
    "log_softmax": ("log_softmax(e, dim=D)", "log_softmax(x, dim=-1)", X, "`torch.log_softmax`"),
    "cumsum": ("cumsum(e, dim=D)", "cumsum(x, dim=-1)", X, "`torch.cumsum`; D required"),
    "cumprod": ("cumprod(e, dim=D)", "cumprod(x, dim=-1)", X, "`torch.cumprod`; D required"),
    "transpose": ("transpose(e, d0, d1)", "transpose(x, 0, 1)", X, "`torch.transpose`"),
    "reshape": ("reshape(e, (d0, d1, ...))", "reshape(x, (4, 3))", X, "`torch.reshape` (one size may be -1)"),
    "unsqueeze": ("unsqueeze(e, d)", "unsqueeze(x, 0)", X, "`torch.unsqueeze`"),
    "squeeze": ("squeeze(e, d)", "squeeze(x, 0)", {"x": {"shape": [1, 4]}}, "`torch.squeeze`"),
    "flatten": ("flatten(e, start_dim=0, end_dim=-1)", "flatten(x)", X, "`torch.flatten`"),
    "cat": ("cat((a, b, ...), dim=D)", "cat((x, y), dim=-1)", XY, "`torch.cat`"),
    "stack": ("stack((a, b, ...), dim=D)", "stack((x, y), dim=0)", XY, "`torch.stack`"),
    "gather": (
        "gather(e, dim=D, index=t)",
        "gather(x, dim=-1, index=unsqueeze(t, -1))",
        T,
        "`torch.gather`: t int64 indices; no gradient for t",
    ),
    "one_hot": (
        "one_hot(t, num_classes=C)",
        "one_hot(t, num_classes=4)*x",
        T,
        "`torch.nn.functional.one_hot`, in the floating inputs' dtype; no gradient",
    ),
    "argmax": (
        "argmax(e, dim=D, keepdim=False)",
        "one_hot(argmax(x, dim=-1), num_classes=4)*x",
        X,
        "`torch.argmax`: int64 indices (the first on ties), no gradient",
    ),
    "argmin": (
        "argmin(e, dim=D, keepdim=False)",
        "one_hot(argmin(x, dim=-1), num_classes=4)*x",
        X,
        "`torch.argmin`: int64 indices (the first on ties), no gradient",
    ),
    "Piecewise": (
        "Piecewise((value, condition), ..., (otherwise, True))",
        "Piecewise((x, x > 0), (0, True))",
        X,
        "`torch.where`, nested",
    ),
    "where": ("where(condition, value, otherwise)", "where(x > 0, x, 0)", X, "`torch.where`"),
    "@": ("a @ b", "x @ y", {"x": {"shape": [3, 4]}, "y": {"shape": [4, 5]}}, "`torch.matmul`"),
    "[...]": ("e[..., a:b]", "x[..., 1:3]", X, "indexing with slices: integer bounds, step 1, one `...`"),
}

#: Every key of a spec file, with what it holds (the README's spec section says more).
KEYS = {
    "top": {
        "name": "the op's name (an identifier): the module, the functional and, camel-cased, the classes",
        "forward": "the math, one expression or several lines of steps (`name = expression`)",
        "doc": "optional: a sentence for the module's docstring",
        "fuse": "optional, default false: run the math through torch.compile, or Triton row kernels",
        "policy": 'optional: what backward\'s plan favours, "memory" (default) or "time"',
        "target": 'optional: "function" (default) or "custom_op", a torch.library custom op',
        "namespace": "optional, custom_op only: NAMESPACE::NAME (default: the project's package, else scaffold)",
        "outputs": "optional: the forward's steps the op returns, in order",
        "sizes": "optional table: size names and their example values, usable in shapes",
        "tensors": "a table per tensor argument, in argument order (keys below)",
        "scalars": "a table per non-tensor argument, after the tensors (keys below)",
        "gradients": 'optional table: custom gradients, `x = "grad"`, over the forward\'s names and `grad`',
    },
    "tensors.NAME": {
        "shape": "example shape for the generated tests (default [4, 5]; [] for learnables); entries may be sizes",
        "domain": "interval test inputs are drawn from (inferred from the expression if absent)",
        "avoid": "kinks test inputs keep away from (inferred if absent)",
        "learnable": "true: an nn.Parameter of the Module",
        "init": 'a learnable tensor\'s initial value: a number or a scheme ("ones", "linear", ...)',
        "dtype": '"int64" (indices) or "bool" (a mask): no gradient, passed through unchanged',
    },
    "scalars.NAME": {
        "type": "float, int or bool",
        "default": "its default, also the value the generated tests use",
    },
}
_KEY_SETS = {"top": spec._TOP_KEYS, "tensors.NAME": spec._TENSOR_KEYS, "scalars.NAME": spec._SCALAR_KEYS}


def names() -> set[str]:
    """Every name this page documents: each function spelling and form (cheap: nothing is compiled)."""
    return {s for e in functions.ENTRIES for s in e.spellings} | set(STRUCTURAL) - {"@", "[...]"}


def _check_complete() -> None:
    missing = sorted(FUNCTION_NAMES - names())
    if missing:
        sys.exit(f"scripts/reference.py: no example for {', '.join(missing)}: add each to STRUCTURAL or CALLS")
    for table, keys in _KEY_SETS.items():
        if set(KEYS[table]) != keys:
            sys.exit(f"scripts/reference.py: KEYS[{table!r}] must describe exactly {sorted(keys)}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{_cell(text)}`" if text else ""


def _compile(forward: str, tensors: dict) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "zero everywhere" for steps: the table says so
        return compile_op(spec_from_mapping({"name": "f", "forward": forward, "tensors": tensors}, source="f"))


def _inputs(op: object) -> str:
    parts = []
    for d in op.domains:
        avoid = f", away from {', '.join(f'{a:g}' for a in d.avoid)}" if d.avoid else ""
        parts.append(_cell(f"{d.name} in [{d.low:g}, {d.high:g}] ({d.reason}{avoid})"))
    return "; ".join(parts)


def _saves(plan: object) -> str:
    return "; ".join(_cell(note) for note in plan.saved_notes) or "nothing"


def _call(entry: functions.Function) -> tuple[str, dict]:
    if entry.name in CALLS:
        return CALLS[entry.name], X
    arguments = "xyz"[: min(entry.arity)]
    tensors = {a: {"shape": [3, 4]} for a in arguments}
    return f"{entry.spellings[0]}({', '.join(arguments)})", tensors


def _torch(entry: functions.Function) -> str:
    if entry.activation:
        name = "torch.clamp" if entry.activation == "clamp" else f"torch.nn.functional.{entry.activation}"
        return f"`{name}`, as the math it computes"
    if entry.reciprocal_of is not None:
        return f"1 / `{functions.by_class(entry.reciprocal_of).torch}`"
    if entry.torch:
        return f"`{entry.torch}`"
    return "(see as generated)"


def _function_row(entry: functions.Function) -> str:
    call, tensors = _call(entry)
    op = _compile(call, tensors)
    plan = op.plan
    spellings = " ".join(f"`{s}`" for s in entry.spellings)
    kink = entry.kink.value if entry.kink else ("steps: derivative 0" if entry.step else "")
    derivative = "; ".join(f"{_cell(what)} = {_code(formula)}" for what, formula in plan.elementwise_docs)
    return (
        f"| {spellings} | {_code(call)} | {_torch(entry)} | {_code('; '.join(plan.forward))} | {_inputs(op)} | "
        f"{kink} | {derivative} | {_saves(plan)} |"
    )


def _node(spelling: str) -> str:
    """The program node kind a form becomes: a structural class (and its family), or elementwise."""
    named = {
        **structural.REDUCTIONS,
        **structural.ALONG_ONE_DIM,
        **structural.RESHAPES,
        **structural.ARG_INDICES,
        "transpose": structural.Transposed,
        "cat": structural.Concatenated,
        "stack": structural.Stacked,
        "one_hot": structural.OneHot,
        "gather": structural.Gather,
        "@": structural.MatrixProduct,
        "[...]": structural.Sliced,
    }
    cls = named.get(spelling)
    if cls is None:
        return "elementwise"
    family = cls.__mro__[1].__name__
    return f"`{cls.__name__}`" + ("" if family == "Structural" else f" ({family})")


def _structural_row(spelling: str) -> str:
    form, call, tensors, torch = STRUCTURAL[spelling]
    plan = _compile(call, tensors).plan
    rules = "; ".join(_cell(r) for r in plan.rule_docs) or "; ".join(
        f"{_cell(what)} = {_code(formula)}" for what, formula in plan.elementwise_docs
    )
    return f"| {_code(form)} | {_code(call)} | {_node(spelling)} | {torch} | {rules} | {_saves(plan)} |"


HEADER = """\
# Spec language reference

<!-- Generated by scripts/reference.py from scaffold/functions.py, scaffold/structural.py and
expression.FUNCTION_NAMES: do not edit; run `python scripts/reference.py`. -->

Every name a forward may call, and every key of a spec file. The columns "as generated", "derivative" and
"saved for backward" are what scaffold itself makes of the example in the second column (a tensor x, y, z
of shape (3, 4), policy "memory"), so they are true of the release that wrote this page; "test inputs" is
the interval the generated tests draw each tensor from, inferred from where the math is defined, and the
kinks they keep away from. In a derivative,
`Heaviside(u, 0)` is a step that is 0 at u = 0 (PyTorch's convention: `relu'(0) = 0`), and `out` is the
op's output, which backward reads where it is cheaper than the input.

A forward is a program of nodes: the elementwise functions below are elementwise nodes (sympy expressions,
differentiated symbolically); the forms of the second table are nodes of their own (the "node" column:
their class in `scaffold/structural.py`), each with its own backward rule.

Besides the functions: numbers, `+ - * / **`, comparisons, `& | ~` (or `and`, `or`, `not`) in conditions,
`True`, `False` and the constants {constants}.
"""


def render() -> str:
    """The page's text."""
    _check_complete()
    lines = [HEADER.format(constants=", ".join(f"`{c}`" for c in CONSTANTS)), "## Elementwise functions", ""]
    lines.append(
        "| Spellings | Example | torch | As generated | Test inputs | Kinks | Derivative | Saved for backward |"
    )
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    lines += [_function_row(entry) for entry in functions.ENTRIES if entry.spellings]
    lines += ["", "## Reductions, softmax, products, shapes, indices and cases", ""]
    lines.append("| Form | Example | Node | torch | Derivative | Saved for backward |")
    lines.append("| --- | --- | --- | --- | --- | --- |")
    lines += [_structural_row(spelling) for spelling in STRUCTURAL]
    for table, described in KEYS.items():
        title = "top level" if table == "top" else f"`[{table}]`"
        lines += ["", f"## Spec keys: {title}", "", "| Key | Holds |", "| --- | --- |"]
        lines += [f"| `{key}` | {_cell(text)} |" for key, text in described.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not up to date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python scripts/reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
