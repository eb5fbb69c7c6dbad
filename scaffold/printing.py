"""Stage 6: print sympy expressions as torch source.

The registry's torch names (:mod:`.functions`) plus ``_print_<Class>`` methods, strict:
:func:`check_printable` walks an expression before it is printed and any node without a faithful torch
translation is an error naming that node; nothing is printed half-right. It fixes what sympy's own
``TorchPrinter`` gets wrong:

* ``Max``/``Min`` with numbers or scalar arguments use ``torch.clamp`` (``torch.maximum`` needs tensors);
* ``Heaviside`` is a comparison, ``(x > 0).to(x.dtype)``, with its value at 0 kept (``x >= 0`` for
  ``Heaviside(x, 1)``, ``torch.where(x == 0, 0.5, ...)`` for sympy's default); a step that multiplies is a
  bool mask, ``grad_output * (x > 0)``, where the factor it multiplies is finite (:func:`is_finite`), and
  selects, ``torch.where(x > 0, rest, 0)``, where that factor may overflow, so that ``inf * 0`` cannot make
  a NaN;
* ``Piecewise`` becomes nested ``torch.where``, a number where a condition holds too: ``torch.where(
  condition, number, t)``, which :mod:`.inplace` makes ``t.masked_fill_(condition, number)`` where ``t``
  is a fresh tensor of the result's shape, and which elsewhere costs half of ``t.masked_fill``'s clone and
  fill (4M float32 elements, one CPU thread: 3.0 ms against 6.2 ms where the mask is all False, 16.9 ms
  against 20.1 ms where it is random); a branch whose input :mod:`.lowering` kept inside the branch's
  region (``within``) prints that as a ``where`` too, so the untaken branch cannot put a NaN into the
  gradient;
* a case distinction between numbers takes its dtype from a float tensor beside it (never from a bool
  mask), and ``grad * tanh_grad(t)`` is one fused kernel, ``torch.ops.aten.tanh_backward``;
* parentheses follow what a sub-expression prints as, by Python's own precedence (:func:`binding`), not
  the sympy node it came from: ``x - 1 > 0`` in a product is parenthesized, ``x * (x > 1)``;
* ``xlog1py(x, y)`` is ``torch.where(x == 0, 0, x * torch.log1p(y))``, vectorized on a CPU where
  torch.special.xlog1py is not;
* ``polygamma(0, x)`` is ``torch.digamma``; ``sign`` and ``Abs`` of non-tensors are plain Python;
* functions of non-tensor arguments only (``exp(alpha)``) use :mod:`math`;
* the stable primitives of :mod:`.stable` map to PyTorch's own (``softplus`` ->
  ``torch.nn.functional.softplus``).

The printer records the modules besides torch that its output refers to, so the generated file imports
exactly those.

:class:`TorchPrinter` is one small class per kind of node, each over :class:`_PrinterBase` (the printer's
state and parenthesizing): atoms, arithmetic, masks in products, case distinctions, conditions, the
registry's functions, the stable primitives and the structural nodes.
"""

from __future__ import annotations

import ast
import functools
from typing import NamedTuple

import sympy
from sympy.printing.str import StrPrinter

from . import functions, stable
from .errors import DerivationError, error_context
from .lowering import guard_value, is_indicator, step_relational, within
from .structural import (
    ARG_INDICES,
    REDUCTIONS,
    RESHAPES,
    SCANS,
    ArgIndex,
    Concatenated,
    Flattened,
    Gather,
    LogSoftmax,
    LogSumExp,
    OneHot,
    Reduction,
    Reshaped,
    Scan,
    Sliced,
    Softmax,
    Structural,
    Transposed,
    sliced,
)

#: Module aliases the printed code may use, with the import line each needs.
IMPORTS = {"math": "import math"}
#: What the printer calls besides the registry's functions (:mod:`.functions`): elementwise, each result a new
#: tensor, which stage 6b (:mod:`.inplace`) may overwrite. Torch functions, then tensor methods.
PRINTED_FUNCTIONS = frozenset(
    {
        "torch.where",
        "torch.clamp",
        "torch.sqrt",
        "torch.rsqrt",
        "torch.sign",
        "torch.maximum",
        "torch.minimum",
    }
)
#: What the printer calls that computes a new bool mask from tensors (:meth:`TorchPrinter._print_log_argument`).
PRINTED_MASK_FUNCTIONS = frozenset({"torch.logical_or"})
#: The generated module's function that fused code computes ``-|t|`` with (:class:`.stable.neg_abs`).
NEG_ABS = "_neg_abs"
PRINTED_METHODS = frozenset({"clamp", "nan_to_num"})
#: Nodes that are not functions: numbers, symbols, arithmetic, conditions, case distinctions and lowering's
#: ``within``. Functions are printable where the registry (:mod:`.functions`) gives them a torch form.
_STRUCTURE = (
    sympy.Symbol, sympy.Number, sympy.NumberSymbol, sympy.Add, sympy.Mul, sympy.Pow, sympy.Piecewise,
    sympy.core.relational.Relational, sympy.And, sympy.Or, sympy.Not, sympy.ITE, sympy.logic.boolalg.BooleanAtom,
    sympy.functions.elementary.piecewise.ExprCondPair, within, Structural, sympy.Tuple,
)  # fmt: skip
_NOT_REAL = (sympy.core.numbers.ImaginaryUnit, sympy.core.numbers.Infinity, sympy.core.numbers.NegativeInfinity,
             sympy.core.numbers.ComplexInfinity, sympy.core.numbers.NaN)  # fmt: skip


#: How tightly Python binds a printed text's outermost operation, loosest first (the language reference's
#: precedence table). Parentheses follow what was printed, not the sympy node it came from: a step that
#: multiplies prints as a comparison, which binds more loosely than ``*``, wherever it stands.
(LAMBDA, CONDITIONAL, OR, AND, NOT, COMPARISON, BIT_OR, BIT_XOR, BIT_AND, SHIFT, SUM, PRODUCT, UNARY, POWER, AWAIT,
 ATOM) = range(16)  # fmt: skip
