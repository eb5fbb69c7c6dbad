"""Stage 7: render the generated files, in memory.

Builds the view of one op (every piece of code as a string, printed from the plan) and fills the jinja2
templates with it. Templates hold layout only; what goes into them is decided here. Rendering is
deterministic: the same spec gives the same bytes.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePath

import jinja2
import sympy

from . import structural
from ._version import __version__
from .batching import Batching, batching
from .dataflow import ProgramPlan
from .derivation import KINK_CONVENTION
from .domain import InputDomain
from .double_backward import GRAD_GRAD_PREFIX, DoubleBackward
from .errors import DerivationError, ScaffoldError
from .expression import ParsedExpression
from .formatting import LINE_LENGTH, format_source
from .functions import kink_classes, stable_classes
from .inplace import BOOL, NUMBER, TENSOR, Kind, reuse_temporaries
from .plan import (
    GRAD_OUTPUT,
    OUTPUT,
    TANGENT_SUFFIX,
    SharedSteps,
    Step,
    straight_line,
)
from .printing import IMPORTS, NEG_ABS, is_finite, print_torch
from .program import Program, RankRequirement, _broadcast_checked, build_program, rank_requirements, spread_reduction
from .rows import COLUMN, ROW, ROW_FLAT, TOTAL, VECTOR, WHOLE, RowKernels, RowTotal
from .rules import ProgramDerivation, unsqueezed
from .spec import RUNTIME_FILE, OpSpec, linear_weight
from .temporaries import name_parts

TEMPLATES = {
    "test": "test_op.py.j2",
    "program": "program_op.py.j2",
    "runtime": "_scaffold_runtime.py.j2",
    "check_test": "check_test.py.j2",
}
#: The test library (scaffold/testing.py) as generated tests import it outside a project.
TESTING_MODULE = "scaffold.testing"
#: A custom op's namespace outside a project (in one, the project's package).
DEFAULT_NAMESPACE = "scaffold"


def templates_dir() -> Path:
    """The templates folder: inside the installed package, or beside it in a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / TEMPLATES["program"]).is_file():
            return candidate
    raise FileNotFoundError(f"scaffold's templates are missing (looked in {here / 'templates'})")


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    # Names assigned from a tuple, or a tuple of names to return: one name is (x,).
    env.filters["unpack"] = _unpack
    env.filters["repr"] = repr  # a value as a Python literal
    env.filters["hanging"] = _hanging
    env.filters["tuple"] = lambda names: repr(tuple(names))  # ("x", "beta"): a tuple of strings
    return env


#: Generated lines stay within this width (ruff's line length in scaffold's own style and the project
#: template's); docstrings are not wrapped by the formatter.
LINE_WIDTH = 120


