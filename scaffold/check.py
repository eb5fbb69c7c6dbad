"""``scaffold check``: hold a hand-written ``torch.autograd.Function`` against the math of a spec.

    spec = load_spec("swish.toml")
    report = check_function(spec, "my_ops.py:SwishFunction")    # or "my_ops.act:Swish", a function, a Module
    print(format_report(report)); sys.exit(report.exit_code())

The reference is what scaffold derives from the spec: the generated test file's :class:`~scaffold.testing.OpTests`
(the forward as written in plain torch, differentiated by autograd; the inputs drawn in their domains), with the
user's callable put in place of the generated op. Every check of a generated op that means something for any
Function runs from there (values, gradients, gradcheck, a second shape, float32 at extreme inputs,
torch.compile, torch.func); the rules a hand-written Function can break and a generated one cannot (ctx
attributes, ``save_for_backward`` twice, the number of values backward returns, needs_input_grad, a second
backward, inputs changed in place) are checked here. Each check gives a :class:`Verdict` in the words of the
Function rules; a failure of a check that depends on the inputs' shapes comes with the smallest shapes and
values that show it.

Importing the user's file runs it: that is the point of the command, and the one place scaffold runs code it
did not write. The ``--call`` text is not run: it is parsed and read as a call of names (:func:`caller`).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import itertools
import os
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import tomlwriter
from ._version import __version__
from .errors import ScaffoldError
from .spec import OpSpec, spec_from_mapping, spec_to_mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from .function_checks import FunctionChecks

#: Every check, by id, with what it holds the Function to; in the order they run.
CHECKS = {
    "forward": "forward's values match the math",
    "gradients": "every gradient matches the derived one, for a random upstream gradient",
    "gradcheck": "backward matches finite differences (torch.autograd.gradcheck, float64)",
    "gradgradcheck": "backward is differentiable, and its derivative matches finite differences",
    "needs_input_grad": "backward returns None where a gradient is not needed, and does no more work",
    "ctx": "tensors reach backward through one save_for_backward; backward returns one value per argument",
    "retain_graph": "a second backward (retain_graph=True) gives the first one's gradients",
    "inputs_unchanged": "forward and backward leave the inputs and the upstream gradient as they were",
    "second_shape": "values and gradients at other ranks and sizes (a batch dimension more)",
    "extreme_inputs": "float32 agrees with float64 at large and tiny inputs inside the domain",
    "compile": "torch.compile of it gives eager's values and gradients",
    "torch_func": "torch.func.vmap, grad and jvp give the math's values and gradients",
}
#: Checks that depend on the inputs' shapes: a failure is shrunk to the smallest shapes that show it.
SHRUNK = {"forward", "gradients", "gradcheck", "retain_graph", "inputs_unchanged", "second_shape"}

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class CheckError(ScaffoldError):
    """The target or the call cannot be loaded or read (exit code 2)."""


class _Soft(Exception):  # noqa: N818 - a verdict, not an error
    """A check's finding that is a warning unless --strict."""


class _Note(Exception):  # noqa: N818 - a verdict, not an error
    """A check passed, with a note on what it could not try (torch.func.vmap without a vmap rule)."""


@dataclass(frozen=True)
class Verdict:
    """One check's outcome: ``status`` is "pass", "fail", "warn" or "skip"; ``message`` says what is wrong (or why
    it was skipped) in the words of the Function rules; ``example`` the smallest input that shows a failure."""

    check: str
    status: str
    message: str = ""
    example: str = ""


@dataclass(frozen=True)
class CheckReport:
    """Every verdict on one target."""

    target: str
    verdicts: tuple[Verdict, ...]
    strict: bool = False

    def failed(self) -> list[Verdict]:
        """The verdicts that fail the command: failures, and warnings under --strict."""
        return [v for v in self.verdicts if v.status == "fail" or (self.strict and v.status == "warn")]

    def exit_code(self) -> int:
        return EXIT_FAILED if self.failed() else 0


