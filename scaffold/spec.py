"""Stage 1: the op spec.

A spec comes from a TOML file (:func:`load_spec`) or from command-line flags (:func:`spec_from_flags`);
both produce the same frozen :class:`OpSpec`, validated once, here, so later stages can trust it.
"""

from __future__ import annotations

import keyword
import math
import re
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import structural
from .errors import SpecError, did_you_mean, error_context
from .limits import MAX_LENGTH, MAX_SPEC_LENGTH
from .tomlwriter import dumps

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

#: Backward plan policies: what to favour when saving for backward costs memory and recomputing costs time.
POLICIES = ("memory", "time")

#: What the generated op is built on: a torch.autograd.Function, or a torch.library custom op whose autograd
#: is that Function's setup_context and backward.
TARGETS = ("function", "custom_op")
#: Operator namespaces PyTorch registers its own operators in.
RESERVED_NAMESPACES = frozenset({"aten", "prim", "prims", "torch", "inductor", "quantized", "higher_order"})

#: Example shape of a tensor argument in the generated tests when the spec gives none.
DEFAULT_SHAPE = (4, 5)
#: Default shape of a learnable tensor (an ``nn.Parameter``): one value, broadcast over the input.
DEFAULT_LEARNABLE_SHAPE = ()

SCALAR_TYPES = {"float": float, "int": int, "bool": bool}
#: The dtypes a tensor may declare: floating point (the default, whatever dtype it is called with),
#: int64 class indices, which take no gradient and an integer domain, or bool masks, which take no gradient
#: and no domain (a condition, and 0/1 where it is used as a number).
TENSOR_DTYPES = ("float", "int64", "bool")
#: An int64 tensor's domain where the spec gives none: class indices 0 to 3.
DEFAULT_INTEGER_DOMAIN = (0, 3)

# Names the generated module and test file use themselves; an argument of that name would shadow them.
RESERVED_ARGUMENT_NAMES = frozenset(
    {
        "torch", "nn", "math", "pytest", "ctx", "self", "inputs", "output", "grad_output",
        "gradcheck", "gradgradcheck", "super", "float", "int", "bool", "abs", "max", "min",
        "len", "range", "tuple", "zip", "isinstance", "device", "dtype", "generator",
        "sum", "all", "any", "vars", "enumerate", "str", "repr", "staticmethod", "terms", "out", "getattr",
        "ImportError",
    }
    # Attributes of the autograd ctx: scalar arguments are stored on it by name.
    | {
        "needs_input_grad", "saved_tensors", "saved_variables", "save_for_backward", "save_for_forward",
        "saved_for_forward", "to_save", "mark_dirty", "dirty_tensors", "mark_non_differentiable",
        "non_differentiable", "mark_shared_storage", "set_materialize_grads", "materialize_grads",
        "maybe_clear_saved_tensors", "metadata", "name", "next_functions", "register_hook",
        "register_prehook", "requires_grad", "apply", "apply_jvp", "apply_boxed",
    }
)  # fmt: skip
#: Argument name prefixes and suffixes the generated code builds names with (grad_x, ctx.x_shape, ...).
RESERVED_PREFIXES = ("tmp", "grad_")
RESERVED_SUFFIXES = ("_tangent", "_shape")
#: The runtime module every generated op imports, written beside the ops (templates/_scaffold_runtime.py.j2).
RUNTIME_MODULE = "_scaffold_runtime"
RUNTIME_FILE = f"{RUNTIME_MODULE}.py"
# Op names the generated module or test file cannot take: the module would shadow a library the
# generated code imports, or the op's function would replace one of the test file's own names.
RESERVED_OP_NAMES = frozenset(
    {
        "torch", "math", "pytest", "sympy", "scaffold", "scaffold_testing", "typing", "conftest", "nn",
        "reference", "device", "OP", "Input", "OpTests", "device_fixture", RUNTIME_MODULE,
    }
)  # fmt: skip
# The op's module is NAME.py, imported by that name from a folder on sys.path where its tests run (the output
# folder of `scaffold new op`): an op named like a module that the generated files, torch or pytest import
# would shadow it there ("partially initialized module 'inspect'"), or be shadowed by it.
#: Python's standard modules: the generated files import some (inspect, math, warnings, types, contextlib,
#: functools, os, dataclasses), and torch and pytest most of the others.
STANDARD_MODULES = frozenset(name for name in sys.stdlib_module_names if not name.startswith("_"))
#: The packages besides the standard library that the generated tests load: torch, pytest and what they import
#: (also under torch.compile). tests/test_spec.py checks both sets against real imports.
TEST_RUNTIME_PACKAGES = frozenset(
    {
        "torch", "functorch", "torchgen", "triton", "numpy", "sympy", "mpmath", "networkx", "jinja2",
        "markupsafe", "filelock", "fsspec", "typing_extensions", "packaging", "setuptools", "pytest", "pluggy",
        "iniconfig", "py", "pygments", "colorama", "exceptiongroup", "tomli",
    }
)  # fmt: skip

_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")

#: Attributes of every nn.Module: the generated Module stores its sizes under their names.
MODULE_ATTRIBUTES = frozenset(
    {
        "training", "forward", "extra_repr", "reset_parameters", "parameters", "named_parameters", "buffers",
        "named_buffers", "children", "modules", "named_modules", "state_dict", "load_state_dict", "train", "eval",
        "to", "cpu", "cuda", "type", "half", "double", "apply", "zero_grad", "register_buffer",
        "register_parameter", "register_module", "add_module", "requires_grad_", "call_super_init", "dump_patches",
    }
)  # fmt: skip

#: What ``init`` takes besides a number (the README lists them).
INIT_SCHEMES = (
    '"ones"', '"zeros"', '"normal(mean, std)"', '"uniform(low, high)"', '"kaiming_uniform"', '"xavier_uniform"',
    '"linear"',
)  # fmt: skip
_INIT_CALL = re.compile(r"(normal|uniform)\(([^(),]*),([^(),]*)\)\Z")
#: Schemes that read a weight's fan-in and fan-out (torch.nn.init's: dimension 1 times the receptive field,
#: and dimension 0 times it): they need a tensor of two or more dimensions.
FAN_SCHEMES = ("kaiming_uniform", "xavier_uniform")


@dataclass(frozen=True)
class Init:
    """A learnable tensor's initialisation, parsed from ``init``: ``constant`` (``args``: the value, also
    what ``"ones"`` and ``"zeros"`` are, kept by ``scheme`` as written), ``normal`` (mean, std), ``uniform``
    (low, high), ``kaiming_uniform``, ``xavier_uniform`` or ``linear`` (nn.Linear's: a weight of two or more
    dimensions kaiming-uniform with a = sqrt(5); a tensor of fewer, its bias, uniform in +-1/sqrt(fan_in)
    of that weight)."""

    scheme: str  # "constant", "ones", "zeros", "normal", "uniform", "kaiming_uniform", "xavier_uniform", "linear"
    args: tuple[float, ...] = ()

    @property
    def constant(self) -> float | None:
        """The value of a constant scheme, None for a random one."""
        return {"ones": 1.0, "zeros": 0.0}.get(self.scheme, self.args[0] if self.scheme == "constant" else None)