_BINARY = {
    ast.BitOr: BIT_OR, ast.BitXor: BIT_XOR, ast.BitAnd: BIT_AND, ast.LShift: SHIFT, ast.RShift: SHIFT,
    ast.Add: SUM, ast.Sub: SUM, ast.Mult: PRODUCT, ast.MatMult: PRODUCT, ast.Div: PRODUCT, ast.FloorDiv: PRODUCT,
    ast.Mod: PRODUCT, ast.Pow: POWER,
}  # fmt: skip


@functools.lru_cache(maxsize=4096)
def binding(text: str) -> int:
    """How tightly the outermost operation of the Python expression ``text`` binds (ATOM: a name, a
    number, a call, an attribute, anything parenthesized)."""
    text = text.strip()
    node = ast.parse(text, mode="eval").body
    if node.col_offset > 0:  # the whole text is in parentheses
        return ATOM
    if isinstance(node, ast.Lambda):
        return LAMBDA
    if isinstance(node, ast.IfExp):
        return CONDITIONAL
    if isinstance(node, ast.BoolOp):
        return OR if isinstance(node.op, ast.Or) else AND
    if isinstance(node, ast.UnaryOp):
        return NOT if isinstance(node.op, ast.Not) else UNARY
    if isinstance(node, ast.Compare):
        return COMPARISON
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)]
    if isinstance(node, ast.Await):
        return AWAIT
    return ATOM


#: sympy's precedence levels (StrPrinter's parenthesize) as Python's.
_PYTHON_LEVEL = {0: LAMBDA, 10: BIT_XOR, 20: OR, 30: AND, 35: COMPARISON, 40: SUM, 50: PRODUCT, 60: POWER, 70: ATOM}


def operand(text: str, tightest: int) -> str:
    """``text`` where Python reads an operand that binds at least as tightly as ``tightest``: parenthesized
    where its own outermost operation binds more loosely (a sum as a factor, a negation as a base)."""
    return text if binding(text) >= tightest else f"({text})"


def _unsupported(node: sympy.Basic, where: str | None = None) -> DerivationError:
    if isinstance(node, (sympy.Derivative, sympy.Subs, sympy.Integral)):
        message = f"sympy leaves {sympy.sstr(node)} unevaluated; it has no torch translation"
        hint = "rewrite that part of the forward with functions sympy can differentiate"
    elif isinstance(node, sympy.DiracDelta):
        message = f"{sympy.sstr(node)} has no torch translation"
        hint = "DiracDelta comes from differentiating a step; do not use it in the forward"
    elif isinstance(node, _NOT_REAL):
        message = f"the expression contains {sympy.sstr(node)}, which is not a finite real number"
        hint = "check for a division by zero or a function evaluated outside its domain"
    else:
        message = f"{sympy.sstr(node)} has no torch translation"
        hint = "use the functions listed in the README (exp, log, erf, Max, Piecewise, ...)"
    return DerivationError(message, where=where, hint=hint)


def check_printable(expr: sympy.Basic, *, where: str) -> None:
    """Raise :class:`DerivationError` naming the first sub-expression that cannot be printed as torch."""
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, _NOT_REAL) or not (
            isinstance(node, _STRUCTURE) or type(node) in functions.printable_classes()
        ):
            raise _unsupported(node, where)


#: Functions whose value is finite, whatever their argument (a NaN argument aside).
_BOUNDED = (stable.sigmoid, sympy.tanh, sympy.erf, sympy.erfc, sympy.atan, sympy.sign, sympy.Heaviside)
#: Functions whose value is finite where their arguments are.
_FINITE_OF_FINITE = (sympy.Abs, sympy.Max, sympy.Min, sympy.sin, sympy.cos, stable.silu)


def is_finite(expr: sympy.Basic, finite: frozenset[str] | set[str], tensors: frozenset[str] | set[str]) -> bool:
    """Whether ``expr`` is finite wherever the tensors named in ``finite`` are (the op's inputs, the
    upstream gradients, temporaries shown finite): numbers, Python scalars, sums and products of finite
    values, bounded functions (sigmoid, tanh, erf, steps) and case distinctions between finite values.
    Powers, exponentials, logarithms and quotients may overflow: not finite."""
    if not any(s.name in tensors for s in expr.free_symbols):
        return not expr.has(*_NOT_REAL)
    if expr.is_Symbol:
        return expr.name in finite
    if isinstance(expr, (sympy.Add, sympy.Mul, *_FINITE_OF_FINITE)):
        return all(is_finite(a, finite, tensors) for a in expr.args)
    if isinstance(expr, sympy.Piecewise):
        return all(is_finite(p.expr, finite, tensors) for p in expr.args)
    return isinstance(expr, (*_BOUNDED, sympy.logic.boolalg.Boolean))


def _boolean_symbols(expr: sympy.Basic) -> set[sympy.Symbol]:
    """The symbols ``expr`` uses as conditions (a temporary holding a comparison: a bool tensor)."""
    used = [pair.cond for p in expr.atoms(sympy.Piecewise) for pair in p.args]
    used += [arg for b in expr.atoms(sympy.And, sympy.Or, sympy.Not) for arg in b.args]
    return {c for c in used if isinstance(c, sympy.Symbol)}