def _hanging(text: str, first: str, indent: int) -> str:
    """``first + text`` wrapped at spaces to :data:`LINE_WIDTH`, later lines indented by ``indent``: a long
    formula in a docstring (a product without spaces stays whole)."""
    return textwrap.fill(
        first + text,
        width=LINE_WIDTH,
        subsequent_indent=" " * indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _import_lines(aliases: set[str]) -> list[str]:
    """The import statements for the modules printed code refers to (:data:`.printing.IMPORTS`)."""
    return [IMPORTS[alias] for alias in sorted(aliases)]


def _docstring_text(text: str) -> str:
    """Make ``text`` safe inside a triple-quoted docstring."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


class _CodePrinter:
    """Prints the expressions of one op, tracking which temporaries hold tensors.

    A temporary is a tensor when its expression involves one; otherwise it is a Python number (a
    function of scalar arguments), and expressions using it must not call torch on it. Forward,
    backward and the test's reference each start a fresh :meth:`scope`: their temporaries share names.
    """

    def __init__(self, spec: OpSpec, plan: ProgramPlan | None = None) -> None:
        names = {t.name for t in spec.tensors}
        if isinstance(plan, ProgramPlan):  # an output's gradient is never None there (zeros instead)
            outputs, grads, upstream = {*plan.returns, *plan.upstream}, [plan.upstream[0]], set(plan.upstream)
        elif plan is not None:
            outputs = {n for o in plan.outputs for n in (o.value, o.grad)}
            grads, upstream = [o.grad for o in plan.visible], {o.grad for o in plan.outputs}
        else:
            outputs, grads, upstream = set(), [GRAD_OUTPUT], set()
        # what a case distinction between numbers takes its dtype from: an upstream gradient (with several
        # outputs, the first that is not None)
        self.anchor, self.anchor_text = grads[0], _first_given(grads)
        self.base = frozenset(names | {n + TANGENT_SUFFIX for n in names} | {GRAD_OUTPUT, OUTPUT} | outputs)
        self.tensors = set(self.base)
        # the tensors known to be finite, which a step may multiply (printing.is_finite): the inputs, their
        # tangents, the upstream gradients, and the temporaries computed from those by bounded operations
        self.base_finite = frozenset(names | {n + TANGENT_SUFFIX for n in names} | {GRAD_OUTPUT} | upstream)
        self.finite = set(self.base_finite)
        self.bools: set[str] = set()  # the tensors that are bool masks
        # the int64 and bool arguments: no case distinction takes its dtype from them
        self.discrete = frozenset(t.name for t in spec.tensors if t.discrete)
        self.where = f"{spec.source}: forward"
        self.imports: set[str] = set()
        self.helpers: set[str] = set()

    def scope(self) -> None:
        self.tensors = set(self.base)
        self.finite = set(self.base_finite)

    def __call__(self, expr: sympy.Basic) -> str:
        finite = self.finite | {n for n in self.tensors if n.startswith(GRAD_GRAD_PREFIX)}
        printed = print_torch(
            expr,
            self.tensors,
            where=self.where,
            bools=self.bools | self.discrete,
            anchor=self.anchor,
            anchor_text=self.anchor_text,
            finite=finite,
        )
        self.imports |= printed.imports
        self.helpers |= printed.helpers
        return printed.text

    def steps(self, steps: tuple[Step, ...]) -> list[str]:
        lines = []
        for step in steps:
            lines.append(f"{step.name} = {self(step.expr)}")
            if any(s.name in self.tensors for s in step.expr.free_symbols):
                self.tensors.add(step.name)
            if is_finite(step.expr, self.finite | self.bools, self.tensors):
                self.finite.add(step.name)
            else:
                self.finite.discard(step.name)
            # a condition's value is a bool tensor: no case distinction may take its dtype from it
            if isinstance(step.expr, sympy.logic.boolalg.Boolean):
                self.bools.add(step.name)
            else:
                self.bools.discard(step.name)
        return lines


def _shape(shape: tuple[int, ...]) -> str:
    return repr(tuple(shape))


@dataclass(frozen=True)
class Block:
    """Temporaries computed together, under ``guard`` (None: always)."""

    guard: str | None
    lines: list[str]


def _first_given(grads: list[str]) -> str:
    """The first of ``grads`` that is not None, as an expression (at least one is: backward runs)."""
    text = grads[-1]
    for grad in reversed(grads[:-1]):
        text = f"{grad} if {grad} is not None else {text}"
    return f"({text})" if len(grads) > 1 else text


class _OptionalGrads:
    """The upstream gradients that may be None (an op with several outputs, where some were not used), and
    which temporaries read them, directly or through other temporaries."""

    def __init__(self, grads: list[str]) -> None:
        self.grads = list(grads)
        self.reads: dict[str, set[str]] = {}

    def of(self, expr: sympy.Basic, steps: tuple[Step, ...] = ()) -> list[str]:
        """The optional gradients ``expr`` reads (after ``steps``, which are recorded)."""
        for step in steps:
            self.reads[step.name] = self._direct(step.expr)
        found = self._direct(expr)
        return [g for g in self.grads if g in found]

    def _direct(self, expr: sympy.Basic) -> set[str]:
        names = {s.name for s in expr.free_symbols}
        return (names & set(self.grads)).union(*(self.reads.get(n, set()) for n in names))

    def guard(self, expr: sympy.Basic, steps: tuple[Step, ...] = ()) -> str | None:
        read = self.of(expr, steps)
        return " and ".join(f"{g} is not None" for g in read) or None


@dataclass(frozen=True)
class GradGradTerm:
    """The gradient arriving at one of backward's outputs times a second partial, where ``condition`` holds
    (that gradient, and any upstream gradient the partial reads, is not None)."""

    condition: str
    lines: list[str]
    value: str

    @property
    def inline(self) -> bool:
        """Whether the term is added on one line, ``terms += [value] if condition else []`` (the value is
        computed only where the condition holds); else in an if block, after its own lines."""
        one_line = f"{' ' * 12}terms += [{self.value}] if {self.condition} else []"
        return not self.lines and len(one_line) <= LINE_LENGTH


@dataclass(frozen=True)
class GradGradTarget:
    """The gradient of backward's input at ``index``, ``name``: the sum of its ``terms``."""

    index: int
    name: str
    terms: list[GradGradTerm]
    value: str


@dataclass(frozen=True)
class DoubleBackwardView:
    """The ``_NAMEBackward`` Function: backward as an op whose own backward is derived."""

    doc: str  # the class docstring, as code
    function: str  # the gradients' function it runs as its forward
    saved: list[str]  # backward's inputs that its backward reads: tensors (saved), numbers (kept on ctx)
    scalars: list[str]
    grad_grads: list[str]
    blocks: list[Block]
    targets: list[GradGradTarget]
    returns: list[str]


@dataclass(frozen=True)
class Learnable:
    """A learnable tensor: an ``nn.Parameter`` of the Module, created empty of ``shape`` (the arguments of
    torch.empty: sizes by their names) and filled by the ``init`` lines of reset_parameters."""

    name: str
    shape: str
    init: list[str]


@dataclass(frozen=True)
class ModuleCode:
    """The Module's constructor, parameters and repr: what op.py.j2 and program_op.py.j2 share."""

    init_params: list[str]  # after self: the sizes, then "*" and the keywords (0-d initial values, scalars)
    attributes: list[str]  # what the constructor stores: the sizes, the initial values, the scalars
    learnables: list[Learnable]
    reset_imports_math: bool  # a scheme reads math.sqrt
    forward_params: list[str]
    call_args: list[str]
    # what forward passes _check_sizes before it calls the entry point: "" where there is no _check_sizes or
    # the entry point is the custom op, which calls it
    check_args: str
    extra_repr: str


def _init_lines(spec: OpSpec, t, domain: InputDomain) -> list[str]:
    """The lines of reset_parameters that fill the learnable tensor ``t``, by its init scheme (nn.init, as
    torch/nn/modules/linear.py and normalization.py use it)."""
    name = f"self.{t.name}"
    scheme = t.scheme
    if keyword_init(t):
        return [f"nn.init.constant_({name}, self.{t.name}_init)"]
    if scheme is None:
        return [f"nn.init.constant_({name}, {domain.init!r})"]
    if scheme.scheme in ("ones", "zeros"):
        return [f"nn.init.{scheme.scheme}_({name})"]
    if scheme.scheme == "constant":
        return [f"nn.init.constant_({name}, {scheme.args[0]!r})"]
    if scheme.scheme == "normal":
        return [f"nn.init.normal_({name}, mean={scheme.args[0]!r}, std={scheme.args[1]!r})"]
    if scheme.scheme == "uniform":
        return [f"nn.init.uniform_({name}, {scheme.args[0]!r}, {scheme.args[1]!r})"]
    if scheme.scheme in ("kaiming_uniform", "xavier_uniform"):
        return [f"nn.init.{scheme.scheme}_({name})"]
    if len(t.shape) >= 2:  # linear: nn.Linear's weight
        return [f"nn.init.kaiming_uniform_({name}, a=math.sqrt(5))"]
    weight = linear_weight(spec, t)
    fan_in = f"self.{weight.name}.shape[1]" if len(weight.shape) == 2 else f"self.{weight.name}[0].numel()"
    return [
        f"# nn.Linear's bias: uniform within 1/sqrt(fan_in), the fan-in of {weight.name}",
        f"bound = 1 / math.sqrt({fan_in})",
        f"nn.init.uniform_({name}, -bound, bound)",
    ]


def keyword_init(t) -> bool:
    """Whether the Module takes the initial value of the learnable tensor ``t`` as a keyword: a 0-d tensor
    with a constant init (a number, "ones", "zeros", or none)."""
    return t.learnable and not t.shape and (t.scheme is None or t.scheme.constant is not None)


def module_code(spec: OpSpec, domains: tuple[InputDomain, ...], *, entry_checks: bool) -> ModuleCode:
    """The Module: its constructor takes the sizes its learnable tensors use (positional or by keyword,
    defaulting to the example), then the initial value of each 0-d learnable tensor and the scalars, by
    keyword; reset_parameters fills the parameters, created empty. Its forward checks the sizes as the
    functional does, unless the entry point it calls does (``entry_checks``: the custom op itself)."""
    by_name = {d.name: d for d in domains}
    sizes = [name for name, _ in spec.module_sizes]
    keywords = []
    attributes = [f"self.{n} = {n}" for n in sizes]
    for t in spec.tensors:
        if keyword_init(t):
            value = t.scheme.constant if t.scheme is not None else by_name[t.name].init
            keywords.append(f"{t.name}: float = {value!r}")
            attributes.append(f"self.{t.name}_init = {t.name}")
    keywords += [f"{s.name}: {s.type} = {s.default!r}" for s in spec.scalars]
    attributes += [f"self.{s.name} = {s.name}" for s in spec.scalars]
    learnables = []
    for t in spec.tensors:
        if t.learnable:
            dims = [name or str(n) for n, name in zip(t.shape, t.size_names)]
            shape = ", ".join(dims) if dims else "()"
            learnables.append(Learnable(t.name, shape, _init_lines(spec, t, by_name[t.name])))
    shown = [f"{{self.{n}}}" for n in sizes] + [f"{s.name}={{self.{s.name}!r}}" for s in spec.scalars]
    learned = {t.name for t in spec.tensors if t.learnable}
    checks = size_checks(spec)
    check_args = [f"self.{n}" if n in learned else n for n in checks.names] if checks and not entry_checks else []
    return ModuleCode(
        init_params=[f"{n}: int = {v}" for n, v in spec.module_sizes] + (["*", *keywords] if keywords else []),
        attributes=attributes,
        learnables=learnables,
        reset_imports_math=any("math." in line for t in learnables for line in t.init),
        forward_params=[f"{t.name}: torch.Tensor" for t in spec.tensors if not t.learnable],
        call_args=[f"self.{t.name}" if t.learnable else t.name for t in spec.tensors]
        + [f"self.{s.name}" for s in spec.scalars],
        check_args=", ".join(check_args),
        extra_repr=", ".join(shown),
    )


@dataclass(frozen=True)
class SizeCheck:
    """One check of ``_check_sizes``: where ``condition`` holds, the tensors disagree on a size name."""

    condition: str
    message: str  # the body of an f-string in single quotes


@dataclass(frozen=True)
class SizeChecks:
    """``_check_sizes``, which the functional calls: its parameters (the tensors that share a size name),
    what the functional passes them, and its checks."""

    names: list[str]
    checks: list[SizeCheck]

    @property
    def params(self) -> str:
        return ", ".join(f"{n}: torch.Tensor" for n in self.names)

    @property
    def args(self) -> str:
        return ", ".join(self.names)


def size_checks(spec: OpSpec, *, batched_rule: bool = False) -> SizeChecks | None:
    """``_check_sizes``, where some size name is used by two or more dimensions of the tensors (None
    elsewhere): each is the same as in its first use. A dimension is named as its tensor's shape names it:
    a learnable tensor (a Module's parameter) keeps its rank and is indexed from the front; another may have
    extra leading batch dimensions, so it is indexed from the end. Where a ``batched_rule`` (an elementwise
    custom op's vmap rule) calls the op with every input batched, a learnable one is read from the end too,
    at the same dimension."""
    uses: dict[str, list[tuple[str, int, int]]] = {}  # name -> (tensor, dim as named, dim as read)
    for t in spec.tensors:
        for position, name in enumerate(t.size_names):
            if name is not None:
                dim = position if t.learnable else position - len(t.shape)
                read = position - len(t.shape) if batched_rule else dim
                uses.setdefault(name, []).append((t.name, dim, read))
    checks = []
    tied = [dims for dims in uses.values() if len(dims) > 1]
    ranks: dict[str, int] = {}  # the dimensions each tensor must have for the sizes to be read
    for tensor, _, read in (use for dims in tied for use in dims):
        ranks[tensor] = max(ranks.get(tensor, 0), read + 1 if read >= 0 else -read)
    for tensor, rank in ranks.items():  # first: a tensor with too few dimensions has no such size to compare
        checks.append(
            SizeCheck(
                f"{tensor}.dim() < {rank}",
                f"{spec.name}: {tensor} needs at least {rank} dimension{'s' if rank > 1 else ''} for its sizes, "
                f"got shape {{tuple({tensor}.shape)}}",
            )
        )
    for name, dims in uses.items():
        (first, first_dim, first_read), *others = dims
        for tensor, dim, read in others:
            expected, got = f"{first}.shape[{first_read}]", f"{tensor}.shape[{read}]"
            checks.append(
                SizeCheck(
                    f"{got} != {expected}",
                    f'{spec.name}: size "{name}" is {{{expected}}} in {first} (dim {first_dim}) but {{{got}}} in '
                    f"{tensor} (dim {dim})",
                )
            )
    if not tied:
        return None
    involved = {t for dims in uses.values() if len(dims) > 1 for t, _, _ in dims}
    names = [t.name for t in spec.tensors if t.name in involved]
    return SizeChecks(names, checks)


@dataclass(frozen=True)
class CustomOpView:
    """The torch.library custom op of ``target = "custom_op"``: its registration around the Function."""

    qualname: str  # "namespace::name"
    params: list[str]  # the fake kernel's and the vmap rule's: the dispatcher may leave out scalars at default
    op: str  # the Python name bound to the op: the op's name, or NAME_op where NAME drops its hidden outputs
    returns_type: str  # every output the op returns, hidden ones included
    hidden: list[str]  # the hidden outputs (intermediates backward reads), in order
    fake_call: str  # what computes the outputs on fake tensors: the forward's own math
    vmap: str  # the vmap rule: "" (none), "elementwise" (one call), "checked" (one call in the cases listed)
    out_dims: str  # the vmap rule's out_dims
    one_call: str = ""  # "checked": the cases one call computes, as a set of tuples of bools
    ranks: str = ""  # "checked": each tensor argument's example rank, as a tuple


def custom_op_view(
    spec: OpSpec,
    namespace: str,
    visible: int,
    hidden: Sequence[str],
    fake_call: str,
    *,
    elementwise: bool,
    batched: Batching | None = None,
) -> CustomOpView | None:
    """The custom op's view, or None for a plain Function (``target = "function"``). Its vmap rule: an
    ``elementwise`` op's calls it once; a structured op's as its ``batched`` says (:mod:`.batching`)."""
    if spec.target != "custom_op":
        return None
    count = visible + len(hidden)
    vmap = "elementwise" if elementwise and not hidden else ""
    if batched is not None:
        vmap = "elementwise" if batched.elementwise else "checked"
    return CustomOpView(
        qualname=f"{spec.namespace or namespace}::{spec.name}",
        params=[t.name for t in spec.tensors] + [f"{s.name}={s.default!r}" for s in spec.scalars],
        op=f"{spec.name}_op" if hidden else spec.name,
        returns_type=f"tuple[{', '.join(['torch.Tensor'] * count)}]" if count > 1 else "torch.Tensor",
        hidden=list(hidden),
        fake_call=fake_call,
        vmap=vmap,
        out_dims="0" if count == 1 else f"({', '.join(['0'] * count)})",
        one_call="{" + ", ".join(_tuple(case) for case in batched.one_call) + "}" if batched else "",
        ranks=_tuple(batched.ranks) if batched else "",
    )


def _tuple(items: Sequence) -> str:
    """A tuple as Python writes it: ``(True,)`` for one item."""
    return f"({', '.join(map(repr, items))}{',' if len(items) == 1 else ''})"


def _may_be_input(expr: sympy.Basic, tensors: frozenset[sympy.Symbol]) -> bool:
    """Whether the forward of ``expr`` may return a tensor input itself: the input, or a case of a
    Piecewise on scalars that is one (``x if flag else -x``)."""
    if isinstance(expr, sympy.Piecewise):
        return any(_may_be_input(e, tensors) for e, _ in expr.args)
    return expr in tensors


class _Entry:
    """What both module views share: the name the functional and the Module call."""

    custom_op: CustomOpView | None
    #: whether the template defines _forward, the forward as written, whatever Function.forward computes
    defines_forward = False

    @property
    def entry(self) -> str:
        """What the functional and the Module call: the custom op, or the Function's apply."""
        return self.custom_op.op if self.custom_op else "_apply"


@dataclass(frozen=True)
class DoubleBackwardInputs:
    """What backward takes, as its double backward reads it."""

    upstream: list[str]  # the upstream gradients
    optional: list[str]  # those of them that may be None
    saved: list[str]  # backward's inputs that its backward reads: the upstream gradients, then saved tensors
    scalars: list[str]  # the numbers it reads (kept on ctx)
    masks: list[str]  # those of the saved tensors that are bool masks


def double_backward_view(
    code: _CodePrinter,
    double: DoubleBackward,
    inputs: DoubleBackwardInputs,
    tensor_names: list[str],
    params: list[str],
    *,
    camel: str,
    function: str,
) -> DoubleBackwardView:
    """The double backward: backward's inputs (``params``) and, for each that has a gradient, its terms,
    one per gradient of the op that depends on it; ``camel``: the op's name in CamelCase, ``function``: the
    function computing its gradients, which the Function runs as its forward."""
    upstream = inputs.upstream
    grad_grads = [GRAD_GRAD_PREFIX + n for n in tensor_names]
    position = {name: params.index(name) for name in double.inputs}
    # The gradient of each input: grad_<input>, unless that is already a name here (grad_s, the upstream
    # gradient of an output s, when s is saved too).
    result, taken = {}, set(params) | set(grad_grads)
    for name in double.inputs:
        result[name] = f"grad_{name}"
        while result[name] in taken:
            result[name] += "_"
        taken.add(result[name])

    code.scope()
    code.tensors |= set(inputs.masks) | set(grad_grads)
    code.bools = set(inputs.masks)
    # Backward's backward runs only for a second derivative: temporaries shared by several terms are
    # computed unguarded (none reads a grad_grad_*, which may be None; an upstream gradient that may be None
    # is read where it is not).
    optional = _OptionalGrads(inputs.optional)
    blocks = _blocks(code, double.code.shared, None, 0, optional)
    targets = []
    for a, name in enumerate(double.inputs):
        terms = []
        for term, (b, i) in zip(double.code.terms, double.pairs):
            if b == a:
                lines = code.steps(term.steps)
                # printed as one product, so that a case distinction between numbers takes its dtype
                # from grad_grad_* (not from a bool mask)
                value = code(sympy.Symbol(grad_grads[i], real=True) * term.expr)
                read = optional.guard(term.expr, term.steps)
                condition = f"{grad_grads[i]} is not None" + (f" and {read}" if read else "")
                terms.append(GradGradTerm(condition, lines, value))
        if not terms:
            continue
        # An upstream gradient has its output's shape, which every term broadcasts to without being larger.
        if name in upstream:
            value = f"torch.broadcast_to(sum(terms), {name}.shape)"
        elif len(upstream) > 1:  # terms from outputs of different shapes: each reduced on its own
            value = f"sum(term.sum_to_size({name}.shape) for term in terms)"
        else:
            value = f"sum(terms).sum_to_size({name}.shape)"
        targets.append(GradGradTarget(position[name], result[name], terms, value))
    names = {t.name for t in targets}
    text = f"{camel}Function's gradients as an op with a derived backward, for a second derivative"
    return DoubleBackwardView(
        doc="\n    ".join(textwrap.wrap(f'"""{text} (see its base class)."""', DOC_WIDTH)),
        function=function,
        saved=inputs.saved,
        scalars=inputs.scalars,
        grad_grads=grad_grads,
        blocks=blocks,
        targets=targets,
        returns=[result[p] if p in result and result[p] in names else "None" for p in params],
    )


def _blocks(
    code: _CodePrinter,
    shared: tuple[SharedSteps, ...],
    guard: Callable[[int], str] | None,
    count: int,
    optional: _OptionalGrads | None = None,
) -> list[Block]:
    """Shared temporaries, guarded by "any user is needed"; backward and jvp only run when one of their
    terms is needed, so temporaries every term uses need no guard (nor any, without ``guard``). With
    ``optional`` gradients, a temporary that reads one is computed only where it is not None."""
    blocks = []
    for b in shared:
        users = None if guard is None or len(b.users) == count else " or ".join(guard(i) for i in b.users)
        for step in b.steps:
            read = optional.guard(step.expr, (step,)) if optional is not None and optional.grads else None
            condition = " and ".join(f"({c})" if " or " in c and read else c for c in (users, read) if c) or None
            line = code.steps((step,))
            if blocks and blocks[-1].guard == condition:
                blocks[-1].lines.extend(line)
            else:
                blocks.append(Block(condition, line))
    return blocks


def _unpack(names: list[str]) -> str:
    """Names to assign a tuple to, or a tuple of them: one name is ``(x,)``."""
    return f"({names[0]},)" if len(names) == 1 else ", ".join(names)


@dataclass(frozen=True)
class InputView:
    """One tensor in the test file: the arguments of its ``Input(...)`` as Python source, and a comment
    on where its values come from."""

    arguments: list[str]
    comment: list[str]  # lines


@dataclass(frozen=True)
class TestView:
    """What ``templates/test_op.py.j2`` lays out: the op's particulars for scaffold.testing.OpTests."""

    __test__ = False  # not a pytest test class, whatever its name

    version: str
    source: str
    name: str
    camel: str
    module_import: str
    testing_module: str
    own_device_fixture: bool
    imports: list[str]
    imports_torch: bool  # the reference of a polynomial calls no torch function
    reference_params: list[str]
    reference_lines: list[str]
    inputs: list[InputView]
    scalars: list[tuple[str, object]]  # name, default
    special: bool  # some input has special points
    gradients: list[tuple[str, str]]  # custom gradients: tensor name, its formula in plain torch
    upstream: list[str]  # the parameters of a custom gradient's formula for each output's upstream gradient
    outputs: list[str]  # the outputs' names, where there are several
    structured: bool = False  # reductions or products: OpTests(elementwise=False)
    custom_op: str = ""  # target = "custom_op": the name the custom op is bound to in the op's module
    sizes: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # the Module's, with defaults
    learnable: bool = False  # some tensor is a parameter of the Module
    rows: bool = False  # fused mode's Triton kernels: OpTests(rows=<Camel>Rows) and their check


def test_view(
    spec: OpSpec,
    program: Program,
    domains: tuple[InputDomain, ...],
    *,
    custom_op: str,
    module_import: str,
    testing_module: str,
    own_device_fixture: bool,
    rows: bool = False,
) -> TestView:
    """The test file's view of any op. A structured op's tests take distinct small sizes (a transposed or
    wrongly reduced dimension shows) where an elementwise op's keep its broadcasting pattern
    (:func:`small_shapes`); ``custom_op``: the name the custom op is bound to in the op's module, if any."""
    code = _CodePrinter(spec)
    reference_lines = _reference_lines(code, program.parsed)
    gradients = _custom_gradients(code, program)
    if program.structured:
        fixed = fixed_sizes(program, spec)
        shapes = program_small_shapes(spec, fixed)
        if not _program_fits(spec, program, shapes):  # the sizes are tied (a reshape's elements): the example's
            shapes = [tuple(t.shape) for t in spec.tensors]
        # the Module's parameters have their example shapes, and the example's shapes fit them together
        module_shapes = [tuple(t.shape) for t in spec.tensors] if any(t.learnable for t in spec.tensors) else shapes
        seconds = second_shapes(spec, shapes, functools.partial(_program_fits, spec, program), fixed)
    else:
        shapes = small_shapes(spec)
        module_shapes = _module_shapes(spec, shapes)
        seconds = second_shapes(spec, shapes, _broadcasts)
    return TestView(
        version=__version__,
        source=spec.source,
        name=spec.name,
        camel=spec.camel,
        module_import=module_import,
        testing_module=testing_module,
        own_device_fixture=own_device_fixture,
        imports=_import_lines(code.imports),
        imports_torch=program.structured
        or any("torch." in line for line in [*reference_lines, *(g for _, g in gradients)]),
        reference_params=[a.name for a in spec.arguments],
        reference_lines=reference_lines,
        inputs=_input_views(spec, domains, shapes, module_shapes, seconds),
        scalars=[(s.name, s.default) for s in spec.scalars],
        special=any(d.special for d in domains if d.name not in {t.name for t in spec.tensors if t.discrete}),
        gradients=gradients,
        upstream=[g.name for g in program.parsed.grads],
        outputs=list(spec.outputs) if len(program.outputs) > 1 else [],
        structured=program.structured,
        custom_op=custom_op,
        sizes=list(spec.module_sizes),
        learnable=any(t.learnable for t in spec.tensors),
        rows=rows,
    )


def _custom_gradients(code: _CodePrinter, program: Program) -> list[tuple[str, str]]:
    """Each custom gradient's formula for the test, over the arguments and the upstream gradients (as the
    op's backward reads them: a reduced output's with the reduced dimensions kept)."""
    code.scope()
    upstream = {}
    for grad, output in zip(program.parsed.grads, program.outputs):
        call = spread_reduction(program, output.value) if program.structured else None
        upstream[grad] = sympy.Symbol(unsqueezed(grad.name, call) if call is not None else grad.name, real=True)
    code.tensors |= {s.name for s in upstream.values()}
    return [(name, code(expr.xreplace(upstream))) for name, expr in program.parsed.gradients]


def _input_views(
    spec: OpSpec,
    domains: tuple[InputDomain, ...],
    shapes: list[tuple[int, ...]],
    module_shapes: list[tuple[int, ...]],
    seconds: list[tuple[int, ...]],
) -> list[InputView]:
    """Each tensor's ``Input(...)`` in the test file, and a comment on where its values come from."""
    by_name = {d.name: d for d in domains}
    typical = _typical_values(domains)
    module_sizes = dict(spec.module_sizes)
    inputs = []
    for t, shape, module_shape, second in zip(spec.tensors, shapes, module_shapes, seconds):
        if t.discrete:
            inputs.append(_discrete_input_view(t, shape, module_shape, second))
            continue
        d = by_name[t.name]
        arguments = [f'"{t.name}"', _shape(shape), f"low={d.low!r}", f"high={d.high!r}"]
        if typical[t.name] != 1.0:
            arguments.append(f"typical={typical[t.name]!r}")
        for field, values in (("avoid", d.avoid), ("extremes", _extremes(d)), ("special", d.special)):
            if values:
                arguments.append(f"{field}={_shape(values)}")
        if t.learnable:
            arguments.append("learnable=True")
        if module_shape != shape:
            arguments.append(f"module_shape={_shape(module_shape)}")
        if second != shape:
            arguments.append(f"second_shape={_shape(second)}")
        if any(name in module_sizes for name in t.size_names):
            arguments.append(f"size_names={_shape(tuple(n if n in module_sizes else None for n in t.size_names))}")
        if t.learnable:
            arguments.append(f"init={_test_init(spec, t, d)}")
        comment = f"{t.name}: {_domain_description(d)}; {_support_description(d)}"
        inputs.append(InputView(arguments, textwrap.wrap(comment, COMMENT_WIDTH)))
    return inputs


def _discrete_input_view(
    t, shape: tuple[int, ...], module_shape: tuple[int, ...], second: tuple[int, ...]
) -> InputView:
    """An int64 tensor's ``Input(...)``: drawn as integers in its domain, both ends included; a bool
    tensor's: drawn True and False, with a True in each line (testing._one_true_per_line)."""
    if t.boolean:
        arguments = [f'"{t.name}"', _shape(shape), 'dtype="bool"']
        comment = (
            f"{t.name}: a bool mask, drawn True and False at random, with at least one True along each "
            "dimension (no empty row to divide by); no gradient"
        )
    else:
        low, high = t.domain
        arguments = [f'"{t.name}"', _shape(shape), f"low={low}", f"high={high}", 'dtype="int64"']
        comment = f"{t.name}: int64 class indices, drawn from {low} to {high} (declared in the spec); no gradient"
    if module_shape != shape:
        arguments.append(f"module_shape={_shape(module_shape)}")
    if second != shape:
        arguments.append(f"second_shape={_shape(second)}")
    return InputView(arguments, textwrap.wrap(comment, COMMENT_WIDTH))


def _test_init(spec: OpSpec, t, domain: InputDomain) -> str:
    """``Init(...)`` of the learnable tensor ``t`` in the test file (:class:`scaffold.testing.Init`)."""
    scheme = t.scheme
    if scheme is None or scheme.constant is not None:
        value = domain.init if scheme is None else scheme.constant
        return f'Init("constant", ({value!r},))'
    if scheme.scheme in ("normal", "uniform"):
        return f'Init("{scheme.scheme}", {scheme.args!r})'
    if scheme.scheme == "linear" and len(t.shape) < 2:
        return f'Init("linear", weight="{linear_weight(spec, t).name}")'
    return f'Init("{scheme.scheme}")'


#: Width of generated comment lines, before their indentation.
COMMENT_WIDTH = 100
#: The width of a docstring's text that is a paragraph of its own (indented by 4).
DOC_WIDTH = 116


#: Sizes the generated tests give the broadcast dimensions of the example shapes, the last one first: a
#: few distinct sizes catch transposed dimensions, more dimensions get 2 so that gradcheck stays small.
SMALL_SIZES = (4, 3)


def small_shapes(spec: OpSpec) -> list[tuple[int, ...]]:
    """Shapes that broadcast as the spec's example shapes do, whatever their size: each dimension
    (counted from the right) whose broadcast size is above 1 gets a small size of its own, the same in
    every tensor that has it; a dimension of size 1 stays 1."""
    rank = max(len(t.shape) for t in spec.tensors)
    broadcast = [max((t.shape[-d] for t in spec.tensors if len(t.shape) >= d), default=1) for d in range(1, rank + 1)]
    sizes, wide = {}, 0
    for d, size in enumerate(broadcast, start=1):
        if size > 1:
            sizes[d] = SMALL_SIZES[wide] if wide < len(SMALL_SIZES) else 2
            wide += 1
    return [tuple(1 if n == 1 else sizes[len(t.shape) - i] for i, n in enumerate(t.shape)) for t in spec.tensors]


#: The leading dimension the generated tests' second shape adds; the other sizes grow by one, so that it
#: differs from each of them.
SECOND_BATCH = 2


def second_shapes(
    spec: OpSpec,
    shapes: list[tuple[int, ...]],
    fits: Callable[[list[tuple[int, ...]]], bool],
    fixed: frozenset[int] = frozenset(),
) -> list[tuple[int, ...]]:
    """The tests' second shapes (``Input.second_shape``): each size above 1 of ``shapes`` one larger (equal
    sizes stay equal, so that broadcasting and a product's inner dimensions still fit), and a leading
    dimension of SECOND_BATCH more for the tensors that are not learnable and have the most dimensions of
    those, as a batch of calls has; without that dimension where ``fits`` says the op cannot take it (a
    vector that must stay one, a learnable tensor's dimensions it would no longer broadcast with). Then
    each 0-d tensor at the shape of the others (:func:`_per_element`). The sizes in ``fixed`` (a one_hot's
    number of classes) stay as they are."""
    resized = [tuple(n if n == 1 or n in fixed else n + 1 for n in shape) for shape in shapes]
    ranks = [len(shape) for t, shape in zip(spec.tensors, shapes) if not t.learnable]
    candidates = [resized]
    if ranks:

        def batched(t, shape, indices: bool) -> tuple[int, ...]:
            # the batch goes to the data: the inputs of the most dimensions, and (where it fits) the int64
            # and bool ones beside them, class indices or masks per row of a batched input
            data = not t.learnable and (len(shape) == max(ranks) or (indices and t.discrete and shape))
            return (SECOND_BATCH, *shape) if data else shape

        candidates = [
            [batched(t, shape, indices) for t, shape in zip(spec.tensors, each)]
            for each in (resized, shapes)
            for indices in (True, False)
        ]
        candidates.insert(2, resized)
    # sizes one larger where the op takes them; else the example's (cat's operands add up to another
    # input's size, a reshape's sizes hold the elements), with the batch where it fits
    seconds = next((c for c in candidates if fits(c)), resized)
    return _per_element(seconds, fits)


def _per_element(shapes: list[tuple[int, ...]], fits: Callable[[list[tuple[int, ...]]], bool]) -> list[tuple[int, ...]]:
    """``shapes`` with each 0-d tensor (a parameter declared ``[]``, theta) at the shape the others broadcast
    to, where ``fits`` says the op takes it: a user may give it per element, and its gradient must then have
    that shape (one summed to (), each element given the total, passes every check at a 0-d theta)."""
    shapes = list(shapes)
    for i, shape in enumerate(shapes):
        others = [s for k, s in enumerate(shapes) if k != i]
        if shape or not others:
            continue
        try:
            full = _broadcast_checked(others)
        except ValueError:
            continue
        if full and fits(candidate := [*shapes[:i], full, *shapes[i + 1 :]]):
            shapes = candidate
    return shapes


def _broadcasts(shapes: list[tuple[int, ...]]) -> bool:
    try:
        _broadcast_checked(shapes)
    except ValueError:
        return False
    return True


def _program_fits(spec: OpSpec, program: Program, shapes: list[tuple[int, ...]]) -> bool:
    """Whether a structured op takes inputs of ``shapes``: its shapes fit together there (as the example's
    are checked) and each input has the rank _check_ranks asks for."""
    ranks = dict(zip((t.name for t in spec.tensors), map(len, shapes)))
    for r in rank_requirements(program):
        if ranks[r.tensor] < r.rank or (r.exact and ranks[r.tensor] != r.rank):
            return False
    # Sizes as numbers: a size name holds the example's value.
    tensors = tuple(dataclasses.replace(t, shape=tuple(s), size_names=()) for t, s in zip(spec.tensors, shapes))
    try:
        build_program(program.parsed, dataclasses.replace(spec, tensors=tensors, sizes=()))
    except ScaffoldError:
        return False
    return True


def _module_shapes(spec: OpSpec, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Shapes for the Module's test: learnable tensors keep their example shapes (those of the Module's
    parameters); the other tensors take small sizes except in the dimensions a parameter fixes."""
    fixed = {}  # dimension counted from the right -> its size in the parameters
    for t in spec.tensors:
        if t.learnable:
            fixed.update({d: n for d, n in enumerate(reversed(t.shape), start=1) if n > 1})
    result = []
    for t, small in zip(spec.tensors, shapes):
        if t.learnable:
            result.append(tuple(t.shape))
        else:
            rank = len(t.shape)
            result.append(tuple(fixed.get(rank - i, n) if n > 1 else 1 for i, n in enumerate(small)))
    return result


def _reference_lines(code: _CodePrinter, parsed: ParsedExpression) -> list[str]:
    """The body of ``reference``: the forward as written (not its stable rewrite), in plain torch, its
    repeated subexpressions assigned once.

    The generated test compares the op with it (which checks the rewrite as well as the backward) and
    ``scaffold bench`` times autograd through it.
    """
    names = {*parsed.symbols, *(s.name for s in parsed.steps), *(g.name for g in parsed.grads), OUTPUT, GRAD_OUTPUT}
    names |= {n + TANGENT_SUFFIX for n in parsed.tensor_names}
    steps, exprs = straight_line(list(parsed.exprs), names)
    # no upstream gradient here: a case distinction between numbers takes its dtype from a float argument
    anchor = code.anchor, code.anchor_text
    floats = [n for n in parsed.tensor_names if n not in code.discrete]
    if floats:
        code.anchor = code.anchor_text = floats[0]
    try:
        return code.steps(steps) + [f"return {', '.join(code(e) for e in exprs)}"]
    finally:
        code.anchor, code.anchor_text = anchor


def reference_module(spec: OpSpec, parsed: ParsedExpression) -> str:
    """Source of a module defining ``reference(<the op's arguments>)``, the forward in plain torch."""
    code = _CodePrinter(spec)
    lines = _reference_lines(code, parsed)
    imports = _import_lines(code.imports) + ["import torch"]
    params = ", ".join(a.name for a in spec.arguments)
    body = "".join(f"    {line}\n" for line in lines)
    return "\n".join(imports) + f"\n\n\ndef reference({params}):\n{body}"


#: Inputs of the extreme-input test: distances from 0 on each side, or from the finite end of a support
#: bounded on one side (log: 1e-3 to 1e4; log1p: -1 + 1e-3 to -1 + 1e4).
EXTREMES = (1e-3, 1.0, 10.0, 30.0, 100.0, 1e4)
#: How far inside an open end of a bounded support the extreme-input test goes, relative to its half-width.
END_DISTANCE = 1e-3


def _extremes(d: InputDomain) -> tuple[float, ...]:
    """Large and tiny inputs inside the tensor's support, away from its kinks and poles.

    Unbounded: +-1e-3 to +-1e4. Bounded on one side: 1e-3 to 1e4 away from that end. Bounded on both:
    each end (moved 1e-3 of the half-width inside if open), the quarter points, and +-1e-3 where 0 is
    inside (else the midpoint): [-2, 2] gives -2, -1, -1e-3, 1e-3, 1, 2; (-1, 1) gives +-0.999, +-0.5, +-1e-3.
    """
    s = d.support
    if math.isinf(s.low) and math.isinf(s.high):
        values = [*(-x for x in EXTREMES), *EXTREMES]
    elif math.isinf(s.high):
        values = [s.low + x for x in EXTREMES]
    elif math.isinf(s.low):
        values = [s.high - x for x in EXTREMES]
    else:
        inside = END_DISTANCE * (s.high - s.low) / 2
        quarter = (s.high - s.low) / 4
        values = [
            s.low if s.low_closed else s.low + inside,
            s.low + quarter,
            s.high - quarter,
            s.high if s.high_closed else s.high - inside,
        ]
        values += [-1e-3, 1e-3] if s.low < 0 < s.high else [(s.low + s.high) / 2]
    rounded = {float(f"{v:.6g}") for v in values}
    kept = sorted(v for v in rounded if v in s and all(abs(v - a) > 1e-2 for a in d.avoid))
    return tuple(kept) or (_typical(d),)


def _typical(d: InputDomain, taken: set[float] = frozenset()) -> float:
    """An ordinary value of the tensor, for the others' tests: 1.0 if the tests draw it, else another
    point of the interval they draw from, away from its kinks and poles and from the magnitudes in
    ``taken`` (other tensors' ordinary values: ties sit on kinks such as Max(x, y))."""
    width = d.high - d.low
    candidates = [1.0, 0.5, 1.5, 0.75, 1.25, 2.0, *(d.low + width * k / 16 for k in (8, 5, 11, 3, 13, 7, 9))]
    for value in candidates:
        value = round(value, 6)
        if d.low <= value <= d.high and all(abs(value - a) > 0.1 for a in d.avoid) and abs(value) not in taken:
            return value
    return round((d.low + d.high) / 2, 6)


def _typical_values(domains: tuple[InputDomain, ...]) -> dict[str, float]:
    """Ordinary values of the tensors, of distinct magnitudes where the domains allow."""
    taken: set[float] = set()
    values = {}
    for d in domains:
        values[d.name] = _typical(d, taken)
        taken.add(abs(values[d.name]))
    return values


def _domain_description(d: InputDomain) -> str:
    text = f"uniform in [{d.low!r}, {d.high!r}] ({d.reason})"
    if d.avoid:
        text += ", away from " + ", ".join(map(repr, d.avoid))
    return text


def _support_description(d: InputDomain) -> str:
    return f"defined on {d.support} ({d.support_reason})"


#: What a function of the module returns, by name: the base of its return statement's temporaries (stage 6a).
_RETURNED = {"forward": OUTPUT, "_forward": OUTPUT, "jvp": OUTPUT + TANGENT_SUFFIX}


def _module_text(template: jinja2.Template, view: ProgramView) -> str:
    """The module as ``template`` lays it out, its long statements split into named temporaries (stage 6a)."""
    return name_parts(template.render(view=view), _RETURNED)


def _in_place(template: jinja2.Template, view: ProgramView, forward_kinds: dict[str, Kind]) -> str:
    """The module's text, its Function's forward and its _backward computing in place where they can (stage
    6b; not in fused mode, where the compiler plans the memory), the forward's parameters of
    ``forward_kinds``. Rendered with ``_out_of_place`` (torch.func runs an in-place _backward functionalized)
    and with the forward as written in _forward for torch.compile's twin first, and again without either
    where the forward or _backward has nothing to reuse."""
    if view.fuse:
        return _module_text(template, view)

    def rendered(backward: bool, forward: bool) -> tuple[str, str, str]:
        """The text as rendered, with its forward rewritten, and with its forward and _backward rewritten."""
        module = _module_text(template, dataclasses.replace(view, backward_in_place=backward, forward_in_place=forward))
        forward_rewritten = reuse_temporaries(module, f"{view.camel}Function.forward", forward_kinds)
        return module, forward_rewritten, reuse_temporaries(forward_rewritten, "_backward", view.parameter_kinds)

    module, forward, both = rendered(True, True)
    forward_in_place, backward_in_place = forward != module, both != forward
    if forward_in_place and backward_in_place:
        return both
    _, forward, both = rendered(backward_in_place, forward_in_place)
    return both if backward_in_place else forward


def render_op(
    spec: OpSpec,
    derivation: ProgramDerivation,
    plan: ProgramPlan,
    domains: tuple[InputDomain, ...],
    *,
    module_import: str | None = None,
    shared_device_fixture: bool = False,
    testing_module: str = TESTING_MODULE,
    project_root: str | Path | None = None,
    paths: Mapping[str, str | PurePath] | None = None,
    in_package: bool = False,
    in_place: bool = True,
) -> dict[str, str]:
    """Render the op's module and its test file: ``{relative path: text}``.

    ``module_import`` is the module the test imports the op from; with ``shared_device_fixture`` the test
    file takes its ``device`` fixture from the project's conftest.py instead of defining its own;
    ``testing_module`` is where it imports scaffold's test library from. The module imports the runtime
    (:func:`render_runtime`) from beside it: with ``in_package`` (a project's op) from its package alone,
    else from its package or, as a module on sys.path, as a module of its own.

    The templates are filled in memory, then ruff formats the result (:mod:`scaffold.formatting`), the last
    step: with the ruff settings of the project at ``project_root``, where ``paths`` says where each file
    goes relative to it (default: the file's name), or without one in scaffold's own style.

    ``in_place=False`` skips stage 6b: every temporary stays out of place.
    """
    env = environment()
    # A custom op's namespace: the project's package (the first part of the module the op lives in)
    namespace = module_import.partition(".")[0] if module_import and "." in module_import else DEFAULT_NAMESPACE
    view = program_module_view(spec, derivation, plan, domains, namespace)
    template, forward_kinds = env.get_template(TEMPLATES["program"]), view.forward_kinds
    custom_op = (f"{spec.name}_op" if plan.hidden else spec.name) if spec.target == "custom_op" else ""
    view = dataclasses.replace(view, in_package=in_package)
    module = _in_place(template, view, forward_kinds) if in_place else _module_text(template, view)
    tests = functools.partial(test_view, spec, derivation.program, domains, custom_op=custom_op, rows=bool(plan.rows))
    return _finished(spec, module, tests, module_import, shared_device_fixture, testing_module, project_root, paths)


def _finished(
    spec: OpSpec,
    module: str,
    tests: Callable[..., TestView],
    module_import: str | None,
    shared_device_fixture: bool,
    testing_module: str,
    project_root: str | Path | None,
    paths: Mapping[str, str | PurePath] | None,
) -> dict[str, str]:
    """The module and its test file (from the view ``tests`` makes), checked to parse and formatted (ruff)
    as the project at ``project_root`` would."""
    view = tests(
        module_import=module_import or spec.name,
        testing_module=testing_module,
        own_device_fixture=not shared_device_fixture,
    )
    test = environment().get_template(TEMPLATES["test"]).render(view=view)
    files = {f"{spec.name}.py": module, f"test_{spec.name}.py": test}
    for path, text in files.items():
        try:
            ast.parse(text, filename=path)
        except SyntaxError as exc:  # a bug in scaffold, not in the user's input
            raise DerivationError(
                f"the generated {path} does not parse (line {exc.lineno}: {exc.msg}); please report this",
                where=spec.source,
            ) from exc
    where = {path: (paths or {}).get(path, path) for path in files}
    modules = {module_import or spec.name: where[f"{spec.name}.py"]}
    return {path: format_source(text, where[path], root=project_root, modules=modules) for path, text in files.items()}


@dataclass(frozen=True)
class CheckTestView:
    """What ``templates/check_test.py.j2`` lays out: ``scaffold check --write-tests``' pytest file."""

    version: str
    target: str  # as given on the command line
    target_name: str
    relative: bool  # a file target, found relative to the test file
    path: str  # the file, or the folder a module was imported from, relative to the test file's folder
    attribute: str
    call: str | None
    strict: bool
    spec_text: str


def render_check_tests(view: CheckTestView) -> str:
    """The test file of ``scaffold check --write-tests``, formatted."""
    text = environment().get_template(TEMPLATES["check_test"]).render(view=view)
    return format_source(text, f"test_check_{view.target_name}.py")


def render_runtime(*, project_root: str | Path | None = None, path: str | PurePath = RUNTIME_FILE) -> str:
    """The runtime module that every generated op imports (``templates/_scaffold_runtime.py.j2``): the same
    text for every op, formatted as the project at ``project_root`` would format ``path`` (default:
    scaffold's own style, rendered once)."""
    if project_root is None:
        return _standalone_runtime()
    text = environment().get_template(TEMPLATES["runtime"]).render(version=__version__)
    return format_source(text, path, root=project_root)


@cache
def _standalone_runtime() -> str:
    text = environment().get_template(TEMPLATES["runtime"]).render(version=__version__)
    return format_source(text, RUNTIME_FILE)


# -- structured programs (reductions, softmax, products): templates/program_op.py.j2 ---------------------


@dataclass(frozen=True)
class ProgramView(_Entry):
    """What ``templates/program_op.py.j2`` lays out: a structured op's code, from :mod:`.dataflow`."""

    version: str
    source: str
    name: str
    camel: str
    doc: str
    forward_doc: list[str]  # the forward as written, a line per step
    rules_doc: list[str]
    partials_doc: list[tuple[str, str]]
    one_step: bool  # the forward is one elementwise step: its partial derivatives say how backward goes
    stable_note: str  # which stable primitives the forward was rewritten with, if any
    kink_note: str  # PyTorch's convention at kinks, where the forward has any
    imports: list[str]
    arguments: list[str]
    tensor_names: list[str]
    scalar_names: list[str]
    functional_params: list[str]
    returns_type: str
    apply_suffix: str
    forward_lines: list[str]  # the forward's statements, its return last
    returns: list[str]
    unpack: list[str]
    output_unpack: list[str]
    optional_grads: bool
    # the tensors whose tangent jvp may receive as None: every one where setup_context turns off
    # materializing (autograd passes zeros for a missing tangent otherwise, as torch.func's jvp does)
    unmaterialized_tangents: list[str]
    masks: list[str]
    saved: list[str]
    saved_comment: list[str]
    ctx_scalars: list[str]
    shapes: list[str]
    zero_outputs: list[str]  # outputs whose gradient may be None (filled with zeros)
    upstream: list[str]
    zero_fills: list[tuple[str, str]]
    unused_outputs: list[str]  # the gradients, None where unused: backward skips what they pass on
    backward_scalars: list[str]
    grads: list[str]
    unset_grads: list[str]  # the gradients _backward sets to None first: each one its first statement may not set
    backward_blocks: list[Block]
    returns_backward: list[str]
    jvp_params: list[str]
    jvp_scalars: list[str]
    jvp_reads: list[str]  # the tensor arguments jvp reads: setup_context saves them for forward mode
    jvp_lines: list[str]
    jvp_returns: list[str]
    module: ModuleCode
    sizes_check: SizeChecks | None  # _check_sizes, where tensors share a size name
    fuse: bool
    neg_abs: bool  # fused code calls _neg_abs
    # hidden outputs' gradients backward takes: not None only in a second derivative (or a gradcheck)
    returned_grads: list[str]
    backward_params: list[str]
    backward_args: list[str]
    parameter_kinds: dict[str, Kind] = dataclasses.field(default_factory=dict)
    backward_in_place: bool = False  # _backward overwrites temporaries: run functionalized where recorded
    forward_in_place: bool = False  # Function.forward overwrites temporaries; _forward, as written, does not
    forward_kinds: dict[str, Kind] = dataclasses.field(default_factory=dict)  # the arguments, for stage 6b
    custom_op: CustomOpView | None = None
    in_package: bool = False  # a project's op: the runtime is imported from the package alone
    rank_checks: list[RankCheck] = dataclasses.field(default_factory=list)  # _check_ranks, where some are
    rank_check_params: list[str] = dataclasses.field(default_factory=list)
    module_check_args: list[str] = dataclasses.field(default_factory=list)
    # the spec's custom gradients, as written, and how they name the upstream gradients
    custom_gradients: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    custom_grad_names: str = ""
    double: DoubleBackwardView | None = None  # None: autograd differentiates _backward for a second derivative
    backward_fused: bool = False  # fused mode compiles backward too (not where it is one ATen kernel)
    rows: RowsView | None = None  # fused mode's Triton kernels (templates/_rows.py.j2)

    @property
    def entry(self) -> str:
        """What the functional and the Module call: the Triton kernels' entry point where there are kernels."""
        return "_rows_apply" if self.rows else super().entry

    @property
    def backward_doc(self) -> str:
        """_backward's docstring, one paragraph as the elementwise path writes it: whose math it is, how it
        runs, and whether it works in place."""
        text = f"The gradients' math, from {self.camel}Function's saved tensors"
        if self.double:
            text += f" (and _{self.camel}Backward's forward)" + (", run through torch.compile" * self.backward_fused)
        elif self.backward_fused:
            text += "; run through torch.compile, except in a second derivative"
        if self.fuse and not self.backward_fused:
            text += (
                ". Not compiled: it is one ATen kernel, which torch.compile would fuse with nothing and call "
                "through its own overhead"
            )
        if self.backward_in_place:
            text += ". It overwrites its temporaries in place where nothing else reads them; " + (
                "torch.func transforms run it through _runtime.out_of_place"
                if self.double
                else "where autograd or a torch.func transform records this code (a second derivative), it runs "
                "through _runtime.out_of_place"
            )
        return "\n    ".join(textwrap.wrap(f'"""{text}."""', DOC_WIDTH))

    @property
    def defines_forward(self) -> bool:
        """Whether the module defines _forward itself (fused: torch.compile's); else _apply.py.j2 does,
        where the Function's forward computes in place, for torch.compile's twin."""
        return self.fuse


@dataclass(frozen=True)
class RowGradient:
    """One tensor argument's gradient in the row kernels' Function."""

    name: str  # grad_<argument>
    argument: str
    index: int  # its position among the op's arguments (ctx.needs_input_grad)
    allocate: str  # the tensor the kernel writes it to
    summed: bool  # the kernel writes each program's sum over its rows: the host sums those


@dataclass(frozen=True)
class RowsView:
    """What templates/_rows.py.j2 lays out: the row kernels (:mod:`.rows`) and the host code around them."""

    forward: tuple[str, ...]
    backward: tuple[str, ...]
    lead: str
    outputs: list[dict[str, str]]  # name, shape
    tensors: list[str]
    contiguous: list[str]
    numbers: list[str]
    ctx_numbers: list[str]
    upstream: list[str]
    upstream_contiguous: list[str]
    grads: list[RowGradient]
    grad_pointers: list[str]
    returns: list[str]
    floats: list[str]
    indices: list[str]
    conditions: tuple[str, ...]
    accumulated: list[str]
    suffix: str
    comment: list[str]  # the lines of the comment above the kernels
    # sums and means over every row: each row's part from the forward kernel, added up on the host
    parts: list[dict[str, str]] = dataclasses.field(default_factory=list)  # name, total (its formula)
    totals: list[str] = dataclasses.field(default_factory=list)  # the totals' names, as _totals takes them
    epilogue: list[str] = dataclasses.field(default_factory=list)  # _totals' lines
    total_outputs: list[str] = dataclasses.field(default_factory=list)  # the outputs _totals returns
    total_upstream: list[str] = dataclasses.field(default_factory=list)  # their gradients
    kernel_outputs: list[str] = dataclasses.field(default_factory=list)  # the outputs the kernel writes
    kernel_upstream: list[str] = dataclasses.field(default_factory=list)  # their gradients
    imports: list[str] = dataclasses.field(default_factory=list)  # what _totals' math needs


def rows_view(kernels: RowKernels, arguments: list[str], suffix: str) -> RowsView:
    """The row kernels' view: the kernels' text and what the host passes them, allocates and returns."""
    lead = kernels.lead
    shapes = {VECTOR: f"{lead}.shape", ROW: f"{lead}.shape[:-1] + (1,)", ROW_FLAT: f"{lead}.shape[:-1]", TOTAL: ""}
    tensors = [a.name for a in kernels.tensors]
    upstream = [f"grad_{i}" for i in range(len(kernels.outputs))]
    grads = []
    for argument in kernels.arguments:
        if not argument.differentiable:
            continue
        name, summed = argument.name, argument.role in (COLUMN, WHOLE)
        if summed:
            size = "(programs, n_cols)" if argument.role == COLUMN else "(programs,)"
            allocate = f"{lead}.new_empty({size}, dtype=_runtime.accumulation_dtype({lead}))"
        else:
            allocate = f"torch.empty_like({name}, memory_format=torch.contiguous_format)"
        grads.append(RowGradient(f"grad_{name}", name, arguments.index(name), allocate, summed))
    by_name = {g.argument: g.name for g in grads}
    summed = [a.name for a in kernels.accumulated]
    outputs = [
        {"name": f"out{i}", "shape": shapes[o.role], "total": o.role == TOTAL} for i, o in enumerate(kernels.outputs)
    ]
    epilogue, imports = _rows_epilogue(kernels)
    comment = (
        "fuse = true: Triton kernels written from the same derivation as the Function's code. Forward runs one "
        "program per row of the last dimension, the row in registers. Backward runs a few programs per "
        "multiprocessor, each looping over its rows: it recomputes the forward from the inputs (in registers, "
        "no memory traffic) and passes the gradient back step by step"
        + (f", summing the gradient of {' and '.join(summed)} over its rows" if summed else "")
        + ". Values are computed in float32 (float64 for float64 tensors) and stored in the tensors' dtype. "
        "v_<name> is the forward's value <name>, d_<name> its gradient, p_<name> a tensor's pointer. "
        "_runtime.RowKernel compiles each kernel on its first launch."
    )
    return RowsView(
        forward=kernels.forward,
        backward=kernels.backward,
        lead=lead,
        outputs=outputs,
        tensors=tensors,
        contiguous=[f"{n}.contiguous()" for n in tensors],
        numbers=[a.name for a in kernels.numbers],
        ctx_numbers=[f"ctx.{a.name}" for a in kernels.numbers],
        upstream=upstream,
        upstream_contiguous=[f"{g}.contiguous()" for g in upstream],
        grads=grads,
        grad_pointers=[f"{g.name} if {g.name} is not None else {lead}" for g in grads],
        returns=[by_name.get(n, "None") for n in arguments],
        floats=[a.name for a in kernels.tensors if not a.integer],
        indices=[a.name for a in kernels.tensors if a.integer],
        conditions=kernels.conditions,
        accumulated=summed,
        suffix=suffix,
        comment=textwrap.wrap(comment, DOC_WIDTH - 2),
        parts=[{"name": f"part_{t.name}", "total": _total_formula(t, lead)} for t in kernels.totals],
        totals=[t.name for t in kernels.totals],
        epilogue=epilogue,
        total_outputs=[o["name"] for o in outputs if o["total"]],
        total_upstream=[u for u, o in zip(upstream, outputs) if o["total"]],
        kernel_outputs=[o["name"] for o in outputs if not o["total"]],
        kernel_upstream=[u for u, o in zip(upstream, outputs) if not o["total"]],
        imports=imports,
    )


def _total_formula(total: RowTotal, lead: str) -> str:
    """A total from its rows' parts, on the host: their sum, or mean over the elements it reduces."""
    part = f"part_{total.name}.sum()"
    if not total.mean:
        return part
    return f"{part} / {lead}.numel()" if total.per_element else f"{part} / len(part_{total.name})"


def _rows_epilogue(kernels: RowKernels) -> tuple[list[str], list[str]]:
    """_totals' lines: the math on the totals (elementwise, on 0-d tensors) and its return of the outputs
    that are totals, in order; with the imports it needs."""
    lines, imports = [], set()
    totals = {t.name for t in kernels.totals} | {name for name, _ in kernels.epilogue}
    for name, formula in kernels.epilogue:
        printed = print_torch(formula, totals, where=f"the totals' {name}")
        lines.append(f"{name} = {printed.text}")
        imports |= printed.imports
    returned = [o.value for o in kernels.outputs if o.role == TOTAL]
    if returned:
        lines.append(f"return {', '.join(returned)}{',' if len(returned) == 1 else ''}")
    return lines, sorted(IMPORTS[i] for i in imports)


@dataclass(frozen=True)
class RankCheck:
    """One comparison of ``_check_ranks``: the condition under which an input's rank is refused, and the
    error's message (the body of an f-string)."""

    condition: str
    message: str


def _rank_checks(spec: OpSpec, requirements: tuple[RankRequirement, ...]) -> list[RankCheck]:
    checks = []
    for r in requirements:
        dims = f"{r.rank} dimension{'s' if r.rank != 1 else ''}"
        need, condition = (
            (f"exactly {dims}", f"{r.tensor}.dim() != {r.rank}")
            if r.exact
            else (
                f"at least {dims}",
                f"{r.tensor}.dim() < {r.rank}",
            )
        )
        reason = r.reason.replace("{", "{{").replace("}", "}}").replace('"', "'")
        message = f"{spec.name}: {r.tensor} must have {need} ({reason}), got shape {{tuple({r.tensor}.shape)}}"
        checks.append(RankCheck(condition, message))
    return checks


def program_module_view(
    spec: OpSpec,
    derivation: ProgramDerivation,
    plan: ProgramPlan,
    domains: tuple[InputDomain, ...],
    namespace: str = DEFAULT_NAMESPACE,
) -> ProgramView:
    program = derivation.program
    requirements = rank_requirements(program)
    learnable = {t.name for t in spec.tensors if t.learnable}
    tensor_names = [t.name for t in spec.tensors]
    scalar_names = [s.name for s in spec.scalars]
    arguments = tensor_names + scalar_names
    scalar_params = [f"{s.name}: {s.type} = {s.default!r}" for s in spec.scalars]
    module = module_code(spec, domains, entry_checks=spec.target == "custom_op" and not plan.hidden)
    optional = bool(plan.hidden) or len(plan.visible) > 1
    ctx_scalars = sorted(set(plan.backward_scalars) | set(plan.jvp_scalars))
    visible = len(plan.visible)
    zero_fills = optional and not plan.skips_unused  # backward fills an unused output's gradient with zeros
    double, double_imports = _program_double_backward(spec, plan)
    batched = _program_batching(spec, program, plan, requirements)
    fake = "_forward" if spec.fuse else f"{spec.camel}Function.forward"
    blocks = _program_blocks(plan, tensor_names)
    rows = rows_view(plan.rows, arguments, _visible(plan)) if plan.rows else None
    return ProgramView(
        version=__version__,
        source=spec.source,
        name=spec.name,
        camel=spec.camel,
        **_program_docs(spec, derivation, plan, arguments),
        imports=_program_imports(plan, double_imports, module, rows),
        arguments=arguments,
        tensor_names=tensor_names,
        scalar_names=scalar_names,
        functional_params=[f"{n}: torch.Tensor" for n in tensor_names] + scalar_params,
        returns_type=f"tuple[{', '.join('torch.Tensor' for _ in plan.visible)}]" if visible > 1 else "torch.Tensor",
        apply_suffix="" if plan.rows else _visible(plan),
        forward_lines=_returning(list(plan.forward), list(plan.returns)),
        returns=list(plan.returns),
        unpack=[n if n in tensor_names or n in ctx_scalars else "_" for n in arguments],
        output_unpack=[_unpacked(n, plan, program, zero_fills) for n in plan.returns],
        optional_grads=optional,
        # int64 and bool arguments have no tangent to read
        unmaterialized_tangents=[n for n in tensor_names if n not in program.integers] if optional else [],
        # marked non-differentiable: int64 indices returned (an argmax's), a restated softmax's statistics, masks
        masks=[*(n for n in plan.returns if n in program.integers), *plan.constants, *plan.masks],
        saved=list(plan.saved),
        saved_comment=_program_saved_comment(plan),
        ctx_scalars=ctx_scalars,
        shapes=[n for n in plan.shapes if n not in plan.saved],  # kept on ctx: backward has the saved ones
        zero_outputs=[v for v in plan.visible if v not in program.integers] if zero_fills else [],
        upstream=list(plan.upstream) + (["*_"] if plan.masks or plan.constants else []),
        zero_fills=[(g, v) for g, v in zip(plan.upstream, plan.visible) if zero_fills and v not in program.integers],
        unused_outputs=list(plan.upstream) if plan.skips_unused else [],
        backward_scalars=list(plan.backward_scalars),
        grads=[f"grad_{n}" for n in tensor_names],
        unset_grads=_unset([f"grad_{n}" for n in tensor_names], blocks),
        backward_blocks=blocks,
        **_program_fused(spec, plan),
        returned_grads=list(plan.upstream[len(plan.visible) :]),
        backward_params=_program_backward_params(plan),
        backward_args=_program_backward_args(plan),
        parameter_kinds=_program_parameter_kinds(plan),
        forward_kinds=_program_forward_kinds(spec),
        returns_backward=[f"grad_{n}" for n in tensor_names] + ["None"] * len(scalar_names),
        jvp_params=[f"{n}_tangent" for n in tensor_names] + (["*_"] if scalar_names else []),
        jvp_scalars=list(plan.jvp_scalars),
        jvp_reads=_jvp_reads(plan, tensor_names, optional),
        jvp_lines=_returning(list(plan.jvp), list(plan.jvp_returns)),
        jvp_returns=list(plan.jvp_returns),
        module=module,
        sizes_check=size_checks(spec, batched_rule=batched is not None),
        # the fake kernel runs the forward: _forward where fused, else the Function's own (as the elementwise path)
        custom_op=custom_op_view(spec, namespace, visible, plan.hidden, fake, elementwise=False, batched=batched),
        rank_checks=_rank_checks(spec, requirements),
        rank_check_params=[r.tensor for r in requirements],
        module_check_args=[f"self.{r.tensor}" if r.tensor in learnable else r.tensor for r in requirements],
        double=double,
        rows=rows,
    )


def _visible(plan: ProgramPlan) -> str:
    """The subscript that takes _apply's visible outputs (it returns the hidden ones after them), or ""."""
    visible = len(plan.visible)
    return ("[0]" if visible == 1 else f"[:{visible}]") if plan.hidden else ""


def _program_imports(plan: ProgramPlan, double: set[str], module: ModuleCode, rows: RowsView | None) -> list[str]:
    """The module's imports: what the plan's code, the double backward, the Module and the row kernels'
    host math need."""
    reset = [IMPORTS["math"]] if module.reset_imports_math else []
    return sorted({*plan.imports, *double, *reset, *(rows.imports if rows else [])})


def _program_docs(spec: OpSpec, derivation: ProgramDerivation, plan: ProgramPlan, arguments: list[str]) -> dict:
    """The docstrings' fields of an op's view: the op's own text, its forward, the rules and partial
    derivatives its backward follows, the custom gradients as the spec gives them, and the notes on stable
    forms and kinks."""
    program = derivation.program
    forwards = [node.forward for node in derivation.elementwise]
    written = [program.value(node.name).expr for node in derivation.elementwise]
    stable = sorted(
        {type(e).__name__ for f, w in zip(forwards, written) if f != w for e in sympy.preorder_traversal(f)}
        & {cls.__name__ for cls in stable_classes()} - {"kept"}  # kept: a marker of lowering, not a function
    )
    has_kinks = any(f.has(cls) for f in forwards for cls in (*kink_classes(), sympy.Piecewise))
    return {
        "stable_note": f"Rewritten with {', '.join(stable)}: as written, the formula and its derivatives overflow "
        "or lose precision at extreme inputs."
        if stable
        else "",
        "kink_note": KINK_CONVENTION if has_kinks else "",
        "doc": _docstring_text(spec.doc.strip()),
        "forward_doc": _program_forward_doc(spec, program.parsed, arguments),
        "rules_doc": [_docstring_text(r) for r in plan.rule_docs],
        "partials_doc": [(w, _docstring_text(f)) for w, f in plan.elementwise_docs],
        "one_step": not plan.rule_docs and len({w.split(" / ")[0] for w, _ in plan.elementwise_docs}) == 1,
        "custom_gradients": [(name, _docstring_text(" ".join(text.split()))) for name, text in spec.gradients],
        "custom_grad_names": _custom_grad_names(program),
    }


def _jvp_reads(plan: ProgramPlan, tensor_names: list[str], optional: bool) -> list[str]:
    """The tensor arguments jvp reads (where tangents are not materialized, each one's zeros read it)."""
    read = set(re.findall(r"\b\w+\b", "\n".join(plan.jvp)))
    return [n for n in tensor_names if n in read or optional]


def _program_batching(
    spec: OpSpec, program: Program, plan: ProgramPlan, requirements: tuple[RankRequirement, ...]
) -> Batching | None:
    """Where a structured custom op's vmap rule calls the op once (:mod:`.batching`); None: no rule, vmap runs
    the op once per item. Not where it returns a softmax's statistics (fused: backward restates it)."""
    if spec.target != "custom_op" or plan.constants:
        return None
    exact = frozenset(r.tensor for r in requirements if r.exact)
    return batching(program, plan.returns, exact, dict(plan.mask_reads))


def _unset(grads: list[str], blocks: list[Block]) -> list[str]:
    """The gradients that _backward's statements may leave unset (None, then): all but those whose first
    statement sets them, unguarded and without reading them (``grad_x = grad_output * mask``)."""
    lines = [("    " if block.guard else "") + line for block in blocks for line in block.lines]  # nested: indented
    unset = []
    for g in grads:
        read = re.compile(rf"\b{re.escape(g)}\b")
        first = next((line for line in lines if read.search(line)), None)
        if first is None or not first.startswith(f"{g} = ") or read.search(first[len(g) + 3 :]):
            unset.append(g)
    return unset


def _returning(lines: list[str], returns: list[str]) -> list[str]:
    """``lines`` and the statement returning ``returns``: ``return expr`` for a lone value the last line
    computes (not ``out = expr; return out``)."""
    (last, code) = lines[-1].split(" = ", 1) if lines and " = " in lines[-1] else ("", "")
    if len(returns) == 1 and last == returns[0]:
        return [*lines[:-1], f"return {code}"]
    return [*lines, f"return {', '.join(returns)}"]


def _program_saved_comment(plan: ProgramPlan) -> list[str]:
    """The comment on what setup_context saves: where it saves inputs alone, one line ("Saved for backward:
    the inputs x and w"); else a note a line, the inputs in one ("x and w: the inputs"), each other tensor
    with why it is kept."""
    inputs = [n for n, note in zip(plan.saved, plan.saved_notes) if note == f"{n}: an input"]
    notes = [note for n, note in zip(plan.saved, plan.saved_notes) if n not in inputs]
    listed = ", ".join(inputs[:-1]) + " and " + inputs[-1] if len(inputs) > 1 else "".join(inputs)
    the_inputs = f"the input{'s' if len(inputs) > 1 else ''}"
    if not notes:
        return [f"Saved for backward: {the_inputs} {listed}"]
    notes = [f"{listed}: {the_inputs}"] * bool(inputs) + notes
    wrap = functools.partial(textwrap.wrap, width=COMMENT_WIDTH, initial_indent="  ", subsequent_indent="    ")
    return ["Saved for backward:"] + [line for note in notes for line in wrap(note)]


def _program_fused(spec: OpSpec, plan: ProgramPlan) -> dict[str, bool]:
    """The ProgramView fields of fused mode: whether it is on, whether backward is compiled too (not where
    it is one ATen kernel), and whether the code calls _neg_abs."""
    return {"fuse": spec.fuse, "backward_fused": spec.fuse and not plan.one_kernel, "neg_abs": NEG_ABS in plan.helpers}


def _program_backward_args(plan: ProgramPlan) -> list[str]:
    """What Function.backward passes _backward: the upstream gradients, the saved tensors, then from ctx."""
    shapes = [f"{n}.shape" if n in plan.saved else f"ctx.{n}_shape" for n in plan.shapes]  # a saved input's own
    return ["ctx.needs_input_grad", *plan.upstream, *plan.saved, *(f"ctx.{n}" for n in plan.backward_scalars), *shapes]


def _program_backward_params(plan: ProgramPlan) -> list[str]:
    """_backward's parameters, as :func:`_program_backward_args` passes them."""
    return [
        "needs_input_grad",
        *plan.upstream,
        *plan.saved,
        *plan.backward_scalars,
        *(f"{n}_shape" for n in plan.shapes),
    ]


def _program_double_backward(spec: OpSpec, plan: ProgramPlan) -> tuple[DoubleBackwardView | None, set[str]]:
    """A structured op's double backward (see :func:`double_backward_view`), if its plan derives one, and the
    imports its code needs. Backward takes the outputs' gradients (None, or zeros where an output's zeros are
    needed, where it was not used), then the hidden outputs', None but in a second derivative."""
    if plan.double_backward is None:
        return None, set()
    code = _CodePrinter(spec, plan)
    inputs = DoubleBackwardInputs(
        upstream=list(plan.upstream),
        optional=list(plan.upstream[0 if plan.skips_unused else len(plan.visible) :]),
        saved=[*plan.upstream, *plan.saved],
        scalars=list(plan.backward_scalars),
        masks=list(plan.masks),
    )
    tensor_names, params = [t.name for t in spec.tensors], _program_backward_params(plan)
    # its forward: the gradients, compiled where fused (not where they are one ATen kernel)
    function = "_fused_backward" if spec.fuse and not plan.one_kernel else "_backward"
    view = double_backward_view(
        code, plan.double_backward, inputs, tensor_names, params, camel=spec.camel, function=function
    )
    assert not code.helpers, code.helpers  # derived from the partials, not printed in fused code's forms
    return view, {IMPORTS[a] for a in code.imports}


def _program_forward_doc(spec: OpSpec, parsed, arguments: list[str]) -> list[str]:
    """The forward on one line ("xc / sqrt(var + eps), where mu = ...; ..."), then its steps one a line."""
    written = parsed.written or " ".join(spec.forward.split())
    doc = [_docstring_text(f"{spec.name}({', '.join(arguments)}) = {written}")]
    doc += [_docstring_text(f"{s.name} = {s.text}") for s in parsed.steps]
    if parsed.steps:
        doc.append(_docstring_text(f"return {parsed.output_text}"))
    return doc


def _custom_grad_names(program: Program) -> str:
    """The docstring's sentence on a structured op's custom gradients, naming the upstream gradients."""
    names = []
    for grad, output in zip(program.parsed.grads, program.outputs):
        call = spread_reduction(program, output.value)
        spread = f" with the reduced dimensions kept, {unsqueezed('grad_output', call)}" if call is not None else ""
        names.append(f"{grad.name} is {repr(output.name) if output.name else 'the output'}'s gradient{spread}")
    return (
        "Custom gradients: backward returns these instead of the derived ones, and forward mode (jvp) keeps the "
        f"forward's own derivative; {'; '.join(names)}:"
    )


def _program_parameter_kinds(plan: ProgramPlan) -> dict[str, Kind]:
    """What _backward's parameters are, for stage 6b: each tensor with the dimensions in which its example
    shape is above 1 (counted from the right) standing for the arguments its shape broadcasts from: a
    tensor broadcasts into another where its dimensions are a subset (the program's shapes are those of
    the example, up to sizes); masks as masks, scalars as numbers."""
    kinds: dict[str, Kind] = {}
    sources = dict(plan.parameter_sources)
    for name, shape in plan.parameter_shapes:
        # and its rank: a (16,) receiver cannot take a (1, 16) operand, whose result has two dimensions;
        # and the arguments whose leading dimensions it has at call time: a target (8,) cannot take a
        # (8,) operand computed from a batch of inputs, (2, 8) at call time
        dims = {f"dim{d - len(shape)}" for d, n in enumerate(shape) if n > 1}
        dims |= {f"from:{s}" for s in sources.get(name, ())}
        kinds[name] = Kind(TENSOR, frozenset(dims | {f"rank{k}" for k in range(1, len(shape) + 1)}))
    for mask in plan.masks:
        kinds[mask] = Kind(BOOL, frozenset())
    for name in plan.backward_scalars:
        kinds[name] = Kind(NUMBER)
    return kinds


def _program_forward_kinds(spec: OpSpec) -> dict[str, Kind]:
    """What the forward's parameters are, for stage 6b: each tensor with the dimensions in which its
    example shape is above 1 and its rank (as :func:`_program_parameter_kinds`), scalars as numbers."""
    kinds = {s.name: Kind(NUMBER) for s in spec.scalars}
    for t in spec.tensors:
        shape = tuple(t.shape)
        dims = {f"dim{d - len(shape)}" for d, n in enumerate(shape) if n > 1} | {f"from:{t.name}"}
        kinds[t.name] = Kind(TENSOR, frozenset(dims | {f"rank{k}" for k in range(1, len(shape) + 1)}))
    return kinds


def _unpacked(name: str, plan: ProgramPlan, program: Program, zero_fills: bool) -> str:
    """How setup_context unpacks the returned value ``name``: by name where it marks, saves or measures it
    (int64 indices are marked non-differentiable, and take no zeros for a gradient)."""
    marked = name in plan.masks or name in program.integers or name in plan.saved
    return name if marked or (zero_fills and name in plan.visible) else "_"


def _program_blocks(plan: ProgramPlan, tensor_names: list[str]) -> list[Block]:
    """backward's statements, consecutive ones under the same guard in one block."""
    everything = frozenset(range(len(tensor_names)))
    blocks: list[Block] = []
    last = None
    for line in plan.backward:
        guard = (
            None
            if not line.guard or line.guard == everything
            else " or ".join(f"needs_input_grad[{i}]" for i in sorted(line.guard))
        )
        text = "    " * line.indent + line.text
        if blocks and guard == last:
            blocks[-1].lines.append(text)
        else:
            blocks.append(Block(guard, [text]))
            last = guard
    return blocks


#: Sizes the tests of a structured op give the example's distinct sizes above 1, in order of size: distinct
#: (a transposed or wrongly reduced dimension shows) and small (gradcheck builds a Jacobian).
PROGRAM_SIZES = (2, 3, 4, 5, 6, 7)


def fixed_sizes(program: Program, spec: OpSpec) -> frozenset[int]:
    """The sizes the tests keep: each one_hot's number of classes, the size a gather indexes along (its
    indices' domain fits them)."""
    defaults = {program.parsed.symbols[s.name]: s.default for s in spec.scalars if s.type == "int"}
    sizes = {int(v.expr.classes.xreplace(defaults)) for v in program.values if isinstance(v.expr, structural.OneHot)}
    for v in program.values:
        if isinstance(v.expr, structural.Gather):
            shape = program.value(str(v.expr.args[0])).shape
            sizes.add(shape[v.expr.dim % len(shape)])
    return frozenset(sizes)


def program_small_shapes(spec: OpSpec, fixed: frozenset[int] = frozenset()) -> list[tuple[int, ...]]:
    """Small shapes for a structured op's tests: each distinct example size above 1 mapped to its own
    small size, so that equal dimensions (a product's inner ones) stay equal and different ones differ;
    those in ``fixed`` (a one_hot's number of classes) as they are, and the others apart from them."""
    sizes = sorted({n for t in spec.tensors for n in t.shape if n > 1 and n not in fixed})
    small = {
        n: PROGRAM_SIZES[min(i, len(PROGRAM_SIZES) - 1)] + max(0, i - len(PROGRAM_SIZES) + 1)
        for i, n in enumerate(sizes)
    }
    taken = iter(n for n in range(2, 64) if n not in fixed)
    small = {n: next(taken) for n in sizes} if fixed else small
    return [tuple(n if n in fixed else small.get(n, 1) for n in t.shape) for t in spec.tensors]