def parse_init(value: object, key: str) -> Init:
    """``init`` as written (a number or a scheme's text), read strictly: nothing is evaluated."""
    hint = f"use a number or one of {', '.join(INIT_SCHEMES)}"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SpecError(f"init must be a number or a scheme, got {value!r}", key=key, hint=hint)
    if not isinstance(value, str):
        if not math.isfinite(value):
            raise SpecError(f"init must be a finite number, got {value!r}", key=key)
        return Init("constant", (float(value),))
    text = value.strip()
    if text in ("ones", "zeros", "kaiming_uniform", "xavier_uniform", "linear"):
        return Init(text)
    call = _INIT_CALL.match(text.replace(" ", ""))
    if call is None:
        raise SpecError(f"unknown init {value!r}", key=key, hint=hint)
    scheme, numbers = call.group(1), []
    for part in call.group(2, 3):
        try:
            number = float(part)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or "_" in part:
            raise SpecError(
                f"cannot read {part!r} in init {value!r} as a finite number",
                key=key,
                hint=f'write e.g. "{scheme}(0.0, 0.02)"' if scheme == "normal" else f'write e.g. "{scheme}(-0.1, 0.1)"',
            )
        numbers.append(number)
    first, second = numbers
    if scheme == "normal" and second <= 0:
        raise SpecError(f"the std of init {value!r} must be positive", key=key, hint='e.g. "normal(0.0, 0.02)"')
    if scheme == "uniform" and first >= second:
        raise SpecError(f"init {value!r} needs low < high", key=key, hint='e.g. "uniform(-0.1, 0.1)"')
    return Init(scheme, (first, second))


def camel_case(name: str) -> str:
    """``leaky_relu`` -> ``LeakyRelu``."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def _suggest(name: str) -> str:
    folded = unicodedata.normalize("NFKC", name)
    ascii_name = re.sub(r"[^A-Za-z0-9_]", "_", folded.encode("ascii", "replace").decode()).strip("_")
    if not ascii_name or not ascii_name[0].isalpha():
        ascii_name = "v" + ascii_name
    return ascii_name + "_" if ascii_name in RESERVED_ARGUMENT_NAMES or keyword.iskeyword(ascii_name) else ascii_name


def check_identifier(name: object, *, what: str, where: str) -> str:
    """Return ``name`` if it is a plain ASCII Python identifier usable in generated code, else raise."""
    if not isinstance(name, str):
        raise SpecError(f"{what} must be a string, not {type(name).__name__}", where=where)
    if not _IDENTIFIER.match(name):
        raise SpecError(
            f"{what} {name!r} is not a valid name: use ASCII letters, digits and underscores, starting with a letter",
            where=where,
            hint=f"try {_suggest(name)!r}",
        )
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise SpecError(f"{what} {name!r} is a Python keyword", where=where, hint=f"try {name + '_'!r}")
    return name


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument of the op."""

    name: str
    shape: tuple[int, ...] = DEFAULT_SHAPE
    domain: tuple[float, float] | None = None
    avoid: tuple[float, ...] | None = None
    learnable: bool = False
    #: A number or a scheme's text (:func:`parse_init`), as the spec gives it; :attr:`scheme` reads it.
    init: float | str | None = None
    #: The size name of each entry of ``shape`` (None: a plain number), as the spec writes it; ``shape`` holds
    #: the example values ([sizes]). Empty: no names.
    size_names: tuple[str | None, ...] = ()
    #: "float" (the default), "int64": integer class indices, drawn in ``domain`` (inclusive), no gradient,
    #: or "bool": a mask, drawn True and False, no gradient.
    dtype: str = "float"

    def __post_init__(self) -> None:
        key = f"tensors.{self.name}"
        if self.dtype != "float":
            self._check_discrete(key)
        if not self.size_names:
            object.__setattr__(self, "size_names", (None,) * len(self.shape))
        if len(self.size_names) != len(self.shape):
            raise SpecError(
                f"size_names {list(self.size_names)!r} do not match shape {list(self.shape)!r}", key=key + ".shape"
            )
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in self.shape):
            raise SpecError(
                f"shape must be a list of positive integers, got {list(self.shape)!r}",
                key=key + ".shape",
                hint="use [] for a single value, [4, 5] for a 4x5 tensor",
            )
        if self.domain is not None and self.dtype == "float":
            low, high = self.domain
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise SpecError(
                    f"domain must be two finite numbers [low, high] with low < high, got {list(self.domain)!r}",
                    key=key + ".domain",
                )
        if self.avoid is not None and not all(math.isfinite(v) for v in self.avoid):
            raise SpecError("avoid must be a list of finite numbers", key=key + ".avoid")
        if self.init is not None:
            if not self.learnable:
                raise SpecError(
                    "init is only used for learnable tensors",
                    key=key + ".init",
                    hint="add 'learnable = true' or remove 'init'",
                )
            scheme = parse_init(self.init, key + ".init")
            if scheme.scheme in FAN_SCHEMES and len(self.shape) < 2:
                raise SpecError(
                    f"init {self.init!r} needs a tensor of two or more dimensions (fan-in and fan-out), and "
                    f"{self.name} has shape {self.written_shape!r}",
                    key=key + ".init",
                    hint='give a weight [out, in] this scheme; a bias takes "linear", "zeros" or a number',
                )
            if not isinstance(self.init, str):
                object.__setattr__(self, "init", float(self.init))

    def _check_discrete(self, key: str) -> None:
        """An int64 or bool tensor: a known dtype, not learnable, no avoid; an int64 one an integer domain
        (default [0, 3]), a bool one none."""
        if self.dtype not in TENSOR_DTYPES:
            raise SpecError(
                f"unknown dtype {self.dtype!r} (supported: {', '.join(map(repr, TENSOR_DTYPES))})",
                key=key + ".dtype",
                hint='write dtype = "int64" for class indices, dtype = "bool" for a mask, '
                "or leave dtype out for a floating-point tensor",
            )
        if self.learnable:
            raise SpecError(
                f"{'a bool' if self.boolean else 'an int64'} tensor cannot be learnable: it has no gradient",
                key=key + ".learnable",
                hint="remove 'learnable = true', or drop dtype for a floating-point parameter",
            )
        if self.avoid is not None:
            raise SpecError("avoid is only used for floating-point tensors", key=key + ".avoid")
        if self.boolean:
            if self.domain is not None:
                raise SpecError(
                    "a bool tensor takes no domain: the generated tests draw it True and False",
                    key=key + ".domain",
                    hint="remove 'domain': a bool mask holds True and False (an int64 tensor takes domain = [0, 1])",
                )
            return
        domain = DEFAULT_INTEGER_DOMAIN if self.domain is None else self.domain
        if not all(float(v).is_integer() for v in domain) or not domain[0] <= domain[1]:
            raise SpecError(
                f"an int64 tensor's domain must be two integers [low, high] with low <= high, got {list(domain)!r}",
                key=key + ".domain",
                hint="e.g. domain = [0, 9] for the class indices of 10 classes (both ends included)",
            )
        object.__setattr__(self, "domain", (int(domain[0]), int(domain[1])))

    @property
    def integer(self) -> bool:
        """Whether the tensor holds int64 class indices (no gradient)."""
        return self.dtype == "int64"

    @property
    def boolean(self) -> bool:
        """Whether the tensor is a bool mask (no gradient)."""
        return self.dtype == "bool"

    @property
    def discrete(self) -> bool:
        """Whether the tensor is int64 or bool: it takes no gradient and is passed through unchanged."""
        return self.dtype != "float"

    @property
    def scheme(self) -> Init | None:
        """The parsed ``init``; None where the spec gives none."""
        return None if self.init is None else parse_init(self.init, f"tensors.{self.name}.init")

    @property
    def written_shape(self) -> list[int | str]:
        """The shape as the spec writes it: a size name where it gives one."""
        return [n if name is None else name for n, name in zip(self.shape, self.size_names)]