# --- the target ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Subject:
    """What is checked: ``call`` takes the spec's tensors, then its scalars, and returns what the Function's
    apply returns; ``function`` is the autograd.Function class where one is known (a class, or the class of
    ``--call``'s ``CLASS.apply``)."""

    name: str
    call: Callable[..., object]
    function: type | None


def load_target(
    target: str,
    *,
    call: str | None = None,
    arguments: Sequence[str] = (),
    learnable: Sequence[str] = (),
    root: str | Path | None = None,
) -> Subject:
    """``FILE.py:NAME`` or ``MODULE.NAME:NAME`` (NAME may be dotted: ``Outer.Inner``): an autograd.Function
    class, a function, an nn.Module instance or class (made with no arguments). ``call`` maps the spec's
    ``arguments`` onto it otherwise than in order (:func:`caller`). A Module takes the spec's ``learnable``
    tensors as its parameters of the same names (:func:`_module_call`), the other arguments in order. A module
    is imported with ``root`` (default: the current folder) on sys.path."""
    where, _, attribute = target.rpartition(":")
    if not where or not attribute:
        raise CheckError(
            f"cannot read the target {target!r}",
            hint="write FILE.py:CLASS (e.g. my_ops.py:SwishFunction) or MODULE:CLASS (e.g. my_ops.act:Swish)",
        )
    module = _import(where, Path(root) if root is not None else Path.cwd())
    obj = _attribute(module, attribute, where)
    if call is not None:
        function = _called_function(call, vars(module))
        return Subject(target, caller(call, arguments, vars(module)), function)
    import torch

    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        return Subject(target, obj.apply, obj)
    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        try:
            obj = obj()
        except Exception as exc:
            raise CheckError(
                f"cannot make the Module {attribute} with no arguments: {type(exc).__name__}: {exc}",
                where=target,
                hint=f"pass an instance (a module-level `{attribute.lower()} = {attribute}(...)`), or --call",
            ) from None
    if isinstance(obj, torch.nn.Module):
        return Subject(target, _module_call(obj, arguments, learnable, target), None)
    if not callable(obj):
        raise CheckError(
            f"{attribute} is a {type(obj).__name__}, not an autograd.Function, a function or a Module",
            where=target,
        )
    return Subject(target, obj, None)


def _module_call(module, arguments: Sequence[str], learnable: Sequence[str], where: str) -> Callable[..., object]:
    """A Module called on the spec's arguments: each learnable tensor in place of the Module's parameter (or
    buffer) of its name (torch.func.functional_call: the Module itself is left as it is), the others passed to
    forward in order."""
    import torch

    own = {name for name, _ in (*module.named_parameters(), *module.named_buffers())}
    missing = [name for name in learnable if name not in own]
    if missing:
        has = ", ".join(sorted(own)) or "it has none"
        raise CheckError(
            f"the Module has no parameter {missing[0]} (the spec's learnable tensor)",
            where=where,
            hint=f"name the spec's learnable tensors as the Module's parameters ({has}), or map them with --call",
        )

    def call(*values: object) -> object:
        given = dict(zip(arguments, values, strict=True))
        passed = [given[name] for name in arguments if name not in learnable]
        return torch.func.functional_call(module, {name: given[name] for name in learnable}, tuple(passed))

    return call


def _import(where: str, root: Path):
    """The module of a file path (``*.py``, imported under a name of its own, its folder on sys.path while it
    imports) or an importable module's name (``root`` on sys.path while it imports)."""
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise CheckError("file not found", where=where, hint="give the path of the .py file that defines it")
        name = f"_scaffold_checked_{path.stem}_{uuid.uuid4().hex[:8]}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # torch.compile finds a function's globals through its module's name
        with _on_path(path.resolve().parent):
            _run_user_code(lambda: spec.loader.exec_module(module), where)
        return module
    with _on_path(root):
        return _run_user_code(lambda: importlib.import_module(where), where)