class _PrinterBase(StrPrinter):
    """What every part of the printer shares: which symbols are tensors (and which of those are bool
    masks or known finite), the modules the text refers to, and operands parenthesized by what they print as.

    Each class below prints one kind of node; :class:`TorchPrinter` is all of them.
    """

    def __init__(
        self,
        tensors: frozenset[str] | set[str],
        bools: frozenset[str] | set[str] = frozenset(),
        anchor: str = "grad_output",
        anchor_text: str | None = None,
        finite: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        super().__init__()
        self.anchor = anchor
        self.anchor_text = anchor_text or anchor
        self.tensors = frozenset(tensors)
        self.bools = frozenset(bools)  # those of the tensors that are bool (saved masks)
        self.finite = frozenset(finite)  # those of the tensors known to be finite (is_finite)
        self.imports: set[str] = set()  # keys of IMPORTS
        self.helpers: set[str] = set()  # the generated module's own functions the code calls (NEG_ABS)
        self._dtype_anchored = False
        self._tensor_argument = False  # printing a torch function's argument, which must be a tensor

    def is_tensor(self, expr: sympy.Basic) -> bool:
        return any(s.name in self.tensors for s in expr.free_symbols)

    def _qualified(self, name: str) -> str:
        """``name``, recording the module it is reached through (``math.exp``)."""
        alias = name.split(".", 1)[0]
        if alias in IMPORTS and "." in name:
            self.imports.add(alias)
        return name

    def _argument(self, item: sympy.Basic) -> str:
        """``item`` as a torch function's tensor argument (a case picked in Python gives a tensor)."""
        self._tensor_argument = isinstance(item, sympy.Piecewise)
        try:
            return self._print(item)
        finally:
            self._tensor_argument = False

    def _operand(self, item: sympy.Basic, tightest: int) -> str:
        """``item`` printed as an operand that must bind at least as tightly as ``tightest``."""
        return operand(self._print(item), tightest)

    def parenthesize(self, item: sympy.Basic, level: int, strict: bool = False) -> str:
        """sympy's hook, for the methods inherited from StrPrinter: by what ``item`` prints as."""
        tightest = _PYTHON_LEVEL[max(k for k in _PYTHON_LEVEL if k <= level)]
        return self._operand(item, tightest if strict else tightest + 1)

    def emptyPrinter(self, expr: object) -> str:
        raise _unsupported(expr) if isinstance(expr, sympy.Basic) else TypeError(expr)

    def _print_Basic(self, expr: sympy.Basic) -> str:
        raise _unsupported(expr)


class _AtomPrinter(_PrinterBase):
    """Symbols, numbers and the constants: a fraction as the decimal the spec most likely wrote."""

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return expr.name

    def _print_Float(self, expr: sympy.Float) -> str:
        return repr(float(expr))

    def _print_Rational(self, expr: sympy.Rational) -> str:
        """A fraction with a short decimal expansion as that decimal, as the spec most likely wrote it
        (1.702, not 851/500): Python reads either as the same float, the one nearest the fraction."""
        if expr.q == 1:
            return str(expr.p)
        decimal = _decimal(expr)
        return decimal if decimal is not None else f"{expr.p}/{expr.q}"

    def _print_Pi(self, expr: sympy.Basic) -> str:
        return self._qualified("math.pi")

    def _print_Exp1(self, expr: sympy.Basic) -> str:
        return self._qualified("math.e")

    def _print_BooleanTrue(self, expr: sympy.Basic) -> str:
        return "True"

    def _print_BooleanFalse(self, expr: sympy.Basic) -> str:
        return "False"


class _ArithmeticPrinter(_PrinterBase):
    """Sums, powers and products: minus signs as subtractions, reciprocals as divisions, each tensor
    touched once. A product's steps, case distinctions and derivative kernels go to the printers of those."""

    def _print_Add(self, expr: sympy.Add, order: str | None = None) -> str:
        """A sum, its terms' leading minus signs made subtractions: x - y, x - (1 - s), never x - 1 - s."""
        text = ""
        for term in self._as_ordered_terms(expr, order=order):
            printed = self._print(term)
            if text and printed.startswith("-") and binding(printed) >= PRODUCT:  # -a * b: (-a) * b
                text += f" - {operand(printed[1:], PRODUCT)}"
            elif text:
                text += f" + {operand(printed, SUM)}"
            else:
                text = operand(printed, SUM)
        return text

    def _print_Pow(self, expr: sympy.Pow, rational: bool = False) -> str:  # StrPrinter passes `rational`
        base, exponent = expr.args
        tensor = self.is_tensor(base)
        if exponent == sympy.S.Half:
            sqrt = "torch.sqrt" if tensor else self._qualified("math.sqrt")
            return f"{sqrt}({self._print(base)})"
        if exponent == -sympy.S.Half:
            if tensor:
                return f"torch.rsqrt({self._print(base)})"
            return f"1 / {self._qualified('math.sqrt')}({self._print(base)})"
        if exponent == -1:
            return f"1 / {self._operand(base, POWER)}"
        # Other negative powers stay powers, x**-7 rather than 1 / x**7: the double backward of the
        # reciprocal squares 1 / x**7 (inf in float32 at x = 1e-3); pow's own, -7 * x**-8, does not.
        exponent_text = self._print(exponent)
        if not exponent.is_Integer and not exponent.is_Symbol:
            exponent_text = f"({exponent_text})"
        # A base binds tighter than ** itself: (x**a)**b and (-x)**b keep their parentheses.
        return f"{self._operand(base, AWAIT)}**{operand(exponent_text, UNARY)}"

    def _print_Mul(self, expr: sympy.Mul) -> str:
        """A product: a step selects, a case distinction between numbers scales the rest, a derivative
        kernel fuses with what it multiplies; anything else is multiplied out."""
        _, factors = expr.as_coeff_mul()
        masks = self._dtype_free_factors(factors)
        steps = [m for m in masks if isinstance(m, sympy.Heaviside) or is_indicator(m)]
        if steps:
            return self._mul_selection(expr, steps)
        cases = [m for m in masks if isinstance(m, sympy.Piecewise)]
        if len(cases) == 1 and (scaled := self._mul_scaled_cases(expr, cases[0])) is not None:
            return scaled
        kernel = next((f for f in factors if isinstance(f, stable.DerivativeKernel) and self.is_tensor(f)), None)
        if kernel is not None and any(self.is_tensor(f) for f in factors if f is not kernel):
            return self._mul_fused_kernel(expr, kernel)
        return self._mul_product(expr, masks)

    def _mul_product(self, expr: sympy.Mul, masks: list[sympy.Basic]) -> str:
        """The factors multiplied out: numbers first, then tensors, a denominator for reciprocals, and
        the ``masks`` last, printed with the product's dtype already fixed by its tensors."""
        coefficient, factors = expr.as_coeff_mul()
        if self.is_tensor(expr) and abs(coefficient) != 1:
            # A number times a sum whose tensor terms all have numbers of their own goes into the sum:
            # 2 * t * (0.5 * u + 1) is t * (u + 2), one pass fewer over the tensors.
            sink = next((f for f in factors if f not in masks and self._takes_coefficient(f)), None)
            if sink is not None:
                scaled = sympy.Add(*(coefficient * term for term in sink.args))
                return self._print(sympy.Mul(*(scaled if f is sink else f for f in factors)))
        sign = "-" if coefficient.is_negative else ""
        coefficient = abs(coefficient)
        numerator: list[str] = []
        denominator: list[str] = []
        scalars = [f for f in factors if f not in masks and not self.is_tensor(f)]
        plain = coefficient == 1 or (coefficient.is_Rational and coefficient.p == 1 and not sign)  # -x, x / 2
        if self.is_tensor(expr) and (scalars or not plain):
            # The factors that are numbers are multiplied out in Python first, so that each tensor is
            # touched once: 3/2 * x, not 3 * x / 2, which is two passes over x.
            factors = tuple(f for f in factors if f not in scalars)
            group = sympy.Mul(-coefficient if sign else coefficient, *scalars)
            text = self._print(group)
            numerator.append(f"({text})" if isinstance(group, sympy.Add) else text)
            coefficient, sign = sympy.S.One, ""
        if coefficient.is_Rational:
            if coefficient.p != 1:
                numerator.append(str(coefficient.p))
            if coefficient.q != 1:
                denominator.append(str(coefficient.q))
        elif coefficient != 1:
            numerator.append(self._print(coefficient))
        for factor in factors:
            if factor in masks:
                continue
            if factor.is_Pow and (factor.exp == -1 or (factor.exp == -sympy.S.Half and not self.is_tensor(factor))):
                inverse = factor.base if factor.exp == -1 else sympy.sqrt(factor.base)
                denominator.append(self._operand(inverse, POWER))
            else:
                numerator.append(self._operand(factor, POWER))
        # The masks' case distinctions need no dtype anchor of their own: the product's tensors fix it.
        self._dtype_anchored, anchored = bool(masks), self._dtype_anchored
        try:
            numerator += [self._print(m) for m in masks]
        finally:
            self._dtype_anchored = anchored
        text = " * ".join(numerator) or "1"
        if len(denominator) == 1:
            text += " / " + denominator[0]
        elif denominator:
            text += " / (" + " * ".join(denominator) + ")"
        return sign + text

    def _takes_coefficient(self, factor: sympy.Basic) -> bool:
        """Whether ``factor`` is a sum each of whose tensor terms has a numeric coefficient (not 1 or -1),
        so that scaling it costs no tensor operation."""
        if not factor.is_Add or not self.is_tensor(factor):
            return False
        return all(abs(t.as_coeff_Mul()[0]) != 1 for t in factor.args if self.is_tensor(t))


class _MaskPrinter(_PrinterBase):
    """A step or a case distinction between numbers that multiplies a float tensor: a bool mask where the
    rest is finite, else a selection; the tensor fixes the product's dtype."""

    def _dtype_free_factors(self, factors: tuple[sympy.Basic, ...]) -> list[sympy.Basic]:
        """The steps and case distinctions between numbers among ``factors``, where a float tensor
        multiplies them: printed as a boolean mask or a plain torch.where, since that factor fixes the
        result's dtype."""
        masks = [f for f in factors if self._is_dtype_free(f)]
        return masks if any(self.is_tensor(f) for f in factors if f not in masks) else []

    def _is_dtype_free(self, factor: sympy.Basic) -> bool:
        if isinstance(factor, sympy.Heaviside):
            return factor.args[1] in (0, 1) and self.is_tensor(factor.args[0])
        if isinstance(factor, sympy.Piecewise):
            return self.is_tensor(factor) and not any(self.is_tensor(p.expr) for p in factor.args)
        return False

    def _mul_selection(self, expr: sympy.Mul, steps: list[sympy.Basic]) -> str:
        """A step multiplies as a bool mask, ``grad_output * (x > 0)``, where the rest of the product is
        finite. Elsewhere it selects: where() keeps an overflowing factor it zeroes (exp(x) * (x < 0) at
        x = 100) from making inf * 0 = nan, and the factor's input is kept where the step is 1, so that its
        gradient is not 0 * inf = nan either (double backward)."""
        rest = sympy.Mul(*[f for f in expr.args if f not in steps])
        conditions = [step_relational(m) for m in steps]
        kept_inside = guard_value(rest, sympy.And(*conditions), self.is_tensor) != rest
        if is_finite(rest, self.finite | self.bools, self.tensors) and not kept_inside:
            mask = " & ".join(self._operand(c, BIT_AND + 1) for c in conditions)
            return f"{self._operand(rest, PRODUCT)} * {operand(mask, PRODUCT + 1)}"
        if len(conditions) == 1:
            return f"torch.where({self._print(conditions[0])}, {self._print_branch(rest, conditions[0])}, 0)"
        condition = " & ".join(self._operand(c, BIT_AND + 1) for c in conditions)
        return f"torch.where({condition}, {self._print(rest)}, 0)"

    def _mul_scaled_cases(self, expr: sympy.Mul, case: sympy.Piecewise) -> str | None:
        """A case distinction between numbers times a tensor, as each case scaling the tensor, so that the
        numbers keep its dtype (torch.where(c, 1, 0.01) would be float32 next to float64); None where the
        rest is too costly to print once per case."""
        others = list(expr.args)
        others.remove(case)  # by equality: as_coeff_mul may hand out an equal, not the same, object
        rest = sympy.Mul(*others)
        if sympy.count_ops(rest) > 2:
            return None
        return self._print(sympy.Piecewise(*[(p.expr * rest, p.cond) for p in case.args]))


class _CasePrinter(_PrinterBase):
    """Case distinctions: ``Piecewise`` as nested ``torch.where`` (or a Python conditional where its
    conditions are on scalars alone), ``Heaviside`` as a comparison, lowering's ``within`` as a ``where``."""

    def _print_Piecewise(self, expr: sympy.Piecewise) -> str:
        pairs = list(expr.args)
        if pairs[-1].cond is not sympy.true:
            raise DerivationError(
                f"{sympy.sstr(expr)} has no value where none of its conditions hold",
                hint="end the Piecewise with an (expr, True) pair",
            )
        if not self.is_tensor(expr):
            text = self._print(pairs[-1].expr)
            for value, cond in reversed(pairs[:-1]):
                text = f"({self._print(value)} if {self._print(cond)} else {text})"
            return text
        any_tensor_value = any(self.is_tensor(p.expr) for p in pairs)
        # A condition on scalars alone picks its branch in Python: as a torch function's argument, a number it
        # may pick becomes a tensor (of a float tensor's dtype), so that torch.abs, ... gets a tensor.
        wanted, self._tensor_argument = self._tensor_argument, False
        picked = wanted and any_tensor_value and not all(self.is_tensor(p.cond) for p in pairs[:-1])
        floats = sorted(s.name for p in pairs for s in p.expr.free_symbols if s.name in self.tensors - self.bools)
        previous: list[sympy.Basic] = []
        branches = []
        for value, cond in pairs:
            region = sympy.And(cond, *[sympy.Not(c) for c in previous]) if previous else cond
            previous.append(cond)
            value_text = self._print_branch(value, region)
            if picked and floats and not self.is_tensor(value):
                value_text = f"{floats[0]}.new_tensor({value_text})"
            branches.append((value_text, cond))
        text = branches[-1][0]
        if not any_tensor_value and not self._dtype_anchored:
            # Both values are numbers: anchor the dtype on a float tensor of the condition, else on
            # the upstream gradient (a bool mask's new_tensor(0) is bool, and where(mask, 1, False) int64: times
            # a float scalar, float32 inside a float64 gradient).
            # a symbol that is itself a condition is a bool tensor, said so or not
            conditions = {c.name for c in _boolean_symbols(expr)}
            floats = sorted(s.name for s in expr.free_symbols if s.name in self.tensors - self.bools - conditions)
            anchor = floats[0] if floats else self.anchor_text if self.anchor in self.tensors else None
            if anchor is None:
                raise DerivationError(
                    f"{sympy.sstr(expr)} has no float tensor to take its dtype from",
                    hint="this is a bug in scaffold: please report the forward",
                )
            text = f"{anchor}.new_tensor({text})"
        for value_text, cond in reversed(branches[:-1]):
            if self.is_tensor(cond):
                text = f"torch.where({self._print(cond)}, {value_text}, {text})"
            else:  # a condition on scalars alone picks a branch once, in Python
                text = f"({value_text} if {self._print(cond)} else {text})"
        return text

    def _print_branch(self, value: sympy.Expr, region: sympy.Basic) -> str:
        """Print one Piecewise value; keep its input inside its region when its functions need that
        (unless lowering did: the test's reference is printed as written)."""
        if not value.has(within):
            value = guard_value(value, region, self.is_tensor)
        return self._print(value)

    def _print_within(self, expr: within) -> str:
        value, condition, inside = expr.args
        return f"torch.where({self._print(condition)}, {self._print(value)}, {self._print(inside)})"

    def _print_Heaviside(self, expr: sympy.Heaviside) -> str:
        """A comparison in the dtype of a float tensor of the argument, with the step's value at 0 kept:
        ``(x > 0)`` (0 at 0), ``(x >= 0)`` (1 at 0), ``torch.where(x == 0, 0.5, (x > 0).to(...))``
        otherwise. torch.heaviside has no derivative, which breaks double backward and the reference
        test; a comparison's result needs none (the step is flat)."""
        arg, at_zero = expr.args
        if not self.is_tensor(arg):
            text = self._print(arg)
            return f"(1.0 if {text} > 0 else 0.0 if {text} < 0 else {self._print(at_zero)})"
        floats = sorted(s.name for s in arg.free_symbols if s.name in self.tensors - self.bools)
        dtype = f"{floats[0]}.dtype" if floats else f"{self.anchor_text}.dtype"
        if at_zero in (0, 1):
            return f"({self._print(step_relational(expr))}).to({dtype})"
        step = f"({self._print(step_relational(sympy.Heaviside(arg, 0)))}).to({dtype})"
        return f"torch.where({self._print_is_zero(arg)}, {self._print(at_zero)}, {step})"

    def _print_is_zero(self, arg: sympy.Expr) -> str:
        """``arg == 0``, its constant moved to the right: ``1 - |x| == 0`` reads better as ``|x| == 1``."""
        constant, terms = arg.as_coeff_add()
        lhs, rhs = sympy.Add(*terms), -constant
        if lhs.could_extract_minus_sign():
            lhs, rhs = -lhs, -rhs
        return self._print(sympy.Eq(lhs, rhs, evaluate=False))


class _ConditionPrinter(_PrinterBase):
    """Conditions: comparisons, ``&``, ``|`` and ``~`` between tensors, ``and``, ``or`` and ``not``
    between Python bools, and sympy's if-then-else between conditions."""

    def _print_Relational(self, expr: sympy.core.relational.Relational) -> str:
        op = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}[expr.rel_op]
        # comparisons chain in Python (a < b < c) and bind more loosely than & and |: both sides bind tighter
        return f"{self._operand(expr.lhs, BIT_OR)} {op} {self._operand(expr.rhs, BIT_OR)}"

    def _print_And(self, expr: sympy.And) -> str:
        return self._boolean(expr, "&", "and")

    def _print_Or(self, expr: sympy.Or) -> str:
        return self._boolean(expr, "|", "or")

    def _print_Not(self, expr: sympy.Not) -> str:
        (arg,) = expr.args
        return f"~({self._print(arg)})" if self.is_tensor(arg) else f"not ({self._print(arg)})"

    def _boolean(self, expr: sympy.Basic, tensor_op: str, python_op: str) -> str:
        args = sorted(expr.args, key=sympy.default_sort_key)
        if not self.is_tensor(expr):
            return f" {python_op} ".join(f"({self._print(a)})" for a in args)
        # & and | bind tighter than comparisons: (x > 0) & mask
        tightest = BIT_AND + 1 if tensor_op == "&" else BIT_OR + 1
        return f" {tensor_op} ".join(self._operand(a, tightest) for a in args)

    def _print_ITE(self, expr: sympy.ITE) -> str:
        # if-then-else between conditions: sympy folds Abs(Piecewise(...) - t) <= delta into one
        condition, then, otherwise = expr.args
        if self.is_tensor(condition):
            return f"torch.where({self._print(condition)}, {self._print(then)}, {self._print(otherwise)})"
        if self.is_tensor(expr):  # a Python bool picks a condition on tensors: both, each with its case
            return self._print(expr.to_nnf(simplify=False))
        return f"(({self._print(then)}) if ({self._print(condition)}) else ({self._print(otherwise)}))"