@dataclass(frozen=True)
class ScalarArg:
    """A non-tensor argument of the op (a Python float, int or bool)."""

    name: str
    type: str
    default: float | int | bool

    def __post_init__(self) -> None:
        key = f"scalars.{self.name}"
        if self.type not in SCALAR_TYPES:
            raise SpecError(f"type must be one of float, int, bool, got {self.type!r}", key=key + ".type")
        expected = SCALAR_TYPES[self.type]
        value = self.default
        ok = (
            isinstance(value, bool)
            if expected is bool
            else (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and (expected is float or isinstance(value, int))
            )
        )
        if not ok:
            raise SpecError(
                f"default {value!r} is not a {self.type}",
                key=key + ".default",
                hint="write true/false for bool, 3 for int, 1.5 for float",
            )
        if expected is float:
            if not math.isfinite(float(value)):
                raise SpecError(f"default must be finite, got {value!r}", key=key + ".default")
            object.__setattr__(self, "default", float(value))


class _ArgumentChecks:
    """The checks of an op's name, options, arguments, custom gradients and outputs that
    :meth:`OpSpec.__post_init__` makes: identifiers, no reserved names, each given once."""

    def _check_name(self, where: str) -> None:
        """A valid identifier that shadows none of the names the generated files and their tests import."""
        check_identifier(self.name, what="op name", where=f"{where}: name")
        if self.name in RESERVED_OP_NAMES or self.name.startswith("test_"):
            raise SpecError(
                f"op name {self.name!r} would shadow a name the generated code or its tests rely on",
                where=f"{where}: name",
                hint=f"try {'my_' + self.name!r}",
            )
        if self.name in STANDARD_MODULES or self.name in TEST_RUNTIME_PACKAGES:
            module = "Python's standard module" if self.name in STANDARD_MODULES else "the package"
            raise SpecError(
                f"op name {self.name!r} is also the name of {module} {self.name}, which the generated code, "
                f"torch or pytest import: the op's module {self.name}.py would shadow it where its tests run",
                where=f"{where}: name",
                hint=f"try {'my_' + self.name!r}",
            )

    def _check_options(self, where: str) -> None:
        """fuse, policy, target and namespace."""
        if not isinstance(self.fuse, bool):
            raise SpecError(f"fuse must be true or false, got {self.fuse!r}", where=f"{where}: fuse")
        if self.policy not in POLICIES:
            raise SpecError(
                f"policy must be one of {', '.join(map(repr, POLICIES))}, got {self.policy!r}",
                where=f"{where}: policy",
                hint='"memory" saves the fewest bytes for backward, "time" recomputes the least',
            )
        if self.target not in TARGETS:
            raise SpecError(
                f"target must be one of {', '.join(map(repr, TARGETS))}, got {self.target!r}",
                where=f"{where}: target",
                hint='"function" writes a torch.autograd.Function, "custom_op" a torch.library custom op',
            )
        if self.namespace:
            check_identifier(self.namespace, what="namespace", where=f"{where}: namespace")
            if self.namespace in RESERVED_NAMESPACES:
                raise SpecError(
                    f"namespace {self.namespace!r} belongs to PyTorch's own operators",
                    where=f"{where}: namespace",
                    hint=f"use your package's name, e.g. {'my_' + self.namespace!r}",
                )
            if self.target != "custom_op":
                raise SpecError(
                    "namespace names a custom op's namespace, and the target is not custom_op",
                    where=f"{where}: namespace",
                    hint='add target = "custom_op", or remove namespace',
                )

    def _check_arguments(self, where: str) -> set[str]:
        """At least one tensor; every argument's name valid, free, and declared once. Returns the names."""
        if not self.tensors:
            raise SpecError(
                "the op has no tensor arguments",
                where=where,
                hint="declare at least one, e.g. [tensors.x] in a spec file or --tensor x on the command line",
            )
        # The op's function may share an argument's name (F.threshold(x, threshold, value)): the argument
        # shadows it only inside functions that take it, and those never call the op by name.
        taken = {camel_case(self.name), camel_case(self.name) + "Function"}
        seen: set[str] = set()
        for kind, arg in [("tensors", t) for t in self.tensors] + [("scalars", s) for s in self.scalars]:
            arg_where = f"{where}: {kind}.{arg.name}"
            check_identifier(arg.name, what="argument name", where=arg_where)
            if (
                arg.name in RESERVED_ARGUMENT_NAMES
                or arg.name.startswith(RESERVED_PREFIXES)
                or arg.name.endswith(RESERVED_SUFFIXES)
            ):
                raise SpecError(
                    f"argument name {arg.name!r} is used by the generated code itself",
                    where=arg_where,
                    hint=f"try {arg.name + '_'!r}",
                )
            if arg.name in taken:
                raise SpecError(
                    f"argument name {arg.name!r} would shadow the op's own class",
                    where=arg_where,
                    hint=f"rename the argument, e.g. {arg.name + '_in'!r}",
                )
            if arg.name in seen:
                raise SpecError(f"argument {arg.name!r} is declared twice", where=arg_where)
            seen.add(arg.name)
        return seen

    def _check_gradients(self, where: str) -> None:
        """Each custom gradient: of a tensor argument, given once, a non-empty expression of bounded length."""
        tensor_names = {t.name for t in self.tensors}
        given: set[str] = set()
        for name, text in self.gradients:
            key = f"{where}: gradients.{name}"
            if name not in tensor_names:
                raise SpecError(
                    f"{name!r} is not a tensor argument: only tensors have gradients",
                    where=key,
                    hint=f"give a gradient for one of {', '.join(sorted(tensor_names))}",
                )
            if name in given:
                raise SpecError(f"the gradient of {name!r} is given twice", where=key)
            if name in {t.name for t in self.tensors if t.discrete}:
                dtype = next(t.dtype for t in self.tensors if t.name == name)
                raise SpecError(
                    f"{name!r} is {'a bool' if dtype == 'bool' else 'an int64'} tensor: it has no gradient",
                    where=key,
                    hint=f"remove gradients.{name}; backward returns None for it",
                )
            if not isinstance(text, str) or not text.strip():
                raise SpecError(
                    "the gradient must be an expression over the forward's names and grad",
                    where=key,
                    hint='e.g. "grad" (straight-through) or "grad*Heaviside(1 - Abs(x))"',
                )
            _check_length(text, "the gradient", key)
            given.add(name)

    def _check_outputs(self, where: str, arguments: set[str]) -> None:
        if not isinstance(self.outputs, tuple) or not all(isinstance(o, str) for o in self.outputs):
            raise SpecError(
                "outputs must be a list of names", where=f"{where}: outputs", hint='e.g. outputs = ["y", "s"]'
            )
        seen: set[str] = set()
        for name in self.outputs:
            check_identifier(name, what="output name", where=f"{where}: outputs")
            if name in arguments:
                raise SpecError(
                    f"output {name!r} is an argument of the op: an op returns values it computes",
                    where=f"{where}: outputs",
                    hint=f"compute it in the forward, e.g. a line {name}_out = ..., and name that",
                )
            if name in seen:
                raise SpecError(f"output {name!r} is listed twice", where=f"{where}: outputs")
            seen.add(name)