def _run_user_code(run: Callable[[], object], where: str):
    try:
        return run()
    except ModuleNotFoundError as exc:
        raise CheckError(
            f"cannot import it: {exc}",
            where=where,
            hint="a module must be importable from here (installed, or under the current folder); a file is a "
            "path ending in .py",
        ) from None
    except Exception as exc:  # the user's module raised while importing: say what and where, no traceback
        raise CheckError(f"importing it raised {type(exc).__name__}: {exc}", where=where) from None


def _attribute(module, dotted: str, where: str):
    obj = module
    for part in dotted.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in vars(module) if not n.startswith("_"))
            raise CheckError(
                f"{dotted} is not defined there",
                where=where,
                hint=f"it defines: {', '.join(names[:20]) or 'nothing public'}",
            )
        obj = getattr(obj, part)
    return obj


@contextlib.contextmanager
def _on_path(folder: Path) -> Iterator[None]:
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(folder))


def caller(text: str, arguments: Sequence[str], namespace: dict) -> Callable[..., object]:
    """``--call "CLASS.apply(x, w, eps)"``: a function of the spec's ``arguments`` (tensors, then scalars)
    that makes that call. The text is parsed, never evaluated: one call of a name (or a dotted attribute of one)
    in ``namespace``, whose arguments are the spec's names, numbers, strings, True/False/None, keyword
    arguments of those, and tuples or lists of them."""
    call = _parse_call(text)
    target = _name_value(call.func, namespace, text)

    def run(*values: object) -> object:
        bound = dict(zip(arguments, values, strict=True))
        args = [_argument(a, bound, text) for a in call.args]
        kwargs = {k.arg: _argument(k.value, bound, text) for k in call.keywords}
        return target(*args, **kwargs)

    for node in [*call.args, *(k.value for k in call.keywords)]:
        _argument(node, dict.fromkeys(arguments), text)  # refuse an unknown name now, not at the first call
    return run


def _parse_call(text: str) -> ast.Call:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise CheckError(
            f"cannot read --call {text!r}: {exc.msg}", hint='write e.g. "SmoothL1.apply(x, y, beta)"'
        ) from None
    if not isinstance(tree.body, ast.Call) or any(k.arg is None for k in tree.body.keywords):
        raise CheckError(
            f"--call {text!r} is not one call",
            hint='write one call of your Function or function on the spec\'s names, e.g. "SmoothL1.apply(x, y, beta)"',
        )
    return tree.body


def _name_value(node: ast.expr, namespace: dict, text: str) -> object:
    if isinstance(node, ast.Name):
        if node.id not in namespace:
            raise CheckError(f"--call {text!r}: {node.id} is not defined in the target's module")
        return namespace[node.id]
    if isinstance(node, ast.Attribute) and not node.attr.startswith("__"):
        owner = _name_value(node.value, namespace, text)
        if not hasattr(owner, node.attr):
            raise CheckError(f"--call {text!r}: {ast.unparse(node.value)} has no attribute {node.attr}")
        return getattr(owner, node.attr)
    raise CheckError(
        f"--call {text!r}: calls {ast.unparse(node)}, which is not a name of the module or an attribute of one"
    )


def _argument(node: ast.expr, bound: dict, text: str) -> object:
    if isinstance(node, ast.Name):
        if node.id not in bound:
            raise CheckError(
                f"--call {text!r}: {node.id} is not an argument of the spec",
                hint=f"the spec's arguments: {', '.join(bound)}",
            )
        return bound[node.id]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_argument(e, bound, text) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    raise CheckError(
        f"--call {text!r}: the argument {ast.unparse(node)} is not a name of the spec, a number or a string",
        hint="pass the spec's arguments by name; compute anything else inside your function",
    )


def _called_function(text: str, namespace: dict) -> type | None:
    """The autograd.Function class of ``CLASS.apply(...)``, where ``--call`` calls one."""
    import torch

    func = _parse_call(text).func
    if isinstance(func, ast.Attribute) and func.attr == "apply":
        owner = _name_value(func.value, namespace, text)
        if isinstance(owner, type) and issubclass(owner, torch.autograd.Function):
            return owner
    return None