class _FunctionPrinter(_PrinterBase):
    """The registry's functions (:mod:`.functions`): each call spelled as its torch form, or its
    :mod:`math` form where no argument is a tensor; ``Max``/``Min`` with numbers as ``torch.clamp``."""

    def _print_Function(self, expr: sympy.Function) -> str:
        if isinstance(expr, stable.DerivativeKernel):  # nothing to fuse it with: its formula
            return self._print(type(expr).expanded(*expr.args))
        function = functions.by_class(type(expr))
        if function is not None and function.reciprocal_of is not None:  # torch has no cot: 1 / tan
            reciprocal = function.reciprocal_of(*expr.args, evaluate=False)
            return f"(1 / {self._print(reciprocal)})"
        if function is None or function.torch is None:
            raise _unsupported(expr)
        if isinstance(expr, stable.StableFunction) and not self.is_tensor(expr):
            return self._print(type(expr).literal(*expr.args))  # a number: its formula, in math
        torch_name, math_name = function.torch, function.math
        if self.is_tensor(expr):
            args = ", ".join(self._argument(a) if self.is_tensor(a) else self._print(a) for a in expr.args)
        else:
            args = ", ".join(self._print(a) for a in expr.args)
        if self.is_tensor(expr):
            if function.tensor_only and not all(self.is_tensor(a) for a in expr.args):
                # torch.hypot(x, 0.1) is refused: the number becomes a 0-dim tensor of x's dtype and device
                anchor = sorted(s.name for s in expr.free_symbols if s.name in self.tensors)[0]
                args = ", ".join(
                    self._print(a) if self.is_tensor(a) else f"{anchor}.new_tensor({self._print(a)})" for a in expr.args
                )
            return f"{self._qualified(torch_name)}({args})"
        if isinstance(expr, sympy.sign):
            (arg,) = expr.args
            return f"(({self._print(arg)} > 0) - ({self._print(arg)} < 0))"
        if math_name is None:
            raise DerivationError(
                f"{sympy.sstr(expr)} has only non-tensor arguments and Python's math module has no "
                f"{type(expr).__name__}",
                hint="declare the argument as a tensor",
            )
        return f"{self._qualified(math_name)}({args})"

    def _print_polygamma(self, expr: sympy.polygamma) -> str:
        order, arg = expr.args
        if not self.is_tensor(arg) or not order.is_Integer:
            raise _unsupported(expr)
        if order == 0:
            return f"{functions.by_class(sympy.digamma).torch}({self._print(arg)})"
        return f"{functions.by_class(sympy.polygamma).torch}({int(order)}, {self._print(arg)})"

    def _print_digamma(self, expr: sympy.Basic) -> str:
        return self._print_polygamma(sympy.polygamma(0, expr.args[0], evaluate=False))

    def _minmax(self, expr: sympy.Basic, torch_name: str, clamp_side: str, builtin: str) -> str:
        tensors = [a for a in expr.args if self.is_tensor(a)]
        numbers = [a for a in expr.args if not self.is_tensor(a)]
        if not tensors:
            return f"{builtin}({', '.join(self._print(a) for a in numbers)})"
        text = self._argument(tensors[0])
        for other in tensors[1:]:
            text = f"{torch_name}({text}, {self._argument(other)})"
        if numbers:
            bound = (
                self._print(numbers[0]) if len(numbers) == 1 else f"{builtin}({', '.join(map(self._print, numbers))})"
            )
            text = f"torch.clamp({text}, {clamp_side}={bound})"
        return text

    def _print_Max(self, expr: sympy.Max) -> str:
        function = functions.by_class(sympy.Max)
        return self._minmax(expr, function.torch, "min", function.math)

    def _print_Min(self, expr: sympy.Min) -> str:
        function = functions.by_class(sympy.Min)
        return self._minmax(expr, function.torch, "max", function.math)