class _SizeChecks:
    """The check of an op's [sizes] that :meth:`OpSpec.__post_init__` makes."""

    def _check_sizes(self, where: str, arguments: set[str]) -> None:
        """[sizes]: names that are no other name of the op, positive example values, each declared size used
        by some shape and each size a shape uses declared, with its value."""
        from .functions import spellings  # the registry imports sympy: not at import time

        functions = set(spellings()) | structural.SPELLINGS | {"Piecewise", "where", "pi", "E", "e"}
        # the Module keeps a 0-d learnable tensor's initial value as NAME_init
        inits = {f"{t.name}_init": t.name for t in self.tensors if t.learnable and not t.shape}
        declared: dict[str, int] = {}
        for name, value in self.sizes:
            key = f"{where}: sizes.{name}"
            check_identifier(name, what="size name", where=key)
            if name in declared:
                raise SpecError(f"size {name!r} is declared twice", where=key)
            _check_size_value(name, value, key)
            if name in arguments:
                raise SpecError(
                    f"size name {name!r} is also an argument of the op", where=key, hint=f"try {name + '_size'!r}"
                )
            if name in self.outputs:
                raise SpecError(
                    f"size name {name!r} is also an output of the op", where=key, hint=f"try {name + '_size'!r}"
                )
            if name in functions:
                raise SpecError(
                    f"size name {name!r} is the name of a function or constant in expressions",
                    where=key,
                    hint=f"try {name + '_size'!r}",
                )
            if (
                name in RESERVED_ARGUMENT_NAMES
                or name in MODULE_ATTRIBUTES
                or name.startswith(RESERVED_PREFIXES)
                or name.endswith(RESERVED_SUFFIXES)
                or name in {self.camel, self.camel + "Function"}
            ):
                raise SpecError(
                    f"size name {name!r} is used by the generated code itself",
                    where=key,
                    hint=f"try {name + '_size'!r}",
                )
            declared[name] = value
        kinds = {t.name: "tensors" for t in self.tensors} | {s.name: "scalars" for s in self.scalars}
        kinds |= dict.fromkeys(declared, "sizes")
        for name in kinds:
            if name in inits:
                raise SpecError(
                    f"{name!r} is the name the Module gives {inits[name]}'s initial value",
                    where=f"{where}: {kinds[name]}.{name}",
                    hint=f"try {name.removesuffix('_init') + '_start'!r}",
                )
        used: set[str] = set()
        for t in self.tensors:
            for position, (n, name) in enumerate(zip(t.shape, t.size_names)):
                if name is None:
                    continue
                key = f"{where}: tensors.{t.name}.shape"
                if name not in declared:
                    raise _undeclared_size(name, key)
                if n != declared[name]:
                    raise SpecError(
                        f"dimension {position} of {t.name} is size {name!r}, {declared[name]} in [sizes], but {n} here",
                        where=key,
                    )
                used.add(name)
        for name in declared:
            if name not in used:
                raise SpecError(
                    f"size {name!r} is declared in [sizes] but no tensor's shape uses it",
                    where=f"{where}: sizes.{name}",
                    hint=f'use it in a shape, e.g. shape = [4, "{name}"], or remove it',
                )


@dataclass(frozen=True)
class OpSpec(_ArgumentChecks, _SizeChecks):
    """A validated op: its name, forward expression and arguments, in declaration order."""

    name: str
    forward: str
    tensors: tuple[TensorArg, ...]
    scalars: tuple[ScalarArg, ...] = ()
    doc: str = ""
    #: Run the pointwise math of forward and backward through torch.compile (with an eager fallback).
    fuse: bool = False
    #: What the backward plan favours when saving costs memory and recomputing costs time.
    policy: str = "memory"
    #: "function": the op is a torch.autograd.Function; "custom_op": a torch.library custom op (NAMESPACE::NAME).
    target: str = "function"
    #: The custom op's namespace; empty: the project's package, or "scaffold" outside a project.
    namespace: str = ""
    #: Where the spec came from, for messages and the generated header: a file name or "command-line flags".
    source: str = "command-line flags"
    #: Custom gradients: (tensor name, the expression backward returns for it, over the forward's names
    #: and ``grad``, the upstream gradient), in place of the derived one.
    gradients: tuple[tuple[str, str], ...] = ()
    #: The names of the forward's values the op returns, in order (several: a tuple); empty: the forward's
    #: last line.
    outputs: tuple[str, ...] = ()
    #: The size names the tensors' shapes use, with their example values, in declaration order ([sizes]).
    sizes: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        where = self.source
        self._check_name(where)
        self._check_options(where)
        if not isinstance(self.forward, str) or not self.forward.strip():
            raise SpecError(
                "the forward expression is empty",
                where=f"{where}: forward",
                hint='give the math of the op, e.g. forward = "x / (1 + exp(-x))"',
            )
        _check_length(self.forward, "the forward", f"{where}: forward")
        arguments = self._check_arguments(where)
        if self.tensors and all(t.discrete for t in self.tensors):
            raise SpecError(
                "every tensor argument is int64 or bool: the op needs a floating-point tensor, whose dtype its "
                "values and gradients take",
                where=f"{where}: tensors",
                hint="declare the values the op computes on as a tensor without dtype (floating point)",
            )
        if not self.structured:  # stage 3 checks the shapes of reductions and products node by node
            _check_broadcasting(self.tensors, where)
        self._check_gradients(where)
        self._check_outputs(where, arguments)
        self._check_sizes(where, arguments)
        object.__setattr__(self, "tensors", _broadcast_names(self.tensors))
        if not self.structured:
            _check_broadcast_names(self.tensors, where)
        for t in self.tensors:
            scheme = t.scheme
            if scheme is not None and scheme.scheme == "linear" and len(t.shape) < 2:
                linear_weight(self, t)

    @property
    def module_sizes(self) -> tuple[tuple[str, int], ...]:
        """The sizes the Module's constructor takes: those its learnable tensors use, in order of first
        appearance in the tensors' shapes (x [8, "in"] then weight ["out", "in"]: in, out, as nn.Linear takes
        them), with their example values."""
        values = dict(self.sizes)
        learned = {n for t in self.tensors if t.learnable for n in t.size_names}
        names = [n for t in self.tensors for n in t.size_names if n is not None and n in learned]
        return tuple((n, values[n]) for n in dict.fromkeys(names))

    @property
    def camel(self) -> str:
        return camel_case(self.name)

    @property
    def structured(self) -> bool:
        """Whether the forward uses reductions, softmax, ``@`` or transpose (:mod:`.structural`): a look at
        its words, before it is parsed."""
        return (
            "@" in self.forward
            or "[" in self.forward
            or bool(_STRUCTURAL_CALL.search(self.forward))
            or any(t.discrete for t in self.tensors)  # the program's planner gives them no gradient
        )

    @property
    def arguments(self) -> tuple[TensorArg | ScalarArg, ...]:
        """All arguments in call order: tensors, then scalars."""
        return self.tensors + self.scalars