# --- the reference ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def reference_tests(spec: OpSpec, *, time_limit: float | None = None):
    """The generated test file's ``OP`` (:class:`~scaffold.testing.OpTests`) for ``spec``: the reference, the
    inputs and the checks, with scaffold's own generated op in it (imported from a temporary folder under a
    private name, and removed from sys.modules again). Kept per spec: several Functions of one op (a test
    file's, a corpus') are held against the same reference."""
    from .api import generate_op
    from .limits import TIME_LIMIT

    private = f"_scaffold_check_{spec.name}_{uuid.uuid4().hex[:8]}"
    files = generate_op(spec, module_import=private, time_limit=time_limit or TIME_LIMIT)
    with tempfile.TemporaryDirectory(prefix="scaffold-check-") as folder:
        root = Path(folder)
        (root / f"{private}.py").write_text(files[f"{spec.name}.py"], encoding="utf-8")
        (root / "_scaffold_runtime.py").write_text(files["_scaffold_runtime.py"], encoding="utf-8")
        (root / f"test_{private}.py").write_text(files[f"test_{spec.name}.py"], encoding="utf-8")
        before = set(sys.modules)
        with _on_path(root), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tests = importlib.import_module(f"test_{private}")
        for name in set(sys.modules) - before:  # the generated modules: a later check imports its own
            if name.startswith((private, f"test_{private}")) or name == "_scaffold_runtime":
                del sys.modules[name]
    return tests.OP


#: The most elements (all inputs together) at which the checks take the spec's example shapes as they are; a
#: larger example is checked at the generated tests' small shapes (gradcheck builds a Jacobian per element).
EXAMPLE_ELEMENTS = 256


def _at_example_shapes(op_tests, spec: OpSpec):
    """``op_tests`` at the spec's example shapes where they are small (a hand-written kernel may hold only at
    the sizes its author tried: a Triton block of 4 columns), else at the generated tests' small shapes; and a
    second shape of each size twice as large and one more (past a block boundary: 4 -> 9), with the generated
    tests' batch dimension, equal sizes kept equal, a 0-d tensor kept 0-d."""
    example = [t.shape for t in spec.tensors]
    inputs = op_tests.inputs
    base = example if sum(_numel(s) for s in example) <= EXAMPLE_ELEMENTS else [i.shape for i in inputs]
    replaced = []
    for i, shape in zip(inputs, base):
        grown = tuple(1 if d == 1 else 2 * d + 1 for d in shape)
        batched = i.second_shape is not None and len(i.second_shape) == len(i.shape) + 1
        second = (i.second_shape[0], *grown) if batched else grown
        replaced.append(dataclasses.replace(i, shape=tuple(shape), second_shape=second if shape else ()))
    return dataclasses.replace(op_tests, inputs=replaced)


def _with_subject(op_tests, subject: Subject):
    """``op_tests`` with the user's callable in place of the generated op: ``op`` returns the spec's outputs
    (the first of what apply returns, where it returns more), ``function.apply`` all of them."""
    count = max(1, len(op_tests.outputs))

    def op(*args: object) -> object:
        value = subject.call(*args)
        if isinstance(value, (tuple, list)) and count == 1:
            return value[0]
        if isinstance(value, (tuple, list)):
            return tuple(value[:count])
        return value

    # apply is the call as mapped (--call), whatever the Function's own argument order
    function = type("Call", (), {"apply": staticmethod(subject.call)})
    return dataclasses.replace(op_tests, function=function, op=op, custom_op=None)


def checker(
    spec: OpSpec | str,
    target: str,
    *,
    call: str | None = None,
    time_limit: float | None = None,
    root: str | Path | None = None,
) -> FunctionChecks:
    """The checks of ``target`` against ``spec`` (an OpSpec, or a spec's TOML text), ready to run one by one;
    a module target is imported with ``root`` (default: the current folder) on sys.path."""
    from .function_checks import FunctionChecks

    if isinstance(spec, str):
        spec = spec_from_mapping(tomllib.loads(spec), source=f"the spec of {target}")
    arguments = [t.name for t in spec.tensors] + [s.name for s in spec.scalars]
    learnable = [t.name for t in spec.tensors if t.learnable]
    subject = load_target(target, call=call, arguments=arguments, learnable=learnable, root=root)
    derived = _at_example_shapes(reference_tests(spec, time_limit=time_limit), spec)
    return FunctionChecks(_with_subject(derived, subject), subject, derived)