class _StablePrinter(_PrinterBase):
    """The primitives of :mod:`.stable` that print as more than the registry's torch name: a derivative
    kernel fused with what it multiplies, ``xlogy`` and ``xlog1py`` as a log and a multiply (faster than
    torch's own on the CPU), the guards' ``where``, fused code's ``-|t|``, and the primitives torch has no
    kernel for (:data:`EXPANDED`), as their formulas."""

    def _mul_fused_kernel(self, expr: sympy.Mul, kernel: stable.DerivativeKernel) -> str:
        """grad * tanh_grad(t) as one fused kernel, tanh_backward(grad, t), not grad * (1 - t**2)."""
        others = list(expr.args)
        others.remove(kernel)
        fused = functions.by_class(type(kernel)).kernel
        return f"{fused}({self._print(sympy.Mul(*others))}, {self._print(kernel.args[0])})"

    def _print_xlogy(self, expr: stable.xlogy) -> str:
        """``x * log(y)``, 0 where x is: torch.xlogy has no vectorized CPU kernel (4M float32 elements, one
        thread: 3x the time of torch.log; binary cross-entropy's fwd+bwd 1.72x plain autograd's with it,
        1.64x with log, a multiply and a fill). Only where x is a tensor, or one plus a number (1 - y), as
        its comparison with 0 prints it again."""
        terms = sympy.Add.make_args(expr.args[0])
        if len(terms) > 2 or not all(t.is_Number or t.is_Symbol or (-t).is_Symbol for t in terms):
            return self._print_Function(expr)
        return self._zero_where_weightless(expr, "torch.log", expr.args[1])

    def _print_xlog1py(self, expr: stable.xlog1py) -> str:
        """``x * log1p(y)``, 0 where x is: torch.special.xlog1py has no vectorized CPU kernel (4M float32
        elements, one thread: 8x the time of torch.log1p, and more than where, log1p and a multiply)."""
        return self._zero_where_weightless(expr, "torch.log1p", 1 + expr.args[1])

    def _zero_where_weightless(self, expr: stable.xlogy | stable.xlog1py, log: str, log_argument: sympy.Expr) -> str:
        """``x * log(...)`` with its product 0 where x is, unless the log's argument is positive."""
        x, y = expr.args
        if not self.is_tensor(expr):
            return self._print_Function(expr)
        product = f"{self._operand(x, PRODUCT)} * {self._qualified(log)}({self._argument(y)})"
        # the log is finite (symlog's sign(x) * log1p(|x|)): the product is 0 where x is
        if stable.positive_where_defined(log_argument):
            return product
        return f"torch.where({self._print_is_zero(x)}, 0, {product})"

    def _print_log_argument(self, expr: stable.log_argument) -> str:
        """``torch.where((x == 0) & (y == pole), safe, y)``: y, its pole taken away where its weight is 0.
        Where the pole is 0 and both are tensors, ``torch.where(torch.logical_or(y, x), y, safe)``: logical_or
        reads a float as "not 0", one kernel where the two comparisons and their ``&`` are three (4M float32
        elements, one thread: 2.5 ms against 6.9 ms; binary cross-entropy's backward guards two arguments)."""
        pole, safe, y, x = expr.args
        if pole != 0 or not (self.is_tensor(y) and self.is_tensor(x)):
            return self._print(expr.rewrite(sympy.Piecewise))
        value = self._print(y)
        return f"torch.where(torch.logical_or({value}, {self._print(x)}), {value}, {self._print(safe)})"

    def _print_finite_at_zero(self, expr: stable.finite_at_zero) -> str:
        value, x = expr.args
        text = self._operand(value, ATOM)
        return f"torch.where({self._print(x)} == 0, {text}.nan_to_num(), {text})"

    def _print_neg_abs(self, expr: stable.neg_abs) -> str:
        self.helpers.add(NEG_ABS)
        return f"{NEG_ABS}({self._print(expr.args[0])})"

    def _print_kept(self, expr: stable.kept) -> str:
        return self._print(expr.args[0])

    def _print_expanded(self, expr: sympy.Function) -> str:
        """One of :data:`EXPANDED`, as its formula in the other primitives."""
        return self._print(type(expr).expanded(*expr.args))