def other_sizes(sizes: dict[str, int]) -> dict[str, int]:
    """Sizes other than ``sizes`` (the example's), each one more or more still, all distinct: the sizes the
    generated Module tests try (scaffold.testing keeps its own copy) and stage 3 checks the op at."""
    taken = set(sizes.values())
    other = {}
    for name, size in sizes.items():
        size += 1
        while size in taken:
            size += 1
        other[name] = size
        taken.add(size)
    return other


def _broadcast_names(tensors: tuple[TensorArg, ...]) -> tuple[TensorArg, ...]:
    """The tensors with a number in a shape named where broadcasting ties it to a named size: a dimension
    (counted from the right, above 1) that another tensor names, and that is that size at the example, takes
    the name. x [8, 16] beside weight ["features"] (features = 16) is x [8, "features"], as torch requires of
    every call; without the name the op's tests at other sizes could not broadcast x with the weight. A
    number of another size is left as written, for the checks that follow to refuse."""
    named: dict[int, tuple[str, int]] = {}  # dimension counted from the right -> its first name and size
    for t in tensors:
        for dim, (size, name) in enumerate(zip(reversed(t.shape), reversed(t.size_names)), start=1):
            if name is not None:
                named.setdefault(dim, (name, size))
    result = []
    for t in tensors:
        names = list(t.size_names)
        for dim in range(1, len(names) + 1):
            if names[-dim] is None and t.shape[-dim] > 1 and named.get(dim, (None, 0))[1] == t.shape[-dim]:
                names[-dim] = named[dim][0]
        result.append(replace(t, size_names=tuple(names)) if tuple(names) != t.size_names else t)
    return tuple(result)


def _check_broadcast_names(tensors: tuple[TensorArg, ...], where: str) -> None:
    """Elementwise, dimensions that broadcast together (counted from the right, above 1) are one size: where
    one tensor names it, every other must give it the same name (the Module's tests try other sizes)."""
    first: dict[int, TensorArg] = {}  # dimension counted from the right -> the first tensor naming it or > 1
    for t in tensors:
        for dim, (size, name) in enumerate(zip(reversed(t.shape), reversed(t.size_names)), start=1):
            if size == 1 and name is None:
                continue
            other = first.setdefault(dim, t)
            other_name = other.size_names[-dim]
            if other_name == name:
                continue
            named, unnamed = (other, t) if other_name is not None else (t, other)
            label = named.size_names[-dim]
            detail = (
                f"{unnamed.name} names it {unnamed.size_names[-dim]!r}"
                if unnamed.size_names[-dim] is not None
                else f"{unnamed.name} gives it as {unnamed.shape[-dim]}"
            )
            raise SpecError(
                f"dimension -{dim} (counted from the right) is size {label!r} in {named.name}, but {detail}: "
                "dimensions that broadcast together are one size",
                where=f"{where}: tensors.{unnamed.name}.shape",
                hint=f'write "{label}" there in the shape of {unnamed.name}',
            )