def check_function(
    spec: OpSpec,
    target: str,
    *,
    call: str | None = None,
    strict: bool = False,
    device: str = "cpu",
    checks: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    time_limit: float | None = None,
) -> CheckReport:
    """Every check (or those named in ``checks``) of ``target`` against ``spec``'s math, on ``device``."""
    unknown = [c for c in checks or () if c not in CHECKS]
    if unknown:
        raise CheckError(f"no check named {', '.join(unknown)}", hint=f"the checks: {', '.join(CHECKS)}")
    checks_of = checker(spec, target, call=call, time_limit=time_limit)
    verdicts = []
    for check in checks or CHECKS:
        if progress is not None:
            progress(check)
        verdicts.append(checks_of.run(check, device))
    return CheckReport(target, tuple(verdicts), strict)


def check_test_files(
    spec: OpSpec, target: str, folder: str | Path, *, call: str | None = None, strict: bool = False
) -> dict[str, str]:
    """``{"test_check_NAME.py": ...}``: a pytest file that runs every check of ``target`` against ``spec`` in
    the user's suite; a file target is found relative to the test file's ``folder``."""
    from .render import CheckTestView, render_check_tests

    where, _, attribute = target.rpartition(":")
    relative = where.endswith(".py")
    # a file from the test file's folder; a module with the folder it was imported from (here) on sys.path
    path = os.path.relpath(Path(where).resolve() if relative else Path.cwd(), Path(folder).resolve())
    spec_text = tomlwriter.dumps({key: value for key, value in spec_to_mapping(spec).items() if value != {}})
    view = CheckTestView(
        version=__version__,
        target=target,
        target_name=attribute,
        relative=relative,
        path=Path(path).as_posix(),
        attribute=attribute,
        call=call,
        strict=strict,
        spec_text=spec_text,
    )
    return {f"test_check_{spec.name}.py": render_check_tests(view)}


def format_report(report: CheckReport) -> str:
    """One line per check, then the failures' messages and smallest examples; the verdict last."""
    marks = {"pass": "ok", "fail": "FAIL", "warn": "warn", "skip": "skip"}
    lines = [f"scaffold check {report.target}"]
    for v in report.verdicts:
        note = f": {v.message}" if v.message else f"  ({CHECKS[v.check]})"
        lines.append(f"  {marks[v.status]:>4}  {v.check}{note}")
        if v.example:
            lines.extend(f"          {line}" for line in v.example.splitlines())
    failed = report.failed()
    counts = {s: sum(v.status == s for v in report.verdicts) for s in marks}
    summary = ", ".join(f"{n} {s if s != 'pass' else 'passed'}" for s, n in counts.items() if n)
    if failed:
        lines.append(f"{len(failed)} check{'s' if len(failed) > 1 else ''} failed ({summary}).")
    else:
        lines.append(f"The Function holds ({summary}).")
    return "\n".join(lines)


def smallest_shapes(shapes: Sequence[tuple[int, ...]], limit: int = 64) -> list[list[tuple[int, ...]]]:
    """Smaller sets of the inputs' ``shapes`` to try a failure at, fewest elements first: every dimension of
    the same size shrinks together (so that what broadcasts still broadcasts), to 1, 2 or 3."""
    sizes = sorted({d for shape in shapes for d in shape})
    options = [sorted({c for c in (1, 2, 3) if c < d} | {d}) for d in sizes]
    candidates = []
    for choice in itertools.product(*options):
        table = dict(zip(sizes, choice))
        candidates.append([tuple(table[d] for d in shape) for shape in shapes])
    candidates.sort(key=lambda c: (sum(_numel(s) for s in c), c))
    return candidates[:limit]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