#: Stable primitives that torch has no kernel for, printed as their formulas in the others (``expanded``).
EXPANDED = (stable.log_ndtr_grad, stable.log_softplus, stable.tanh_softplus)
for _class in EXPANDED:
    setattr(_StablePrinter, f"_print_{_class.__name__}", _StablePrinter._print_expanded)


class _StructuralPrinter(_PrinterBase):
    """Reductions, softmax and products of :mod:`.structural`, as the forward wrote them (the generated
    test's reference)."""

    def _print_Reduction(self, expr: Reduction) -> str:
        receiver = self._operand(expr.args[0], ATOM)
        dims, keep = expr.dims, ", keepdim=True" if expr.keepdim else ""
        dim = (str(dims[0]) if len(dims) == 1 else str(dims)) if dims else None
        if isinstance(expr, LogSumExp):
            return f"torch.logsumexp({self._print(expr.args[0])}, dim={dim or f'tuple(range({receiver}.dim()))'}{keep})"
        method = type(expr).spelling
        if dim is None and not keep:
            return f"{receiver}.{method}()"
        if dim is None:  # every dimension, kept: amax and amin spell it dim=()
            dim = "()" if method in ("amax", "amin") else "None"
        return f"{receiver}.{method}(dim={dim}{keep})"

    def _print_Softmax(self, expr: Softmax) -> str:
        function = "torch.log_softmax" if isinstance(expr, LogSoftmax) else "torch.softmax"
        return f"{function}({self._print(expr.args[0])}, dim={expr.dim})"

    def _print_Scan(self, expr: Scan) -> str:
        return f"torch.{expr.spelling}({self._print(expr.args[0])}, dim={expr.dim})"

    def _print_MatrixProduct(self, expr: Structural) -> str:
        a, b = (self._operand(e, POWER) for e in expr.args)
        # a one_hot is int64, which matmul does not promote: it takes the other operand's dtype
        if isinstance(expr.args[0], OneHot):
            a = f"{a}.to({self._operand(expr.args[1], ATOM)}.dtype)"
        if isinstance(expr.args[1], OneHot):
            b = f"{b}.to({self._operand(expr.args[0], ATOM)}.dtype)"
        return f"({a} @ {b})"

    def _print_Transposed(self, expr: Transposed) -> str:
        return f"{self._operand(expr.args[0], ATOM)}.transpose({expr.dims[0]}, {expr.dims[1]})"

    def _print_Sliced(self, expr: Sliced) -> str:
        return sliced(self._operand(expr.args[0], ATOM), expr)

    def _print_Reshaping(self, expr: Structural) -> str:
        x = self._operand(expr.args[0], ATOM)
        if isinstance(expr, Reshaped):
            return f"{x}.reshape({', '.join(map(str, expr.sizes))})"
        if isinstance(expr, Flattened):
            return f"{x}.flatten({expr.dims[0]}, {expr.dims[1]})"
        return f"{x}.{expr.spelling}({expr.args[1]})"

    def _print_Concatenated(self, expr: Concatenated) -> str:
        function = "torch.stack" if expr.spelling == "stack" else "torch.cat"
        return f"{function}(({', '.join(self._print(o) for o in expr.operand_exprs)}), dim={expr.dim})"

    def _print_Gather(self, expr: Gather) -> str:
        return f"torch.gather({self._print(expr.args[0])}, {expr.dim}, {expr.index_code(self._print(expr.args[1]))})"

    def _print_OneHot(self, expr: OneHot) -> str:
        # int64, which the float math it meets promotes; in the float dtype of the anchor where there is one, as
        # an op that returns the one_hot itself (a hard one-hot with a straight-through gradient) must
        code = f"torch.nn.functional.one_hot({expr.index_code(self._print(expr.args[0]))}, {expr.classes})"
        return f"{code}.to({self.anchor_text}.dtype)" if self.anchor in self.tensors else code

    def _print_ArgIndex(self, expr: ArgIndex) -> str:
        keep = ", keepdim=True" if expr.keepdim else ""
        return f"{self._operand(expr.args[0], ATOM)}.{expr.spelling}(dim={expr.dim}{keep})"