def _check_size_value(name: str, value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(
            f"size {name!r} must be a positive integer (its example value), got {value!r}",
            where=where,
            hint=f"e.g. {name} = 16",
        )


def _undeclared_size(name: str, where: str) -> SpecError:
    return SpecError(
        f"size {name!r} is not declared in [sizes]",
        where=where,
        hint=f"give its example value: {name} = 16 under [sizes], or --size {name}=16 on the command line",
    )


def linear_weight(spec: OpSpec, bias: TensorArg) -> TensorArg:
    """The weight whose fan-in sets the bound of ``bias`` (a learnable tensor of fewer than two dimensions
    with init "linear"): the one learnable tensor of two or more dimensions with init "linear", or, among
    several, the one whose first dimension (nn.Linear's weight is [out, in]) has the size name of the bias's
    last."""
    where = f"{spec.source}: tensors.{bias.name}.init"
    weights = [
        t
        for t in spec.tensors
        if t.learnable and len(t.shape) >= 2 and t.scheme is not None and t.scheme.scheme == "linear"
    ]
    if not weights:
        raise SpecError(
            f'init "linear" of {bias.name} is nn.Linear\'s bias scheme, uniform in +-1/sqrt(fan_in) of its weight, '
            'and no learnable tensor of two or more dimensions has init "linear"',
            where=where,
            hint='give the weight init = "linear" too, or give the bias another init, e.g. "zeros"',
        )
    if len(weights) > 1:
        out = bias.size_names[-1] if bias.size_names else None
        weights = [w for w in weights if out is not None and w.size_names[0] == out] or weights
    if len(weights) > 1:
        raise SpecError(
            f'init "linear" of {bias.name}: {", ".join(w.name for w in weights)} all have init "linear", and '
            f"no one of them alone has {bias.name}'s last size name in its first dimension",
            where=where,
            hint='name each layer\'s output size, e.g. weight shape = ["out", "in"] and bias shape = ["out"]',
        )
    return weights[0]


_STRUCTURAL_CALL = re.compile(r"\b(" + "|".join(sorted(structural.SPELLINGS)) + r")\s*\(")


def _check_length(text: str, what: str, where: str) -> None:
    """Refuse an expression longer than :data:`.limits.MAX_LENGTH` here, before anything parses it."""
    if len(text) > MAX_LENGTH:
        raise SpecError(
            f"{what} is {len(text)} characters long, more than the {MAX_LENGTH} allowed",
            where=where,
            hint="write it shorter: name a part used several times as a step (h = ...), one step per line",
        )


def _check_broadcasting(tensors: tuple[TensorArg, ...], where: str) -> None:
    """The example shapes must broadcast together: the generated tests and the backward plan use them."""
    first: dict[int, TensorArg] = {}  # dimension counted from the right -> the first tensor with a size > 1 there
    for t in tensors:
        for dim, size in enumerate(reversed(t.shape), start=1):
            if size == 1:
                continue
            other = first.setdefault(dim, t)
            other_size = other.shape[-dim]
            if other_size != size:
                fixed = list(t.shape)
                fixed[-dim] = other_size
                raise SpecError(
                    f"the example shapes of {other.name} {list(other.shape)} and {t.name} {list(t.shape)} do not "
                    f"broadcast together: dimension -{dim} (counted from the right) is {other_size} in {other.name} "
                    f"and {size} in {t.name}",
                    where=f"{where}: tensors.{t.name}.shape",
                    hint=f"each dimension must have the same size or 1 in every tensor, "
                    f"e.g. shape = {fixed} for {t.name}",
                )


# --- TOML ------------------------------------------------------------------------------------------

_TOP_KEYS = {
    "name", "forward", "doc", "fuse", "policy", "target", "namespace", "tensors", "scalars", "gradients", "outputs",
    "sizes",
}  # fmt: skip
_TENSOR_KEYS = {"shape", "domain", "avoid", "learnable", "init", "dtype"}
_SCALAR_KEYS = {"type", "default"}


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed, key=str)
    if unknown:
        near = {key: did_you_mean(str(key), allowed) for key in unknown}
        pairs = [(k, near[k]) for k in unknown if near[k] and near[k] not in table]
        meant = repr(pairs[0][1]) if len(unknown) == 1 and pairs else ", ".join(f"{m!r} for {k!r}" for k, m in pairs)
        raise SpecError(
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
            where=where,
            hint=(f"did you mean {meant}? " if meant else "") + f"allowed keys here: {', '.join(sorted(allowed))}",
        )


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"expected a number, got {value!r}", where=where)
    return float(value)


def _number_list(value: Any, where: str) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise SpecError(f"expected a list of numbers, got {value!r}", where=where)
    return tuple(_number(v, where) for v in value)


def _tensor_from_table(name: str, table: Any, where: str, sizes: dict[str, int]) -> TensorArg:
    check_identifier(name, what="argument name", where=where)
    if not isinstance(table, dict):
        raise SpecError("expected a table of settings", where=where, hint=f"write [tensors.{name}]")
    _check_keys(table, _TENSOR_KEYS, where)
    learnable = table.get("learnable", False)
    if not isinstance(learnable, bool):
        raise SpecError(f"learnable must be true or false, got {learnable!r}", where=where + ".learnable")
    shape = table.get("shape", DEFAULT_LEARNABLE_SHAPE if learnable else DEFAULT_SHAPE)
    if not isinstance(shape, list) and not isinstance(shape, tuple):
        raise SpecError(
            f"shape must be a list of positive integers and size names, got {shape!r}", where=where + ".shape"
        )
    names = []
    for entry in shape:
        if isinstance(entry, str):
            check_identifier(entry, what="size name", where=where + ".shape")
            if entry not in sizes:
                raise _undeclared_size(entry, where + ".shape")
        names.append(entry if isinstance(entry, str) else None)
    shape = [sizes[entry] if isinstance(entry, str) else entry for entry in shape]
    domain = table.get("domain")
    if domain is not None:
        domain = _number_list(domain, where + ".domain")
        if len(domain) != 2:
            raise SpecError(f"domain must be [low, high], got {list(domain)!r}", where=where + ".domain")
    avoid = table.get("avoid")
    init = table.get("init")
    dtype = table.get("dtype", "float")
    if not isinstance(dtype, str):
        raise SpecError(f'dtype must be a string such as "int64", got {dtype!r}', where=where + ".dtype")
    return TensorArg(
        dtype=dtype,
        name=name,
        shape=tuple(shape),
        domain=domain,
        avoid=None if avoid is None else _number_list(avoid, where + ".avoid"),
        learnable=learnable,
        init=init,
        size_names=tuple(names),
    )


def _scalar_from_table(name: str, table: Any, where: str) -> ScalarArg:
    check_identifier(name, what="argument name", where=where)
    if not isinstance(table, dict):
        raise SpecError("expected a table of settings", where=where, hint=f"write [scalars.{name}]")
    _check_keys(table, _SCALAR_KEYS, where)
    if "default" not in table:
        raise SpecError("a scalar needs a default value", where=where, hint="add e.g. 'default = 1.0'")
    default = table["default"]
    type_ = table.get("type", _infer_type(default))
    return ScalarArg(name=name, type=type_, default=default)


def _infer_type(value: object) -> str:
    return "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "float"


def spec_from_mapping(data: dict[str, Any], *, source: str) -> OpSpec:
    """Build an :class:`OpSpec` from a parsed TOML document (or any equivalent mapping)."""
    # Arguments validate themselves without knowing the file: this says where they came from.
    with error_context(source):
        return _spec_from_mapping(data, source)


def _spec_from_mapping(data: dict[str, Any], source: str) -> OpSpec:
    _check_keys(data, _TOP_KEYS, source)
    for key in ("name", "forward"):
        if key not in data:
            raise SpecError(f"missing required key {key!r}", where=source)
        if not isinstance(data[key], str):
            raise SpecError(f"{key} must be a string, got {data[key]!r}", where=f"{source}: {key}")
    tensors_table = data.get("tensors", {})
    scalars_table = data.get("scalars", {})
    for key, table in (("tensors", tensors_table), ("scalars", scalars_table)):
        if not isinstance(table, dict):
            raise SpecError(f"{key} must be a table, e.g. [{key}.x]", where=f"{source}: {key}")
    doc = data.get("doc", "")
    if not isinstance(doc, str):
        raise SpecError("doc must be a string", where=f"{source}: doc")
    gradients = data.get("gradients", {})
    if not isinstance(gradients, dict):
        raise SpecError(
            'gradients must be a table of expressions, e.g. [gradients] x = "grad"', where=f"{source}: gradients"
        )
    sizes = data.get("sizes", {})
    if not isinstance(sizes, dict):
        raise SpecError(
            "sizes must be a table of names and example values, e.g. [sizes] features = 16", where=f"{source}: sizes"
        )
    for size, value in sizes.items():
        _check_size_value(size, value, f"{source}: sizes.{size}")
    outputs = data.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        raise SpecError(
            f"outputs must be a list of names, got {outputs!r}",
            where=f"{source}: outputs",
            hint='e.g. outputs = ["y", "s"]: the forward\'s values the op returns, in order',
        )
    return OpSpec(
        name=data["name"],
        forward=data["forward"],
        tensors=tuple(_tensor_from_table(n, t, f"{source}: tensors.{n}", sizes) for n, t in tensors_table.items()),
        scalars=tuple(_scalar_from_table(n, t, f"{source}: scalars.{n}") for n, t in scalars_table.items()),
        doc=doc,
        fuse=data.get("fuse", False),
        policy=data.get("policy", "memory"),
        target=data.get("target", "function"),
        namespace=data.get("namespace", ""),
        source=source,
        gradients=tuple(gradients.items()),
        outputs=tuple(outputs),
        sizes=tuple(sizes.items()),
    )