for _class in REDUCTIONS.values():
    setattr(_StructuralPrinter, f"_print_{_class.__name__}", _StructuralPrinter._print_Reduction)
_StructuralPrinter._print_LogSoftmax = _StructuralPrinter._print_Softmax
for _class in SCANS.values():
    setattr(_StructuralPrinter, f"_print_{_class.__name__}", _StructuralPrinter._print_Scan)
_StructuralPrinter._print_Stacked = _StructuralPrinter._print_Concatenated
for _class in ARG_INDICES.values():
    setattr(_StructuralPrinter, f"_print_{_class.__name__}", _StructuralPrinter._print_ArgIndex)
for _class in RESHAPES.values():
    setattr(_StructuralPrinter, f"_print_{_class.__name__}", _StructuralPrinter._print_Reshaping)


class TorchPrinter(
    _StablePrinter,
    _FunctionPrinter,
    _MaskPrinter,
    _CasePrinter,
    _ConditionPrinter,
    _ArithmeticPrinter,
    _AtomPrinter,
    _StructuralPrinter,
):
    """Prints sympy expressions as torch code.

    ``tensors`` are the names of tensor-valued symbols (arguments, temporaries, ``grad_output``); every
    other symbol is a Python number, and expressions over those alone are printed as plain Python.
    """