def load_spec(path: str | Path, *, source: str | None = None) -> OpSpec:
    """Read and validate a TOML op spec; ``source`` names it in messages (default: the file's name)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("spec file not found", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read the spec file: {exc}", where=str(path)) from None
    if len(text) > MAX_SPEC_LENGTH:
        raise SpecError(
            f"the spec file is {len(text)} characters long, more than the {MAX_SPEC_LENGTH} allowed",
            where=str(path),
            hint="a spec holds one op: its name, forward, arguments and options",
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"invalid TOML: {exc}", where=str(path)) from None
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise SpecError(
            "invalid TOML: arrays or tables nested too deeply to read",
            where=str(path),
            hint="a spec's values are strings, numbers, and lists of numbers",
        ) from None
    return spec_from_mapping(data, source=source or path.name)


# --- command-line flags ----------------------------------------------------------------------------


def _parse_shape(text: str, where: str) -> tuple[int | str, ...]:
    """``4,5`` (or ``4x5``), ``4,features`` (a size name), ``[]`` for one value."""
    text = text.strip()
    if text in ("", "[]", "()", "scalar"):
        return ()
    inner = text.strip("[]()").replace(" ", "")
    parts = inner.split("x") if re.fullmatch(r"\d+(x\d+)+", inner) else inner.split(",")
    shape: list[int | str] = []
    for part in parts:
        if part.isdigit():
            shape.append(int(part))
        elif _IDENTIFIER.match(part):
            shape.append(part)
        else:
            raise SpecError(
                f"cannot read shape {text!r}",
                where=where,
                hint="write e.g. x=4,5, x=4,features (a size named with --size features=16) or beta=[] for one value",
            )
    return tuple(shape)


def _size_table(sizes: Sequence[str]) -> dict[str, int]:
    """The ``[sizes]`` table the ``--size NAME=VALUE`` flags describe."""
    table: dict[str, int] = {}
    for item in sizes:
        name, sep, value = item.partition("=")
        where = f"--size {item}"
        name = check_identifier(name.strip(), what="size name", where=where)
        if not sep or not value.strip().isdigit():
            raise SpecError(f"cannot read size {item!r}", where=where, hint="write NAME=VALUE, e.g. --size features=16")
        _once(name, table, "--size", where)
        table[name] = int(value)
    return table


def _parse_scalar_value(text: str, type_: str | None, where: str) -> tuple[str, float | int | bool]:
    lowered = text.strip().lower()
    if type_ in (None, "bool") and lowered in ("true", "false"):
        return "bool", lowered == "true"
    try:
        value: float | int = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise SpecError(
                f"cannot read the default value {text!r}",
                where=where,
                hint="write e.g. alpha=0.5, n=3 or flag=true",
            ) from None
    return (type_ or _infer_type(value)), (float(value) if type_ == "float" else value)


def spec_from_flags(
    name: str,
    forward: str,
    tensors: Sequence[str],
    scalars: Sequence[str] = (),
    learnable: Sequence[str] = (),
    doc: str = "",
    fuse: bool = False,
    policy: str = "memory",
    gradients: Sequence[str] = (),
    outputs: Sequence[str] = (),
    target: str = "function",
    namespace: str = "",
    sizes: Sequence[str] = (),
    domains: Sequence[str] = (),
) -> OpSpec:
    """Build an :class:`OpSpec` from the flags of ``scaffold new op``.

    ``tensors`` items are ``NAME`` or ``NAME=SHAPE`` (``x=4,5``, ``x=4,features``, ``beta=[]``); ``sizes``
    items ``NAME=VALUE`` (a size name's example value); ``learnable`` items are ``NAME`` or ``NAME=INIT`` (a
    number or a scheme) and declare learnable 0-dim tensors unless also given with ``--tensor``;
    ``scalars`` items are ``NAME=DEFAULT`` or ``NAME:TYPE=DEFAULT``; ``gradients`` items ``NAME=EXPR``;
    ``domains`` items ``T=LOW,HIGH`` (a tensor's ``domain``).
    """
    tensor_args, scalar_args = _argument_tables(tensors, scalars, learnable)
    for arg, domain in _domain_table(domains, tensor_args).items():
        tensor_args[arg]["domain"] = domain
    custom = _gradient_table(gradients)
    return spec_from_mapping(
        {
            "name": name,
            "forward": forward,
            "doc": doc,
            "fuse": fuse,
            "policy": policy,
            "target": target,
            "namespace": namespace,
            "tensors": tensor_args,
            "scalars": scalar_args,
            "gradients": custom,
            "outputs": list(outputs),
            "sizes": _size_table(sizes),
        },
        source="command-line flags",
    )


def spec_with_flags(
    spec: OpSpec,
    *,
    forward: str | None = None,
    doc: str | None = None,
    tensors: Sequence[str] = (),
    scalars: Sequence[str] = (),
    learnable: Sequence[str] = (),
    fuse: bool | None = None,
    policy: str | None = None,
    gradients: Sequence[str] = (),
    outputs: Sequence[str] | None = None,
    target: str | None = None,
    namespace: str | None = None,
    sizes: Sequence[str] = (),
    domains: Sequence[str] = (),
) -> OpSpec:
    """``spec`` changed by the flags of ``scaffold update op``.

    ``forward`` and ``doc`` replace the spec's; an argument given by a flag is added, or changes only what
    the flag names of the argument of that name (``--tensor beta=3`` its shape: a learnable beta stays
    learnable, with its init and domain); one that changes kind (a tensor given as ``--scalar``) is replaced;
    the other arguments are kept. A ``--gradient T=EXPR`` adds or replaces T's custom gradient; ``outputs``
    (the ``--output`` flags), where given, replace the spec's; a ``--domain T=LOW,HIGH`` sets T's domain.
    """
    data = spec_to_mapping(spec)
    if forward is not None:
        data["forward"] = forward
    if doc is not None:
        data["doc"] = doc
    if fuse is not None:
        data["fuse"] = fuse
    if policy is not None:
        data["policy"] = policy
    if target is not None:
        data["target"] = target
    if namespace is not None:
        data["namespace"] = namespace
    tensor_args, scalar_args = _argument_tables(tensors, scalars, learnable)
    for given, other in ((tensor_args, "scalars"), (scalar_args, "tensors")):
        for arg in given:
            data[other].pop(arg, None)
    for kind, given in (("tensors", tensor_args), ("scalars", scalar_args)):
        for arg, table in given.items():
            data[kind][arg] = {**data[kind].get(arg, {}), **table}
    for arg, domain in _domain_table(domains, data["tensors"]).items():
        data["tensors"][arg]["domain"] = domain
    data["gradients"] = {**data["gradients"], **_gradient_table(gradients)}
    data["sizes"] = {**data["sizes"], **_size_table(sizes)}
    if outputs:
        data["outputs"] = list(outputs)
    return spec_from_mapping(data, source=spec.source)


def _domain_table(domains: Sequence[str], tensors: Iterable[str]) -> dict[str, list[float]]:
    """The ``domain`` keys the ``--domain T=LOW,HIGH`` flags give the ``tensors`` of those names."""
    known = list(tensors)
    table: dict[str, list[float]] = {}
    for item in domains:
        arg, sep, text = item.partition("=")
        arg, where = arg.strip(), f"--domain {item}"
        parts = text.strip().strip("[]()").split(",")
        try:
            low, high = (float(part) for part in parts) if sep and len(parts) == 2 else (math.nan, math.nan)
        except ValueError:
            low = high = math.nan
        if not (math.isfinite(low) and math.isfinite(high)):
            raise SpecError(
                f"cannot read the domain {item!r}",
                where=where,
                hint="write T=LOW,HIGH, two finite numbers, e.g. --domain x=0.1,10 (both ends included)",
            )
        if arg not in known:
            near = did_you_mean(arg, known)
            raise SpecError(
                f"{arg!r} is not a tensor argument (tensors: {', '.join(known) or 'none'})",
                where=where,
                hint=f"did you mean {near!r}?" if near else f"declare it with --tensor {arg}, or name a tensor",
            )
        if low >= high:
            raise SpecError(
                f"the domain's low end {low:g} is not below its high end {high:g}",
                where=where,
                hint=f"write the lower end first: --domain {arg}={high:g},{low:g}"
                if low > high
                else f"give two different ends, e.g. --domain {arg}={low:g},{low + 1:g}",
            )
        _once(arg, table, "--domain", where)
        table[arg] = [low, high]
    return table


def _gradient_table(gradients: Sequence[str]) -> dict[str, str]:
    """The ``[gradients]`` table the ``--gradient T=EXPR`` flags describe."""
    custom: dict[str, str] = {}
    for item in gradients:
        arg, sep, text = item.partition("=")
        where = f"--gradient {item}"
        if not sep:
            raise SpecError("a gradient needs an expression", where=where, hint='write e.g. --gradient x="grad"')
        _once(arg.strip(), custom, "--gradient", where)
        custom[arg.strip()] = text
    return custom


def _argument_tables(
    tensors: Sequence[str], scalars: Sequence[str], learnable: Sequence[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The ``[tensors.*]`` and ``[scalars.*]`` tables the argument flags describe."""
    tensor_args: dict[str, dict[str, Any]] = {}
    for item in tensors:
        arg, _, shape = item.partition("=")
        where = f"--tensor {item}"
        check_identifier(arg.strip(), what="argument name", where=where)
        _once(arg.strip(), tensor_args, "--tensor", where)
        tensor_args[arg.strip()] = {"shape": list(_parse_shape(shape, where))} if "=" in item else {}
    for item in learnable:
        arg, _, init = item.partition("=")
        where = f"--learnable {item}"
        arg = check_identifier(arg.strip(), what="argument name", where=where)
        settings = tensor_args.setdefault(arg, {})
        settings["learnable"] = True
        if init:
            try:
                settings["init"] = float(init)
            except ValueError:
                settings["init"] = init.strip()  # a scheme, read by TensorArg
    scalar_args: dict[str, dict[str, Any]] = {}
    for item in scalars:
        where = f"--scalar {item}"
        if "=" not in item:
            raise SpecError("a scalar needs a default value", where=where, hint="write e.g. --scalar alpha=0.5")
        left, _, value = item.partition("=")
        arg, _, type_ = left.partition(":")
        type_ = type_.strip() or None
        if type_ is not None and type_ not in SCALAR_TYPES:
            raise SpecError(f"unknown scalar type {type_!r}", where=where, hint="use float, int or bool")
        inferred, default = _parse_scalar_value(value, type_, where)
        _once(arg.strip(), scalar_args, "--scalar", where)
        scalar_args[arg.strip()] = {"type": inferred, "default": default}
    return tensor_args, scalar_args


def _once(name: str, given: dict[str, Any], flag: str, where: str) -> None:
    if name in given:
        raise SpecError(
            f"{flag} {name} is given twice", where=where, hint=f"give each argument once, e.g. {flag} {name}=..."
        )


def spec_to_mapping(spec: OpSpec) -> dict[str, Any]:
    """``spec`` as the mapping :func:`spec_from_mapping` reads (the TOML document, parsed)."""
    tensors: dict[str, dict[str, Any]] = {}
    for t in spec.tensors:
        table: dict[str, Any] = {"shape": t.written_shape}
        if t.domain is not None:
            table["domain"] = list(t.domain)
        if t.avoid is not None:
            table["avoid"] = list(t.avoid)
        if t.learnable:
            table["learnable"] = True
        if t.init is not None:
            table["init"] = t.init
        if t.discrete:
            table["dtype"] = t.dtype
        tensors[t.name] = table
    scalars = {s.name: {"type": s.type, "default": s.default} for s in spec.scalars}
    data: dict[str, Any] = {"name": spec.name, "forward": spec.forward}
    if spec.doc:
        data["doc"] = spec.doc
    if spec.fuse:
        data["fuse"] = True
    if spec.policy != "memory":
        data["policy"] = spec.policy
    if spec.target != "function":
        data["target"] = spec.target
    if spec.namespace:
        data["namespace"] = spec.namespace
    if spec.outputs:
        data["outputs"] = list(spec.outputs)
    return {
        **data,
        "sizes": dict(spec.sizes),
        "tensors": tensors,
        "scalars": scalars,
        "gradients": dict(spec.gradients),
    }


def spec_to_toml(spec: OpSpec) -> str:
    """Write ``spec`` back as TOML, in the format :func:`load_spec` reads."""
    document = spec_to_mapping(spec)
    return dumps({key: value for key, value in document.items() if value not in ({}, [])})


__all__ = [
    "Init", "OpSpec", "ScalarArg", "TensorArg", "camel_case", "check_identifier", "linear_weight", "load_spec",
    "other_sizes", "parse_init", "spec_from_flags", "spec_from_mapping", "spec_to_mapping", "spec_to_toml",
    "spec_with_flags",
]  # fmt: skip