#: The most digits after the point a fraction is printed with as a decimal.
MAX_DECIMALS = 12


def _decimal(number: sympy.Rational) -> str | None:
    """``number`` as a decimal literal where that is exact and at most MAX_DECIMALS digits long after the
    point (its denominator divides 10**MAX_DECIMALS), else None."""
    scale = 10**MAX_DECIMALS
    if scale % number.q:
        return None
    digits = str(abs(number.p) * (scale // number.q)).rjust(MAX_DECIMALS + 1, "0")
    whole, fraction = digits[:-MAX_DECIMALS], digits[-MAX_DECIMALS:].rstrip("0")
    return f"{'-' if number.p < 0 else ''}{whole}.{fraction}"


def math_text(expr: sympy.Basic) -> str:
    """``expr`` for a docstring: derivative kernels (tanh_grad, ...) written as their formulas, and
    xexpy(x, y) as x*exp(y), kept(w) as w and log_argument as its cases (implementation details)."""
    expr = stable.expand_kernels(expr).replace(
        lambda e: isinstance(e, stable.xexpy), lambda e: stable.xexpy.literal(*e.args)
    )
    expr = expr.replace(lambda e: isinstance(e, stable.log_argument), lambda e: e.rewrite(sympy.Piecewise))
    expr = expr.replace(lambda e: isinstance(e, stable.kept), lambda e: e.args[0])
    expr = expr.replace(lambda e: isinstance(e, stable.tanh_softplus), lambda e: sympy.tanh(stable.softplus(e.args[0])))
    return sympy.sstr(expr)


class Printed(NamedTuple):
    """Printed code, and what it refers to besides torch."""

    text: str
    imports: frozenset[str]  # modules: keys of IMPORTS
    helpers: frozenset[str]  # the generated module's own functions (NEG_ABS), which its template defines


def print_torch(
    expr: sympy.Basic,
    tensors: frozenset[str] | set[str],
    *,
    where: str,
    bools: frozenset[str] | set[str] = frozenset(),
    anchor: str = "grad_output",
    anchor_text: str | None = None,
    finite: frozenset[str] | set[str] = frozenset(),
) -> Printed:
    """Print ``expr`` as torch code, with the module aliases (keys of IMPORTS) and helpers it uses.
    ``bools``: those of ``tensors`` that are bool masks; ``anchor``: a float tensor a case distinction
    between numbers takes its dtype from where its condition has none (backward's upstream gradient), used
    where it is one of ``tensors``, as ``anchor_text`` if given (the first of several that is not None);
    ``finite``: those of ``tensors`` known to be finite, which a step may multiply as a mask."""
    check_printable(expr, where=where)
    printer = TorchPrinter(tensors, bools, anchor, anchor_text, finite)
    # The printer's own errors name the sub-expression; the caller knows which formula it is.
    with error_context(where):
        text = printer.doprint(expr)
    return Printed(text, frozenset(printer.imports), frozenset(printer.helpers))
