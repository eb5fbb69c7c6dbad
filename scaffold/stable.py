"""Stage 4a: rewrite textbook formulas into the numerically stable primitives PyTorch ships.

A literal translation of ``log(1 + exp(x))`` is ``inf`` at x = 100 in float32 and its derivative
``exp(x) / (1 + exp(x))`` is ``nan`` there, while ``F.softplus`` is finite with a finite gradient. So the
forward is rewritten before it is differentiated, into functions that know their own stable derivative
(``softplus' = sigmoid``, not ``exp(x) / (1 + exp(x))``), and the derivatives are rewritten again.

The rewrites, each applied only to sub-expressions that involve a tensor (numbers and scalar arguments
stay plain Python):

* ``log(1 + exp(u))``, ``log1p(exp(u))`` -> ``softplus(u)`` (and ``log(c + k*exp(u))``)
* ``log(exp(a) + exp(b) + ...)`` -> ``logaddexp(a, logaddexp(b, ...))``
* ``1 / (1 + exp(-u))`` -> ``sigmoid(u)``; ``exp(u) / (1 + exp(u))`` too
* ``log(sigmoid(u))``, ``log(1 - sigmoid(u))`` -> ``logsigmoid(u)``, ``logsigmoid(-u)``
* ``1 - sigmoid(u)`` -> ``sigmoid(-u)``; ``1 - tanh(u)``, ``1 + tanh(u)`` -> ``2*sigmoid(-2*u)``, ``2*sigmoid(2*u)``
* ``log(1 + u)`` -> ``log1p(u)``
* ``exp(u) - 1`` -> ``expm1(u)``; ``expm1(u) * sigmoid(-u)`` -> ``tanh(u/2)`` (the bipolar sigmoid)
* ``exp(u) / (exp(u) + exp(v))`` -> ``sigmoid(u - v)``; with more terms ``exp(u - logaddexp(...))``
* ``x * log(y)`` -> ``xlogy(x, y)`` (0 where x = 0, as torch.xlogy); ``x * log1p(y)`` -> ``xlog1py(x, y)``
* ``x * exp(v)`` -> ``xexpy(x, v)`` (0 where x = 0), for x that can be 0 while v is large
* ``sqrt(x**2 + y**2)`` -> ``hypot(x, y)``; also ``sqrt(x**2 + eps**2)``, ``sqrt(x**2 + 1)``
* ``log(1 + s*w**2)`` for ``w`` that can pass 1e19 (a cube, an exp) -> ``log1p(s*w**2)`` for ``|w| <= 1/sqrt(s)``,
  ``log(s) + 2*log|w| + log1p(1/(s*w**2))`` beyond; ``(1 + s*w**2)**-k`` keeps such a ``w`` whole
  (:class:`kept`), so that sympy does not merge it with its derivative into one overflowing power
* ``exp(u**2) * erfc(u)`` -> ``erfcx(u)``
* ``(1 + erf(u / sqrt(2))) / 2`` -> ``ndtr(u)``; its log is ``log_ndtr(u)``
* ``log(erfc(u))`` -> ``log(2) + log_ndtr(-sqrt(2) * u)``
* ``log(u / (1 - u))`` -> ``logit(u)``
* ``log(cosh(u))`` -> ``u + softplus(-2*u) - log(2)``
* ``exp(a) * sigmoid(b)**k``, ``exp(a) * ndtr(b)**k`` -> ``exp(a + k*logsigmoid(b))``, ``exp(a + k*log_ndtr(b))``
* ``exp(a + log_ndtr(b)) * log_ndtr'(b)`` -> ``exp(a - b**2/2) / sqrt(2*pi)`` (0 * inf where ndtr(b) is 0)
* ``1 / (c + k*cosh(u)**e)`` -> a sigmoid of ``e*log(cosh(u))`` (sympy folds exp(-log(cosh(u))) into 1/cosh(u))
* ``log(softplus(u))`` -> ``log_softplus(u)`` (``u - exp(u)/2`` below -20); ``softplus(u)**-k`` ->
  ``exp(-k*log_softplus(u))``, merged with the exponentials beside it (sigmoid(u)/sqrt(softplus(u)) is 0/0
  where both underflow)

Derivatives are written in forms that keep their relative accuracy in float32 tails (``sigmoid'(u)`` as
``sigmoid(u)*sigmoid(-u)``, ``tanh'(u)`` as ``4*sigmoid(2*u)*sigmoid(-2*u)``) wherever they multiply another
tensor (:func:`accurate_kernels`); alone, they stay PyTorch's fused backward kernels.

Each primitive is a sympy ``Function`` with its derivative (``fdiff``) written in stable primitives and
its literal formula (:func:`to_literal`), which the test reference and the domain checks evaluate.
"""

from __future__ import annotations

import builtins
import dataclasses
import fractions
import functools
import math
from collections.abc import Callable, Sequence

import mpmath
import sympy
from sympy.codegen.cfunctions import expm1, hypot, log1p
from sympy.core.logic import fuzzy_and

# -- the primitives -------------------------------------------------------------------------------


class StableFunction(sympy.Function):
    """A function with a stable torch implementation, its literal formula and a stable derivative."""

    @classmethod
    def literal(cls, *args: sympy.Expr) -> sympy.Expr:
        raise NotImplementedError

    def _eval_is_extended_real(self) -> bool | None:
        return fuzzy_and(a.is_extended_real for a in self.args)


class softplus(StableFunction):  # noqa: N801 - sympy's convention: functions print by class name
    nargs = 1

    @classmethod
    def literal(cls, x):
        return sympy.log(1 + sympy.exp(x))

    def fdiff(self, argindex=1):
        return sigmoid(self.args[0])

    def _eval_is_positive(self):
        return self.args[0].is_extended_real


class sigmoid(StableFunction):  # noqa: N801
    nargs = 1

    @classmethod
    def literal(cls, x):
        return 1 / (1 + sympy.exp(-x))

    def fdiff(self, argindex=1):
        return sigmoid_grad(self)

    def _eval_is_positive(self):
        return self.args[0].is_extended_real


class logsigmoid(StableFunction):  # noqa: N801
    nargs = 1

    @classmethod
    def literal(cls, x):
        return -sympy.log(1 + sympy.exp(-x))

    def fdiff(self, argindex=1):
        return sigmoid(-self.args[0])

    def _eval_is_negative(self):
        return self.args[0].is_extended_real


class logaddexp(StableFunction):  # noqa: N801
    nargs = 2

    @classmethod
    def literal(cls, a, b):
        return sympy.log(sympy.exp(a) + sympy.exp(b))

    def fdiff(self, argindex=1):
        a, b = self.args
        return sigmoid(a - b) if argindex == 1 else sigmoid(b - a)


def positive_where_defined(expr: sympy.Expr) -> bool:
    """Whether ``expr`` is positive wherever it is defined: its symbols real, those it divides by nonzero
    (``1 + (u/c)**2``, where c = 0 leaves it undefined)."""
    divisors = {p.base for p in expr.atoms(sympy.Pow) if p.exp.is_negative and p.base.is_Symbol}
    return bool(expr.xreplace({s: sympy.Dummy(s.name, real=True, nonzero=True) for s in divisors}).is_positive)


class xlogy(StableFunction):  # noqa: N801
    nargs = 2

    @classmethod
    def literal(cls, x, y):
        return x * sympy.log(y)

    def fdiff(self, argindex=1):
        # torch.xlogy's own x-derivative: 0, not -inf, where x = y = 0. Its y-derivative is 0 where x = 0, as
        # its value is (x * log(y) = 0 there whatever y): not 0/0 = nan at y = 0, where PyTorch's is (bce's
        # gradient at a prediction of 0 for a target of 0 is 1, not nan). Both read y with its pole guarded
        # (log_argument), so that they share one guard; where y cannot be 0 they are log(y) and x / y.
        x, y = self.args
        if positive_where_defined(y):
            return x / y if argindex == 2 else sympy.Piecewise((0, _weightless_pole(x, y, 0)), (sympy.log(y), True))
        arg = log_argument(0, 1, y, x)
        return x / arg if argindex == 2 else sympy.log(arg)


class xlog1py(StableFunction):  # noqa: N801
    nargs = 2

    @classmethod
    def literal(cls, x, y):
        return x * log1p(y)

    def fdiff(self, argindex=1):
        # torch.special.xlog1py's own x-derivative: 0, not -inf, where x = 0 and y = -1; its y-derivative 0
        # where x = 0 (see xlogy).
        x, y = self.args
        if positive_where_defined(1 + y):
            return x / (1 + y) if argindex == 2 else sympy.Piecewise((0, _weightless_pole(x, y, -1)), (log1p(y), True))
        arg = log_argument(-1, 0, y, x)
        return x / (1 + arg) if argindex == 2 else log1p(arg)


def _weightless_pole(x: sympy.Expr, y: sympy.Expr, pole: int) -> sympy.Basic:
    """Where x*log(y) (pole 0) or x*log1p(y) (pole -1) is 0 by convention, its log infinite."""
    return sympy.And(sympy.Eq(x, 0), sympy.Eq(y, pole))


class log_argument(sympy.Function):  # noqa: N801
    """``log_argument(pole, safe, y, x)``: ``y``, but ``safe`` where the weight ``x`` is 0 and ``y`` is at the
    log's ``pole``; the argument the derivatives of xlogy(x, y) (pole 0, safe 1) and xlog1py(x, y) (pole -1,
    safe 0) read. Its log is the x-derivative, 0 at that point by the convention of x*log(y) = 0 where x = 0,
    and x over it (over 1 plus it) the y-derivative, 0 wherever x is: both exact, and one guard, a
    ``torch.where`` of two comparisons, where each derivative carried its own (binary cross-entropy's
    backward: 1.76x plain autograd's time, 1.59x with one guarded argument per logarithm; 4M float32
    elements, one CPU thread)."""

    nargs = 4

    def fdiff(self, argindex=1):
        pole, _, y, x = self.args
        return sympy.Piecewise((0, _weightless_pole(x, y, pole)), (1, True)) if argindex == 3 else sympy.S.Zero

    def _eval_rewrite_as_Piecewise(self, pole, safe, y, x, **kwargs):  # noqa: N802 - sympy's name
        return sympy.Piecewise((safe, _weightless_pole(x, y, pole)), (y, True))

    def _eval_is_extended_real(self) -> bool | None:
        return self.args[2].is_extended_real


class xexpy(StableFunction):  # noqa: N801
    """``x * exp(y)``, 0 where x = 0 even where exp(y) overflows: (y - mu)**2 * exp(-log_var) at
    y = mu, log_var = -100 is 0, not 0 * inf (float32). The printer keeps d/dx = exp(y) there."""

    nargs = 2

    @classmethod
    def literal(cls, x, y):
        return x * sympy.exp(y)

    def fdiff(self, argindex=1):
        x, y = self.args
        return sympy.exp(y) if argindex == 1 else self


class finite_at_zero(sympy.Function):  # noqa: N801
    """``value`` (a tensor), except where ``x`` is 0, where an overflow to inf is brought back to the
    largest float: how the plan writes ``xexpy(x, y)``, as ``x * finite_at_zero(exp(y), x)``. The product
    is 0 there, and its derivative in x (for double backward) as close to exp(y) as the dtype allows."""

    nargs = 2


class neg_abs(sympy.Function):  # noqa: N801
    """``-|t|`` in fused code, printed as a call of the generated module's ``_neg_abs``: ``-abs(t)`` in the
    compiled kernels, which run with autograd off, and ``-t - 2*relu(-t)`` in code that autograd or
    torch.func may differentiate, whose derivative at 0 is -1, the one of the case ``t >= 0`` it goes with
    (abs' is 0 there). The relu form costs inductor three operations more, a tenth of a swish backward."""

    nargs = 1


class kept(StableFunction):  # noqa: N801
    """``w`` itself, kept as one value: sympy distributes powers over a product as it builds them
    ((x**3)**-2 is x**-6), so without it a branch guard (lowering.within) could not find ``w`` again."""

    nargs = 1

    @classmethod
    def eval(cls, w):
        # Kept once is kept: the rewrites run again on derivatives (a second derivative's kept(kept(w)) and
        # kept(w) would be two values, and their product no power of one).
        return w if isinstance(w, kept) else None

    @classmethod
    def literal(cls, w):
        return w

    def fdiff(self, argindex=1):
        return sympy.S.One


class erfcx(StableFunction):  # noqa: N801
    nargs = 1

    @classmethod
    def literal(cls, x):
        return sympy.exp(x**2) * sympy.erfc(x)

    def fdiff(self, argindex=1):
        x = self.args[0]
        return 2 * x * self - 2 / sympy.sqrt(sympy.pi)

    def _eval_is_positive(self):
        return self.args[0].is_extended_real


class ndtr(StableFunction):  # noqa: N801
    nargs = 1

    @classmethod
    def literal(cls, x):
        return sympy.erfc(-x / sympy.sqrt(2)) / 2

    def fdiff(self, argindex=1):
        x = self.args[0]
        return sympy.exp(-(x**2) / 2) / sympy.sqrt(2 * sympy.pi)

    def _eval_is_positive(self):
        return self.args[0].is_extended_real


class log_ndtr(StableFunction):  # noqa: N801
    nargs = 1

    @classmethod
    def literal(cls, x):
        return sympy.log(sympy.erfc(-x / sympy.sqrt(2)) / 2)

    def fdiff(self, argindex=1):
        return log_ndtr_grad(self.args[0])

    def _eval_is_negative(self):
        return self.args[0].is_extended_real


class log_ndtr_grad(StableFunction):  # noqa: N801
    """d log_ndtr(x) / dx, the normal density over its distribution function, pdf(x) / ndtr(x): a
    function of its own so that ``exp(a + log_ndtr(b)) * log_ndtr_grad(b)`` can become
    ``exp(a - b**2 / 2) / sqrt(2*pi)`` (0 * inf at b = -inf otherwise: Black-Scholes at S = 0)."""

    nargs = 1

    @classmethod
    def literal(cls, x):
        return sympy.exp(-(x**2) / 2) / (sympy.sqrt(2 * sympy.pi) * ndtr.literal(x))

    @classmethod
    def expanded(cls, x):
        # Below 0 with the exp(-x**2 / 2) both share cancelled (exact where they underflow, x = -40);
        # above 0 as written, where ndtr(x) >= 1/2 and erfcx(-x / sqrt(2)) would overflow (inf, and nan
        # at second order).
        return sympy.Piecewise(
            (sympy.sqrt(2 / sympy.pi) / erfcx(-x / sympy.sqrt(2)), x < 0),
            (sympy.exp(-(x**2) / 2) / (sympy.sqrt(2 * sympy.pi) * ndtr(x)), True),
        )

    def fdiff(self, argindex=1):
        x = self.args[0]
        return -self * (x + self)

    def _eval_is_positive(self):
        return self.args[0].is_extended_real


class log_softplus(StableFunction):  # noqa: N801
    """log(softplus(x)), which is about x below 0: softplus(x) underflows to 0 at x = -104 in float32 (-745
    in float64), where log(softplus(x)) is -inf and sigmoid(x) / softplus(x), its derivative, 0/0. Below
    -20 it is x - exp(x)/2 (the next term, 5*exp(2x)/24, is below 1e-18 of it)."""

    nargs = 1
    LOW = -20

    @classmethod
    def literal(cls, x):
        return sympy.log(softplus.literal(x))

    @classmethod
    def expanded(cls, x):
        # The printer keeps each branch's input inside its region (the branch not taken stays finite).
        return sympy.Piecewise((sympy.log(softplus(x)), x > cls.LOW), (x - sympy.exp(x) / 2, True))

    def fdiff(self, argindex=1):
        # sigmoid(x) / softplus(x) as one exponential: 1, not 0/0, where both underflow
        x = self.args[0]
        return sympy.exp(logsigmoid(x) - self)


class logit(StableFunction):  # noqa: N801
    nargs = 1

    @classmethod
    def literal(cls, x):
        return sympy.log(x / (1 - x))

    def fdiff(self, argindex=1):
        x = self.args[0]
        return 1 / (x * (1 - x))


class silu(StableFunction):  # noqa: N801
    nargs = 1

    @classmethod
    def literal(cls, x):
        return x / (1 + sympy.exp(-x))

    def fdiff(self, argindex=1):
        x = self.args[0]
        s = sigmoid(x)
        return s * (1 + x * (1 - s))


class mish(StableFunction):  # noqa: N801
    """Mish, x * tanh(softplus(x)) (torch.nn.functional.mish)."""

    nargs = 1

    @classmethod
    def literal(cls, x):
        return x * sympy.tanh(sympy.log(1 + sympy.exp(x)))

    def fdiff(self, argindex=1):
        # PyTorch's mish_backward has no forward-mode rule (torch.func.hessian needs one) nor a batching
        # rule (vmap): the formula, in stable primitives.
        x = self.args[0]
        t = tanh_softplus(x)
        return t + x * sigmoid(x) * tanh_grad_beside_tanh(t)


class tanh_softplus(StableFunction):  # noqa: N801
    """tanh(softplus(x)), mish's factor, computed (:func:`.lowering.tanh_softplus_in_sigmoids`, or the
    printer) as ``n / (2 - n)``, ``n = s * (2 - s)``, ``s = sigmoid(x)``: tanh(softplus(x)) is
    ``((1 + e**x)**2 - 1) / ((1 + e**x)**2 + 1)``. One sigmoid and four cheap passes where softplus and tanh
    cost six multiplies' worth on a CPU, and accurate at both ends (n -> 2s as x -> -inf, n -> 1 as x -> inf;
    2 - n stays between 1 and 2)."""

    nargs = 1

    @classmethod
    def literal(cls, x):
        return sympy.tanh(softplus.literal(x))

    @classmethod
    def expanded(cls, x):
        s = sigmoid(x)
        n = kept(s * (2 - s))
        return n / (2 - n)

    def fdiff(self, argindex=1):
        # sech(softplus(x))**2 * sigmoid(x) = 4 * b**2 / (1 + b**2)**2 * s with b = sigmoid(-x) = 1 - s, and
        # 1 + b**2 = 2 - n: no cancellation where b is tiny (x -> inf), unlike 1 - tanh(softplus(x))**2
        x = self.args[0]
        s = sigmoid(x)
        return 4 * s * sigmoid(-x) ** 2 / (2 - kept(s * (2 - s))) ** 2


class gelu(StableFunction):  # noqa: N801
    """The exact GELU, x * ndtr(x) (torch.nn.functional.gelu's default)."""

    nargs = 1

    @classmethod
    def literal(cls, x):
        return x * sympy.erfc(-x / sympy.sqrt(2)) / 2

    def fdiff(self, argindex=1):
        return gelu_grad(self.args[0])


# -- derivative kernels ---------------------------------------------------------------------------
# A derivative that PyTorch computes, multiplied by grad_output, in one fused kernel: the printer turns
# ``grad * tanh_grad(t)`` into ``torch.ops.aten.tanh_backward(grad, t)`` (one pass instead of three; the
# kernels' names are in the registry, :mod:`.functions`). Each is differentiable again in PyTorch (double
# backward) and has a vmap rule. The argument is what the kernel takes: the function's output for sigmoid
# and tanh, its input for gelu.


class DerivativeKernel(StableFunction):
    """A derivative with a fused ``grad * derivative`` kernel in ``torch.ops.aten``, called as
    ``kernel(grad, arg)``."""

    @classmethod
    def expanded(cls, x: sympy.Expr) -> sympy.Expr:
        """The derivative in stable primitives: printed where there is no gradient to fuse it with."""
        raise NotImplementedError

    @classmethod
    def accurate(cls, x: sympy.Expr) -> sympy.Expr:
        """The derivative in a form that keeps its relative accuracy in float32 tails (default: expanded)."""
        return cls.expanded(x)

    @classmethod
    def literal(cls, x):
        return to_literal(cls.expanded(x))

    def fdiff(self, argindex=1):
        x = sympy.Dummy("x", real=True)
        return sympy.diff(self.expanded(x), x).xreplace({x: self.args[0]})


class sigmoid_grad(DerivativeKernel):  # noqa: N801
    """d sigmoid(u) / du in terms of s = sigmoid(u): s * (1 - s)."""

    nargs = 1

    @classmethod
    def expanded(cls, s):
        return s * (1 - s)

    @classmethod
    def accurate(cls, s):
        # 1 - s is 0 in float32 once s rounds to 1 (u > 17), where the derivative is still e**-u.
        return s * sigmoid(-s.args[0]) if isinstance(s, sigmoid) else cls.expanded(s)


class tanh_grad(DerivativeKernel):  # noqa: N801
    """d tanh(u) / du in terms of t = tanh(u): 1 - t**2."""

    nargs = 1

    @classmethod
    def expanded(cls, t):
        return 1 - t**2

    @classmethod
    def accurate(cls, t):
        # 1 - tanh(u)**2 cancels to 0 in float32 once |tanh(u)| rounds to 1 (|u| > 9); 1 / cosh(u)**2 does
        # not, but its own derivative is inf / inf at |u| > 44. 4 * sigmoid(2u) * sigmoid(-2u) is accurate,
        # and so is everything autograd derives from it.
        if not isinstance(t, sympy.tanh):
            return cls.expanded(t)
        u = t.args[0]
        return 4 * sigmoid(2 * u) * sigmoid(-2 * u)


class tanh_grad_beside_tanh(tanh_grad):  # noqa: N801
    """tanh_grad(t) in a sum with t itself and a cofactor that grows no faster than tanh's input, as in
    mish' = t + x * sigmoid(x) * (1 - t**2), t = tanh(softplus(x)): 1 - t**2 loses its relative accuracy
    only where t rounds to +-1 (|u| > 9 in float32), and there its term is below t's rounding (x * 1e-7 next
    to 1). Beside t (:func:`accurate_kernels` checks) it stays as it is, one fused tanh_backward, where the
    accurate form would be 4*sigmoid(2u)*sigmoid(-2u) and recompute u; elsewhere (in a second derivative)
    it takes its accurate form."""

    @classmethod
    def accurate(cls, t):
        # where it is not beside t (accurate_kernels keeps it there): the accurate form, as tanh_grad's
        if isinstance(t, tanh_softplus):
            x = t.args[0]
            return 4 * sigmoid(-x) ** 2 / (2 - kept(sigmoid(x) * (2 - sigmoid(x)))) ** 2
        return tanh_grad.accurate(t)


class gelu_grad(DerivativeKernel):  # noqa: N801
    """d gelu(x) / dx = ndtr(x) + x * exp(-x**2 / 2) / sqrt(2 * pi)."""

    nargs = 1

    @classmethod
    def expanded(cls, x):
        return ndtr(x) + x * sympy.exp(-(x**2) / 2) / sympy.sqrt(2 * sympy.pi)


def accurate_kernels(expr: sympy.Expr, tensors: frozenset[sympy.Symbol] | set[sympy.Symbol]) -> sympy.Expr:
    """``expr`` with its derivative kernels in their accurate forms, unless ``expr`` is one kernel times
    numbers or scalars.

    A fused kernel such as ``sigmoid_backward(grad, s)`` computes ``s * (1 - s)``, which in float32 is 0
    for u > 17 where the true value is e**-u: harmless on its own (PyTorch's sigmoid has the same tail),
    but not once it multiplies another tensor (``x**2 * sigmoid'(beta*x)``, the gradient of a learnable
    slope) or is added to other terms: there the lost relative accuracy becomes an absolute error.
    """
    kernels = [e for e in sympy.preorder_traversal(expr) if isinstance(e, DerivativeKernel)]
    factors = expr.args if expr.is_Mul else (expr,)
    others = [f for f in factors if not isinstance(f, DerivativeKernel)]
    if (
        len(kernels) <= 1
        and len(others) == len(factors) - len(kernels)
        and not any(f.free_symbols & set(tensors) for f in others)
    ):
        return expr  # no kernel, or one kernel times numbers and scalars
    return _accurate(expr)


def _accurate(node: sympy.Basic) -> sympy.Basic:
    """``node`` with its kernels accurate, except a tanh_grad_beside_tanh in a sum that has its t as a term
    (rebuilt only where something changed: sympy would distribute 2*(a - b) as it rebuilds)."""
    if node.is_Atom or not node.args or not node.has(DerivativeKernel):
        return node
    if isinstance(node, DerivativeKernel):
        return type(node).accurate(*node.args)
    if node.is_Add:
        terms = []
        for term in node.args:
            factors = sympy.Mul.make_args(term)
            accurate = [
                f if isinstance(f, tanh_grad_beside_tanh) and f.args[0] in node.args else _accurate(f) for f in factors
            ]
            terms.append(term if accurate == list(factors) else sympy.Mul(*accurate))
        return node if terms == list(node.args) else sympy.Add(*terms)
    args = [_accurate(a) for a in node.args]
    return node if args == list(node.args) else node.func(*args)


def to_literal(expr: sympy.Basic) -> sympy.Basic:
    """``expr`` with every stable primitive replaced by its textbook formula."""
    return expr.replace(lambda e: isinstance(e, StableFunction), lambda e: type(e).literal(*e.args))


def expand_kernels(expr: sympy.Basic) -> sympy.Basic:
    """``expr`` with its derivative kernels (tanh_grad, ...) written in the other stable primitives."""
    return expr.replace(lambda e: isinstance(e, DerivativeKernel), lambda e: type(e).expanded(*e.args))


# -- the rewrites ---------------------------------------------------------------------------------


class _Matching:
    """What the rules share: which symbols are tensors, and the shapes several rules look for (the
    exponentials of a tensor, a term that is a square, one plus a square that can overflow float32). Each
    class below holds the rules for one kind of node; :class:`_Rewriter` holds their table and applies them."""

    tensors: frozenset[sympy.Symbol]

    def is_tensor(self, expr: sympy.Basic) -> bool:
        return bool(expr.free_symbols & self.tensors)

    def _tensor_exps(self, factors: list[sympy.Expr]) -> list[sympy.Expr]:
        """The exponentials of a tensor among ``factors``."""
        return [f for f in factors if isinstance(f, sympy.exp) and self.is_tensor(f)]

    def _square_root(self, term: sympy.Expr) -> sympy.Expr | None:
        """``sqrt(k) * t`` for a term ``k * t**2`` with k > 0, else None."""
        coefficient, factors = term.as_coeff_mul()
        if len(factors) == 1 and factors[0].is_Pow and factors[0].exp == 2 and coefficient.is_positive:
            return sympy.sqrt(coefficient) * factors[0].base
        return None

    def _one_plus_square(self, arg: sympy.Add) -> tuple[sympy.Expr, kept] | None:
        """``(s, kept(w))`` for ``arg`` = ``1 + s*w**2`` with s > 0 free of tensors and ``w`` a value that can
        pass 1e19 at inputs of 1e4 (its square overflows float32), else None. ``w`` is kept as one value:
        sympy would merge w = a**3 with the a**2 of its derivative into a**5, which overflows where
        w * (1 + w**2)**-4 does not (a soft Lennard-Jones of a cube)."""
        constant, terms = arg.as_coeff_add()
        if constant != 1 or len(terms) != 1:
            return None
        coefficient, factors = terms[0].as_coeff_mul()
        tensor_factors = [f for f in factors if self.is_tensor(f)]
        # sympy writes (x**3/c)**2 as x**6/c**2: w is the product of the tensor factors' square roots
        if not tensor_factors or not coefficient.is_positive:
            return None
        if not all(f.is_Pow and (f.exp / 2).as_coeff_Mul()[0].is_Integer for f in tensor_factors):
            return None
        w = sympy.Mul(*[f.base ** (f.exp / 2) for f in tensor_factors])
        scale = terms[0] / sympy.Mul(*tensor_factors)
        positive = all(
            f.is_positive or (f.is_Pow and f.exp.is_Integer and f.exp.is_even and f.base.is_extended_real)
            for f in sympy.Mul.make_args(scale)
        )
        if not positive or self.is_tensor(scale) or not _can_overflow(w, self.tensors):
            return None
        return scale, kept(w)


class _LogRules(_Matching):
    """``log(...)`` and ``log1p(...)``: of a sigmoid, ndtr, erfc, softplus or cosh, of a product (a sum of
    logs), of a sum of exponentials (softplus, logaddexp), of one plus a square that can overflow."""

    def _log(self, node: sympy.log) -> sympy.Expr | None:
        (arg,) = node.args
        if isinstance(arg, sigmoid):
            return logsigmoid(arg.args[0])
        if isinstance(arg, ndtr):
            return log_ndtr(arg.args[0])
        if isinstance(arg, sympy.erfc):
            return sympy.log(2) + log_ndtr(-sympy.sqrt(2) * arg.args[0])
        if isinstance(arg, sympy.exp):
            return arg.args[0]
        if isinstance(arg, softplus):
            return log_softplus(arg.args[0])
        if isinstance(arg, expm1):
            # log(expm1(u)) = u + log(-expm1(-u)) (real where u > 0): the inverse softplus, inf at u = 100 in
            # float32 otherwise
            u = arg.args[0]
            return u + sympy.log(-expm1(-u))
        if isinstance(arg, sympy.cosh):
            u = arg.args[0]
            return u + softplus(-2 * u) - sympy.log(2)
        if arg.is_Pow and arg.exp == -1:
            # log(1/v) = -log(v): the logarithm is real only where v > 0.
            return -self(sympy.log(arg.base))
        if arg.is_Mul:
            return self._log_of_product(arg)
        if arg.is_Add:
            square = self._log_of_one_plus_square(arg)
            return square if square is not None else self._log_of_sum(arg)
        return None

    def _log1p(self, node: log1p) -> sympy.Expr | None:
        # log1p(v) is log(1 + v): the same rewrites apply (log1p(exp(u)) = softplus(u)).
        rewritten = self._log_of_sum(1 + node.args[0]) if (1 + node.args[0]).is_Add else None
        return None if isinstance(rewritten, log1p) else rewritten

    def _log_of_product(self, arg: sympy.Mul) -> sympy.Expr | None:
        # log(k * exp(u) * rest) = log(k) + u + log(rest); the log is real only where rest > 0.
        # Likewise each factor (1 + exp(u))**k whose log has a stable form: log((1 + exp(a*x)) / (1 + exp(b*x)))
        # = softplus(a*x) - softplus(b*x), not inf/inf at x = 30 in float32.
        coefficient, factors = arg.as_coeff_mul()
        logs, others = [], []
        for f in factors:
            log_f = self._stable_log_of_factor(f)
            (others if log_f is None else logs).append(log_f if log_f is not None else f)
        rest = sympy.Mul(*others)
        if coefficient.is_positive and (coefficient != 1 or logs) and rest != 1:
            inner = self._log(sympy.log(rest)) if self.is_tensor(rest) else None
            if inner is not None or logs:
                return sympy.log(coefficient) + sum(logs) + (sympy.log(rest) if inner is None else inner)
        if coefficient.is_positive and logs and rest == 1:
            return sympy.log(coefficient) + sum(logs)
        # log(u / (1 - u)) = logit(u)
        if len(factors) == 2 and coefficient == 1:
            for u, other in (factors, factors[::-1]):
                if other.is_Pow and other.exp == -1 and sympy.expand(other.base - (1 - u)) == 0:
                    return logit(u)
        return None

    def _stable_log_of_factor(self, f: sympy.Expr) -> sympy.Expr | None:
        """``log(f)`` for a factor that is positive by its form: ``exp(u)``, or ``v**k`` (k a number) whose
        ``log(v)`` rewrites to stable primitives without a log left (softplus, logaddexp, logsigmoid)."""
        if isinstance(f, sympy.exp):
            return f.args[0]
        base, exponent = f.as_base_exp()
        if not (exponent.is_Number and base.is_Add and self.is_tensor(base)):
            return None
        log_base = self._log_of_sum(base)
        if log_base is None or log_base.has(sympy.log, log1p, sympy.Piecewise):
            return None
        return exponent * log_base

    def _log_of_one_plus_square(self, arg: sympy.Add) -> sympy.Expr | None:
        """``log(1 + s*w**2)`` (s > 0) where ``w`` can outgrow float32's square root (a cube, an exp):
        ``log1p(s*w**2)`` for ``|w| <= 1/sqrt(s)``, ``log(s) + 2*log|w| + log1p(1/(s*w**2))`` beyond, so that
        the Cauchy loss of ((w*x + b)**3 - t)/c is 112 at 1e4, not log(inf). Written log1p(...), it is
        left alone (the first branch is one)."""
        square = self._one_plus_square(arg)
        if square is None:
            return None
        scale, w = square
        return sympy.Piecewise(
            (log1p(scale * w**2), sympy.Abs(w) <= 1 / sympy.sqrt(scale)),
            (sympy.log(scale) + 2 * sympy.log(sympy.Abs(w)) + log1p(w**-2 / scale), True),
        )

    def _log_of_sum(self, arg: sympy.Add) -> sympy.Expr | None:
        constant, terms = arg.as_coeff_add()
        # log(1 - sigmoid(u)) = logsigmoid(-u)
        if constant == 1 and len(terms) == 1 and isinstance(-terms[0], sigmoid):
            return logsigmoid(-(-terms[0]).args[0])
        exponents = [self._exp_term(t) for t in terms]
        if terms and all(e is not None for e in exponents) and constant >= 0:
            # log(c + sum k_i exp(u_i)): softplus for one exponential, logaddexp for several
            total = exponents[0]
            for u in exponents[1:]:
                total = logaddexp(total, u)
            if constant == 0:
                return total if len(exponents) > 1 else None
            shift = sympy.log(constant)
            return shift + softplus(total - shift)
        if constant == 1:
            return log1p(sympy.Add(*terms))
        return None

    def _exp_term(self, term: sympy.Expr) -> sympy.Expr | None:
        """``u + log(k)`` for a term ``k * exp(u)`` with k > 0 and u involving a tensor, else None.

        ``k * v**e`` counts as ``exp(e * log(v) + log(k))`` where log(v) has a stable form (cosh(u),
        1 + exp(u)): sympy folds exp(-log(cosh(u))) into 1/cosh(u) as the forward is parsed, and
        1/(1 + 1/cosh(u)) is sigmoid(log(cosh(u)))."""
        coefficient, factors = term.as_coeff_mul()
        if len(factors) != 1 or not coefficient.is_positive:
            return None
        (f,) = factors
        if isinstance(f, sympy.exp) and self.is_tensor(f.args[0]):
            return f.args[0] + sympy.log(coefficient)
        base, exponent = f.as_base_exp()
        if exponent.is_Number and self.is_tensor(base):
            log_base = self._log(sympy.log(base))
            if log_base is not None and not log_base.has(sympy.log, log1p):  # a stable form: softplus, ...
                return exponent * log_base + sympy.log(coefficient)
        return None


class _PowerRules(_Matching):
    """Powers: ``1 / (c + k*exp(u))`` as a sigmoid, a root of a sum of squares as ``hypot``, negative
    powers of cosh and softplus through their logs."""

    def _pow(self, node: sympy.Pow) -> sympy.Expr | None:
        base, exponent = node.args
        # (1 + s*w**2)**-k with w kept as one value, w a cube or an exp (see _one_plus_square)
        if base.is_Add and (exponent.is_negative or exponent.could_extract_minus_sign()):
            square = self._one_plus_square(base)
            if square is not None:
                scale, w = square
                return (1 + scale * w**2) ** exponent
        # cosh(u)**-k = exp(-k*log(cosh(u))): 1/cosh(u) is 0 at u = 100 in float32, but its derivative
        # -sinh(u)/cosh(u)**2 is inf/inf (sympy folds exp(-log(cosh(u))) into 1/cosh(u) as it parses)
        if isinstance(base, sympy.cosh) and exponent.is_Number and exponent.is_negative:
            return sympy.exp(exponent * self._log(sympy.log(base)))
        # softplus(u)**-k = exp(-k*log_softplus(u)) (k > 0 or symbolic): inf at u = -1e4 where softplus(u)
        # underflows, times the sigmoid(u) = 0 beside it in the derivative of softplus(u)**p (p < 1)
        if isinstance(base, softplus) and not exponent.is_nonnegative:
            return sympy.exp(exponent * log_softplus(base.args[0]))
        if not base.is_Add:
            return None
        constant, terms = base.as_coeff_add()
        # 1 / (c + k exp(u)) = sigmoid(-(u + log(k/c))) / c, also to a symbolic power: (1 + exp(-x))**-gamma
        negative = exponent.is_negative or (not exponent.is_Number and exponent.could_extract_minus_sign())
        if negative and constant.is_positive and len(terms) == 1:
            u = self._exp_term(terms[0])
            if u is not None:
                shift = sympy.log(constant)
                return (sigmoid(shift - u) / constant) ** (-exponent)
        # (x**2 + y**2) ** (k/2) = hypot(x, y) ** k; also (x**2 + eps**2) and (x**2 + 1): x**2 overflows in
        # float32 at |x| > 1.8e19 ((x*y)**3 at x = y = 1e4), the hypot not before the result does
        if exponent.is_Number and (2 * exponent).is_odd and constant.is_nonnegative:
            roots = [self._square_root(t) for t in terms]
            if constant.is_positive:
                roots.append(sympy.sqrt(constant))
            if len(roots) >= 2 and all(r is not None for r in roots) and any(self.is_tensor(r) for r in roots):
                roots.sort(key=lambda r: not self.is_tensor(r))  # a tensor first: hypot(x, eps)
                total = roots[0]
                for r in roots[1:]:
                    total = hypot(total, r)
                return total ** (2 * exponent)
        return None


class _SumRules(_Matching):
    """Sums: a constant beside an exponential, sigmoid, tanh or erf that together make ``expm1``, a
    sigmoid of the opposite argument, ``tanh_grad`` or ``ndtr``; a softplus written the stable way by hand."""

    def _add(self, node: sympy.Add) -> sympy.Expr | None:
        constant, terms = node.as_coeff_add()
        softplus_by_hand = _softplus_by_hand(terms)
        if softplus_by_hand is not None:
            return softplus_by_hand
        if constant == 0:
            return None
        rest = list(terms)
        for i, term in enumerate(terms):
            coefficient, factors = term.as_coeff_mul()
            if len(factors) != 1:
                continue
            (f,) = factors
            # c + k*exp(u) with k = -c: k * expm1(u)
            if isinstance(f, sympy.exp) and coefficient == -constant:
                rest[i] = coefficient * expm1(f.args[0])
                return sympy.Add(*rest)
            # 1 - tanh(u)**2, the derivative of tanh(u), in terms of tanh(u): one fused kernel
            if f.is_Pow and f.exp == 2 and isinstance(f.base, sympy.tanh) and coefficient == -constant:
                rest[i] = constant * tanh_grad(f.base)
                return sympy.Add(*rest)
            # c - c * sigmoid(u) = c * sigmoid(-u): 1 - sigmoid(u) is 0 in float32 for u > 17
            if isinstance(f, sigmoid) and coefficient == -constant:
                rest[i] = constant * sigmoid(-f.args[0])
                return sympy.Add(*rest)
            # c -+ c * tanh(u) = 2c * sigmoid(-+2u): 1 - tanh(u) is 0 in float32 for u > 9
            if isinstance(f, sympy.tanh) and abs(coefficient) == abs(constant):
                rest[i] = 2 * constant * sigmoid(2 * f.args[0] * sympy.sign(coefficient / constant))
                return sympy.Add(*rest)
            # c - 2c * sigmoid(w) = c * tanh(-w / 2), as in d/du log(cosh(u)) = 1 - 2 * sigmoid(-2u)
            if isinstance(f, sigmoid) and coefficient == -2 * constant:
                rest[i] = constant * sympy.tanh(-f.args[0] / 2)
                return sympy.Add(*rest)
            # a constant and an erf or erfc that together make the normal distribution function
            if isinstance(f, (sympy.erf, sympy.erfc)):
                for candidate in _as_ndtr(f):
                    total = sympy.expand(constant + coefficient * candidate)
                    if total.as_coeff_add()[0] == 0:
                        rest[i] = total
                        return sympy.Add(*rest)
        return None


class _ExponentialProductRules(_Matching):
    """Products with exponentials, merged into one exponential where a factor could overflow beside one
    that is 0 (``inf * 0`` is nan): ``xexpy``, sums multiplied out, sigmoid and ndtr factors taken into the
    exponent through their logs, softmax of exponentials."""

    def _xexpy(self, node: xexpy) -> sympy.Expr | None:
        # xexpy(xexpy(x, a), b) = xexpy(x, a + b): one exponential (a Gompertz curve's derivative)
        x, y = node.args
        return xexpy(x.args[0], x.args[1] + y) if isinstance(x, xexpy) else None

    def _merged_xexpy(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """x*exp(a) * exp(b) and x*exp(a) * y*exp(b): xexpy(x*y, a + b), one exponential, so that exp(v) *
        exp(-b*exp(v)) is exp(v - b*exp(v)), 0 and not inf * 0 where exp(v) overflows."""
        products = [f for f in factors if isinstance(f, xexpy)]
        exps = self._tensor_exps(factors)
        if not products or len(products) + len(exps) <= 1:
            return None
        merged = [f for f in factors if f in products or f in exps]
        rest = [f for f in factors if f not in merged]
        x = sympy.Mul(*[f.args[0] for f in products])
        y = sympy.Add(*[f.args[1] if isinstance(f, xexpy) else f.args[0] for f in merged])
        return self(coefficient * sympy.Mul(*rest) * xexpy(x, y))

    def _softplus_ratio(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """softplus(x) * exp(-log_softplus(y)) = exp(log_softplus(x) - log_softplus(y)): both underflow at
        x = y = -100 in float32, and the ratio is 1."""
        if not any(isinstance(f, sympy.exp) and f.has(log_softplus) for f in factors):
            return None
        powers = [f for f in factors if isinstance(f.as_base_exp()[0], softplus)]
        if not powers:
            return None
        rest = [f for f in factors if f not in powers]
        logs = [e * log_softplus(b.args[0]) for b, e in (f.as_base_exp() for f in powers)]
        return self(coefficient * sympy.Mul(*rest) * sympy.exp(sympy.Add(*logs)))

    def _merged_exps(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """exp(a) * exp(b) = exp(a + b): one exponential, which the rules after this one and expm1 can then
        see."""
        several = [f for f in factors if isinstance(f, sympy.exp)]
        if len(several) <= 1:
            return None
        rest = [f for f in factors if not isinstance(f, sympy.exp)]
        return self(coefficient * sympy.Mul(*rest) * sympy.exp(sympy.Add(*[f.args[0] for f in several])))

    def _exp_over_expm1(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """exp(m*u) / expm1(u)**k = 1 / ((-expm1(-u))**m * expm1(u)**(k - m)) for integers 0 < m <= k:
        exp(x) / expm1(x)**2, the derivative of 1/expm1(x) (Planck's law), is inf/inf at x = 100 in float32."""
        for f in [f for f in factors if isinstance(f, sympy.exp)]:  # one at most, after _merged_exps
            for g in factors:
                base, k = g.as_base_exp()
                if isinstance(base, expm1) and k.is_Integer and k < 0:
                    m = sympy.simplify(f.args[0] / base.args[0])
                    if m.is_Integer and 0 < m <= -k:
                        rest = [h for h in factors if h is not f and h is not g]
                        return self(coefficient * sympy.Mul(*rest) * (-expm1(-base.args[0])) ** -m * base ** (k + m))
        return None

    def _exp_times_bounded(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """exp(a) * sigmoid(b)**k = exp(a + k*logsigmoid(b)): exp(a) may overflow where the product is finite
        (x*exp(x)*sigmoid(-2*exp(x)), the derivative of x*tanh(exp(x))), and inf * 0 is nan. Likewise
        exp(a) * ndtr(b) = exp(a + log_ndtr(b)) (K*exp(-r*T)*ndtr(d2) in Black-Scholes at r = -100)."""
        exps = self._tensor_exps(factors)
        bounded = [f for f in factors if _log_of_bounded(f) is not None and self.is_tensor(f)]
        if len(exps) != 1 or not bounded:
            return None
        for f in (*exps, *bounded):
            factors.remove(f)
        exponent = exps[0].args[0] + sympy.Add(*[_log_of_bounded(f) for f in bounded])
        return coefficient * sympy.exp(exponent) * sympy.Mul(*factors)

    def _exp_times_density(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """exp(a + k*log_ndtr(b)) * log_ndtr_grad(b)**m = exp(a + (k - m)*log_ndtr(b) - m*b**2/2) /
        (2*pi)**(m/2) for m <= k: the density without its 1/ndtr(b), which is inf where exp(...) is 0
        (b = -inf)."""
        exps = self._tensor_exps(factors)
        merged = _density_of_log_ndtr(exps[0].args[0], factors) if len(exps) == 1 else None
        if merged is None:
            return None
        exponent, used = merged
        rest = [f for f in factors if f is not exps[0] and f not in used]
        return self(coefficient * sympy.exp(exponent) * sympy.Mul(*rest))

    def _exp_times_density_sum(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """exp(...) * (c + d*log_ndtr_grad(b)): multiplied out, so that :meth:`_exp_times_density` sees it."""
        exps = self._tensor_exps(factors)
        if len(exps) != 1:
            return None
        for f in factors:
            if f.is_Add and any(_density_of_log_ndtr(exps[0].args[0], t.as_coeff_mul()[1]) for t in f.args):
                rest = list(factors)
                rest.remove(f)
                return sympy.Add(*[self(coefficient * sympy.Mul(*rest) * t) for t in f.args])
        return None

    def _softmax_of_exps(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """exp(a) / (exp(a) + exp(b) + ...): sigmoid(a - b) for two terms, exp(a - logaddexp(a, b, ...)) for
        more."""
        for f in factors:
            for g in factors:
                if isinstance(f, sympy.exp) and g.is_Pow and g.exp == -1 and g.base.is_Add:
                    softmax = self._softmax(f.args[0], g.base)
                    if softmax is not None:
                        factors.remove(f)
                        factors.remove(g)
                        return coefficient * softmax * sympy.Mul(*factors)
        return None

    def _softmax(self, a: sympy.Expr, total: sympy.Add) -> sympy.Expr | None:
        exponents = [self._exp_term(t) for t in total.args]
        if any(u is None for u in exponents) or not any(sympy.expand(u - a) == 0 for u in exponents):
            return None
        if len(exponents) == 2:
            (b,) = [u for u in exponents if sympy.expand(u - a) != 0] or [a]
            return sigmoid(a - b)
        total_log = exponents[0]
        for u in exponents[1:]:
            total_log = logaddexp(total_log, u)
        return sympy.exp(a - total_log)

    def _exp_times_sum(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """exp(a) * (c + k*exp(b) + ...) multiplied out, so that exp(a) * exp(b) becomes exp(a + b): finite
        where exp(b) overflows and exp(a) is 0 (the second derivative of x*tanh(exp(x)) at x = 100 in
        float32)."""
        if not any(isinstance(f, (sympy.exp, xexpy)) and self.is_tensor(f) for f in factors):
            return None
        for f in factors:
            if f.is_Add and len(f.args) <= _MAX_MULTIPLIED_OUT and _has_growing_exp(f, self.tensors):
                rest = list(factors)
                rest.remove(f)
                return sympy.Add(*[self(coefficient * sympy.Mul(*rest) * t) for t in f.args])
        return None

    def _exp_times_tensor(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """x * exp(v) = xexpy(x, v): 0, not 0 * inf, where x = 0 and exp(v) overflows, for x that can be 0
        independently of v (exp(v) bounded by 1 or x = v, as in v * exp(v), need nothing)."""
        exps = self._tensor_exps(factors)
        if len(exps) != 1 or exps[0].args[0].is_nonpositive:
            return None
        others = [f for f in factors if f is not exps[0] and self.is_tensor(f)]
        v = exps[0].args[0]
        if not others or sympy.Mul(*others).free_symbols & self.tensors <= v.free_symbols:
            return None
        scalars = [f for f in factors if f is not exps[0] and not self.is_tensor(f)]
        return coefficient * sympy.Mul(*scalars) * xexpy(sympy.Mul(*others), v)


class _NamedProductRules(_Matching):
    """Products that are one named primitive with its own stable derivative: ``tanh(u/2)``,
    ``sigmoid(u)``, ``erfcx``, ``silu``, ``gelu``, ``mish``, ``xlogy`` and ``xlog1py``."""

    def _tanh_of_half(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """expm1(u) * sigmoid(-u) = (exp(u) - 1) / (exp(u) + 1) = tanh(u/2): the bipolar sigmoid
        (1 - exp(-x)) / (1 + exp(-x)), which as -expm1(-x) * sigmoid(x) is inf * 0 at x = -100 in float32."""
        for f in factors:
            if isinstance(f, expm1) and sigmoid(-f.args[0]) in factors:
                rest = list(factors)
                rest.remove(f)
                rest.remove(sigmoid(-f.args[0]))
                return coefficient * sympy.Mul(*rest) * sympy.tanh(f.args[0] / 2)
        return None

    def _sigmoid_of_exp(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """exp(u) * sigmoid(-u) = exp(u) / (1 + exp(u)) = sigmoid(u)."""
        for f in factors:
            if isinstance(f, sympy.exp) and sigmoid(-f.args[0]) in factors:
                factors.remove(f)
                factors.remove(sigmoid(-f.args[0]))
                return coefficient * sigmoid(f.args[0]) * sympy.Mul(*factors)
        return None

    def _erfcx(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """exp(u**2) * erfc(u) = erfcx(u)."""
        for f in factors:
            if isinstance(f, sympy.erfc) and sympy.exp(f.args[0] ** 2) in factors:
                factors.remove(f)
                factors.remove(sympy.exp(f.args[0] ** 2))
                return coefficient * erfcx(f.args[0]) * sympy.Mul(*factors)
        return None

    def _silu_gelu(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """u * sigmoid(u) = silu(u); u * ndtr(u) = gelu(u); u * tanh(softplus(u)) = mish(u): one kernel each,
        with their own derivatives."""
        for f in factors:
            if isinstance(f, sympy.tanh) and isinstance(f.args[0], softplus) and f.args[0].args[0] != 0:
                u = f.args[0].args[0]
                scale, rest = _factor_out(coefficient, factors, f, u)
                if rest is not None:
                    return scale * mish(u) * rest
            if isinstance(f, (sigmoid, ndtr)) and f.args[0] != 0:
                u = f.args[0]
                scale, rest = _factor_out(coefficient, factors, f, u)
                if rest is not None:
                    return scale * (silu(u) if isinstance(f, sigmoid) else gelu(u)) * rest
        return None

    def _xlogy(self, coefficient: sympy.Expr, factors: list[sympy.Expr]) -> sympy.Expr | None:
        """x * log(y) = xlogy(x, y): 0, not nan, where x = 0 and y = 0 ((1 - x)**(b - 1) * log(1 - x) at
        x = 1, b > 1); x * log1p(y) = xlog1py(x, y) likewise where y = -1."""
        # a log of a log_argument is a derivative of xlogy, its pole taken away where its own weight is 0
        logs = [
            f
            for f in factors
            if isinstance(f, (sympy.log, log1p)) and self.is_tensor(f) and not isinstance(f.args[0], log_argument)
        ]
        tensor_factors = [f for f in factors if f not in logs and self.is_tensor(f)]
        if len(logs) != 1 or not tensor_factors:
            return None
        scalars = [f for f in factors if f not in logs and f not in tensor_factors]
        kind = xlogy if isinstance(logs[0], sympy.log) else xlog1py
        return coefficient * sympy.Mul(*scalars) * kind(sympy.Mul(*tensor_factors), logs[0].args[0])


class _Rewriter(_LogRules, _PowerRules, _SumRules, _ExponentialProductRules, _NamedProductRules):
    """Rebuilds an expression bottom-up, applying the rewrites to each node whose children are done: the
    rule for the node's type (:attr:`rules`; a product's rules are tried in the order of
    :attr:`product_rules`), its result kept where the float32 check (:class:`_Float32Check`) holds."""

    def __init__(self, tensors: frozenset[sympy.Symbol]) -> None:
        self.tensors = tensors
        self.check = _Float32Check(tensors)
        self.rules: dict[type, Callable[[sympy.Basic], sympy.Basic | None]] = {
            sympy.log: self._log,
            log1p: self._log1p,
            sympy.Pow: self._pow,
            sympy.Add: self._add,
            sympy.Mul: self._mul,
            xexpy: self._xexpy,
        }
        # The rewrites of a product, tried in this order (see _mul): each takes the numeric coefficient and
        # the other factors, and returns the rewritten product or None.
        self.product_rules: tuple[Callable[[sympy.Expr, list[sympy.Expr]], sympy.Expr | None], ...] = (
            self._merged_xexpy,
            self._softplus_ratio,
            self._merged_exps,
            self._tanh_of_half,
            self._exp_over_expm1,
            self._sigmoid_of_exp,
            self._exp_times_bounded,
            self._exp_times_density,
            self._exp_times_density_sum,
            self._softmax_of_exps,
            self._erfcx,
            self._silu_gelu,
            self._xlogy,
            self._exp_times_sum,
            self._exp_times_tensor,
        )

    def __call__(self, expr: sympy.Basic) -> sympy.Basic:
        if expr.is_Atom or not expr.args:
            return expr
        args = tuple(self(a) for a in expr.args)
        node = expr.func(*args) if args != expr.args else expr
        rule = self.rules.get(type(node))
        rewritten = rule(node) if rule is not None and self.is_tensor(node) else None
        if rewritten is None and node is expr:
            return node
        # What the rewrites made of this node is taken only where it is finite wherever the written form is
        # (in float32, at each input's tails and at ordinary points); else the node as its rewritten children
        # make it, else the written form.
        candidates = [c for c in (rewritten, node) if c is not None]
        return next((c for c in candidates if self.check.holds(expr, c)), expr)

    def _mul(self, node: sympy.Mul) -> sympy.Expr | None:
        """The product as rewritten by the first of :attr:`product_rules` that applies; None if none does."""
        coefficient, factors = node.as_coeff_mul()
        for rule in self.product_rules:
            rewritten = rule(coefficient, list(factors))
            if rewritten is not None:
                return rewritten
        return None


def _can_overflow(w: sympy.Expr, tensors: frozenset[sympy.Symbol]) -> bool:
    """Whether ``w`` can pass 1e19 (its square, float32's largest number) at inputs of 1e4: it has a power
    of 3 or more (or a symbolic one), or an exponential, of a tensor."""
    growing = (sympy.exp, sympy.sinh, sympy.cosh, expm1)
    return any(
        (isinstance(p, growing) or (p.is_Pow and not (p.exp.is_Number and abs(p.exp) < 3)))
        and bool(p.free_symbols & tensors)
        for p in sympy.preorder_traversal(w)
    )


#: Terms of a sum that a product with an exponential is multiplied out over, at most.
_MAX_MULTIPLIED_OUT = 8


def _has_growing_exp(total: sympy.Add, tensors: frozenset[sympy.Symbol]) -> bool:
    """Whether a term of ``total`` has an exponential of a tensor that can overflow."""
    return any(
        _can_overflow(sympy.exp(n.args[-1]), tensors)
        for term in total.args
        for n in sympy.preorder_traversal(term)
        if isinstance(n, (sympy.exp, xexpy))
    )


def _softplus_by_hand(terms: Sequence[sympy.Expr]) -> sympy.Expr | None:
    """The sum with ``Max(u, 0) + softplus(-|u|)`` (a softplus written the stable way by hand, as in
    TensorFlow's sigmoid cross-entropy) made ``softplus(u)``; None if there is none. Apart, the two kinks at
    u = 0 give the smooth sum the derivative 0 there (sign(0) = 0, relu'(0) = 0); the truth is 1/2."""
    for i, term in enumerate(terms):
        if not (isinstance(term, sympy.Max) and len(term.args) == 2 and 0 in term.args):
            continue
        u = term.args[1] if term.args[0] == 0 else term.args[0]
        for j, other in enumerate(terms):
            if isinstance(other, softplus) and other.args[0] == -sympy.Abs(u):
                rest = [t for k, t in enumerate(terms) if k not in (i, j)]
                return sympy.Add(*rest, softplus(u))
    return None


def _log_of_bounded(f: sympy.Expr) -> sympy.Expr | None:
    """``log(f)`` in stable primitives for ``f`` a sigmoid or ndtr (or a numeric power of one), else None."""
    base, exponent = f.as_base_exp() if f.is_Pow else (f, sympy.S.One)
    if exponent.is_Number and isinstance(base, (sigmoid, ndtr)):
        return exponent * (logsigmoid if isinstance(base, sigmoid) else log_ndtr)(base.args[0])
    return None


def _density_of_log_ndtr(exponent: sympy.Expr, factors: Sequence[sympy.Expr]) -> tuple[sympy.Expr, list] | None:
    """For ``exp(exponent)`` times ``factors``: the exponent with the first ``log_ndtr_grad(b)**m`` among
    the factors merged into it (``exponent`` holding ``k*log_ndtr(b)``, k >= m > 0), and the factors
    used; None if there is none."""
    for f in factors:
        base, m = f.as_base_exp()
        if isinstance(base, log_ndtr_grad) and m.is_Integer and m > 0:
            b = base.args[0]
            k = exponent.coeff(log_ndtr(b))
            if k.is_Number and k >= m:
                density = -m * log_ndtr(b) - m * b**2 / 2 - m * sympy.log(2 * sympy.pi) / 2
                return exponent + density, [f]
    return None


def _factor_out(
    coefficient: sympy.Expr, factors: list[sympy.Expr], f: sympy.Expr, u: sympy.Expr
) -> tuple[sympy.Expr, sympy.Expr | None]:
    """For a product ``coefficient * factors`` containing ``f`` and ``u`` itself (or ``k * u`` spread
    over the numeric coefficient and the other factors): ``(scale, rest)`` with product
    ``scale * u * f * rest``; ``rest`` is None if ``u`` is not a factor."""
    others = list(factors)
    others.remove(f)
    k, u_factors = u.as_coeff_mul()
    if not all(g in others for g in u_factors) or k == 0:
        return coefficient, None
    for g in u_factors:
        others.remove(g)
    return coefficient / k, sympy.Mul(*others)


def _as_ndtr(f: sympy.Expr) -> tuple[sympy.Expr, ...]:
    """erf or erfc(u) written with the normal distribution function, both ways round."""
    u = f.args[0]
    z = sympy.sqrt(2) * u
    if isinstance(f, sympy.erf):
        return 2 * ndtr(z) - 1, 1 - 2 * ndtr(-z)
    return 2 * ndtr(-z), 2 - 2 * ndtr(z)


@dataclasses.dataclass(frozen=True)
class _Float32Check:
    """Whether a rewritten form is finite in float32 wherever the written one is: both are evaluated at
    each tensor's tails (the others at an ordinary value) and at a few ordinary points, each operation's
    exact value brought into float32's range (beyond it inf, as torch's kernels overflow; inf * 0 is nan), and
    compared with the written form's exact value. A rewrite must be finite and close where the written form
    is. An expression the check cannot evaluate (a case distinction, a structural node) passes."""

    TAILS = (-1e4, -100.0, 100.0, 1e4)
    ORDINARY = (0.3, -0.7, 1.3)
    SCALAR = 0.75  # a scalar argument's value (its default is not known here)
    MAX_OPS = 120  # larger expressions are not checked (the cost grows with their size)
    RTOL = 1e-4
    ATOL = 1e-6

    tensors: frozenset[sympy.Symbol]
    #: The values of the subexpressions met so far, for each point and mode: the checks of a node and of its
    #: ancestors, and of a derivative's repeated factors, evaluate each subexpression once.
    memos: dict = dataclasses.field(default_factory=dict, compare=False, hash=False, repr=False)

    def holds(self, written: sympy.Expr, rewritten: sympy.Expr) -> bool:
        if rewritten == written:
            return True
        # Each pair once: the double backward rewrites the same factors in many stabilize calls.
        key = (self.tensors, written, rewritten)
        verdict = _VERDICTS.get(key)
        if verdict is None:
            if len(_VERDICTS) >= _MAX_VERDICTS:
                del _VERDICTS[next(iter(_VERDICTS))]  # the oldest
            verdict = _VERDICTS[key] = self.check(written, rewritten)
        return verdict

    def check(self, written: sympy.Expr, rewritten: sympy.Expr) -> bool:
        """:meth:`holds`, uncached."""
        if sympy.count_ops(written) > self.MAX_OPS:
            return True
        tensors = sorted(written.free_symbols & self.tensors, key=sympy.default_sort_key)
        if not tensors:
            return True
        try:
            for k, point in enumerate(self._points(tensors)):
                key = (tuple(tensors), k)
                exact = _exact(written, point, self.memos.setdefault((*key, True), {}))
                if exact is None:
                    continue
                float32 = self.memos.setdefault((*key, False), {})
                if not _close(_float32(written, point, float32), exact, self):
                    continue  # the written form is not finite (or not right) here either
                if not _close(_float32(rewritten, point, float32), exact, self):
                    return False
        except _UnevaluatedError:
            return True
        return True

    def _points(self, tensors: list[sympy.Symbol]):
        """The tensors' values at each point; a scalar takes :attr:`SCALAR` (2 if it is an integer)."""
        for k, value in enumerate(self.ORDINARY):
            yield _Point({t: value + k * i / 10 for i, t in enumerate(tensors)}, self.SCALAR)
        for t in tensors:
            for tail in self.TAILS:
                yield _Point({**{u: 0.5 for u in tensors}, t: tail}, self.SCALAR)


class _Point(dict):
    """A point's values: the tensors' as given, any other symbol's ``scalar`` (2 if it is an integer)."""

    def __init__(self, values: dict, scalar: float) -> None:
        super().__init__(values)
        self.scalar = scalar

    def __missing__(self, symbol: sympy.Symbol) -> float:
        return 2 if symbol.is_integer else self.scalar


class _UnevaluatedError(Exception):
    """The float32 check met a node it does not evaluate."""


_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_TINY = 1.401298464324817e-45  # the least subnormal
_DUMMIES = tuple(sympy.Dummy(f"a{i}", real=True) for i in range(8))
_EVALUATED = (sympy.Add, sympy.Mul, sympy.Pow, sympy.Function)


def _close(value: float, exact: float, check: _Float32Check) -> bool:
    return math.isfinite(value) and abs(value - exact) <= check.ATOL + check.RTOL * abs(exact)


def _exact(expr: sympy.Expr, point: dict, memo: dict) -> float | None:
    """``expr``'s value at ``point`` (50 digits), None where it is not a real number in float32's range."""
    with mpmath.workdps(50):
        value = _evaluate(expr, point, exact=True, memo=memo)
    if not mpmath.isfinite(value) or not abs(value) <= _FLOAT32_MAX:
        return None
    return float(value)


def _float32(expr: sympy.Basic, point: dict, memo: dict) -> float:
    """``expr`` at ``point`` as float32 kernels compute it: each operation exact, its result beyond
    float32's range inf (IEEE arithmetic on inf and nan)."""
    with mpmath.workdps(50):
        return float(_evaluate(expr, point, exact=False, memo=memo))


def _evaluate(expr: sympy.Basic, point: dict, exact: bool, memo: dict):
    """``expr`` at ``point``, each function exact (mpmath); with ``exact`` False each result beyond
    float32's range is inf, and a complex one nan. ``memo`` holds the values of the subexpressions met so
    far: a derivative repeats its factors many times over."""
    value = memo.get(expr)
    if value is None:
        try:
            value = _evaluate_node(expr, point, exact, memo)
        except _UnevaluatedError as error:
            value = error
        memo[expr] = value
    if isinstance(value, _UnevaluatedError):
        raise value
    return value


def _evaluate_node(expr: sympy.Basic, point: dict, exact: bool, memo: dict):
    if expr.is_Symbol:
        return mpmath.mpf(point[expr]) if exact else point[expr]
    if expr.is_Number or expr.is_NumberSymbol:
        return mpmath.mpf(float(expr)) if not exact else mpmath.mpf(sympy.Float(expr, 50))
    if isinstance(expr, kept):
        return _evaluate(expr.args[0], point, exact, memo)
    if not isinstance(expr, _EVALUATED) or isinstance(expr, (sympy.Piecewise, sympy.Heaviside, sympy.Min, sympy.Max)):
        raise _UnevaluatedError(expr)
    args = [_evaluate(a, point, exact, memo) for a in expr.args]
    if any(mpmath.isnan(a) for a in args):
        return mpmath.nan
    if isinstance(expr, sympy.Add):
        value = mpmath.fsum(args)  # inf - inf is nan
    elif isinstance(expr, sympy.Mul):
        value = mpmath.fprod(args)  # inf * 0 is nan
    else:  # a power or a function: exact (mpmath takes inf)
        if len(args) > len(_DUMMIES):
            raise _UnevaluatedError(expr)
        function = _mpmath_function(expr.func, len(args))
        if function is None:
            raise _UnevaluatedError(expr)
        try:
            value = function(*args)
        except NameError as error:  # a helper node without a formula (finite_at_zero, ...)
            raise _UnevaluatedError(expr) from error
        except (ValueError, ZeroDivisionError, OverflowError, TypeError):
            return mpmath.nan
        if isinstance(value, mpmath.mpc):
            if value.imag and (not exact or abs(value.imag) > 1e-30 * (1 + abs(value.real))):
                return mpmath.nan
            value = value.real
        if isinstance(expr, StableFunction) and not mpmath.isfinite(value) and all(map(mpmath.isfinite, args)):
            # PyTorch's primitive is finite here; its formula cancels at 50 digits (log_ndtr(-100))
            raise _UnevaluatedError(expr)
    if exact or mpmath.isnan(value):
        return value
    if abs(value) > _FLOAT32_MAX:
        return mpmath.inf if value > 0 else -mpmath.inf
    return value if abs(value) >= _FLOAT32_TINY else mpmath.mpf(0)  # underflow: erfc(100) is 0


#: The float32 check's verdicts on (tensors, written, rewritten), the most recent :data:`_MAX_VERDICTS`.
_VERDICTS: dict[tuple, bool] = {}
_MAX_VERDICTS = 4096


@functools.lru_cache(maxsize=2048)
def _mpmath_function(func: type, arity: int) -> Callable | None:
    """``func`` of ``arity`` arguments as an mpmath function (None where mpmath has no translation of it)."""
    dummies = _DUMMIES[:arity]
    try:
        return sympy.lambdify(dummies, to_literal(func(*dummies)), modules="mpmath")
    except Exception:  # noqa: BLE001 - a node mpmath has no translation for
        return None


def stabilize(expr: sympy.Expr, tensors: frozenset[sympy.Symbol] | set[sympy.Symbol]) -> sympy.Expr:
    """``expr`` with its unstable textbook patterns replaced by stable primitives (see the module doc)."""
    return _Rewriter(frozenset(tensors))(expr)


# --- removable singularities -----------------------------------------------------------------------------------

#: Below this |x|, a part of the forward that is 0/0 at x = 0 is computed from its Taylor polynomial.
SERIES_RADIUS = sympy.Rational(1, 20)
#: The polynomial's order: the first term left out is below 1e-16 of the value at |x| = SERIES_RADIUS
#: wherever the series converges on |x| < 1 (each term is checked at the radius before it is used).
SERIES_ORDER = 12
_SERIES_SIZE = 40  # larger parts are not expanded (sympy's series grows fast with the expression)


def remove_singularities(
    expr: sympy.Expr, tensors: frozenset[sympy.Symbol] | set[sympy.Symbol]
) -> tuple[sympy.Expr, set[sympy.Symbol]]:
    """``expr`` with each part that is 0/0 (or inf - inf) at x = 0 but has a finite limit there (x/expm1(x),
    1/tanh(x) - 1/x, sin(x)/x) computed from its Taylor polynomial for |x| < SERIES_RADIUS, and the tensors
    x patched. A part is a subexpression, or several terms or factors of a sum or product, in one tensor
    and no scalar. Near 0 the formula as written is nan (Planck's x**3/expm1(x) at x = 0) or cancels (the
    Langevin function keeps no correct digit in float32 at x = 1e-3); its derivatives likewise."""
    singularities = _Singularities(frozenset(tensors))
    return singularities.visit(expr), singularities.patched


def _elementary(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with sympy's codegen functions written out (their series are not all right: sympy expands
    x/expm1(x) with a term x**11/12! that x/(exp(x) - 1) does not have)."""
    return (
        expr.replace(expm1, lambda u: sympy.exp(u) - 1)
        .replace(log1p, lambda u: sympy.log(1 + u))
        .replace(hypot, lambda a, b: sympy.sqrt(a**2 + b**2))
    )


class _Singularities:
    def __init__(self, tensors: frozenset[sympy.Symbol]) -> None:
        self.tensors = tensors
        self.patched: set[sympy.Symbol] = set()

    def visit(self, node: sympy.Basic) -> sympy.Basic:
        if node.is_Atom or not node.args or not node.free_symbols & self.tensors:
            return node
        x = self._variable(node)
        if x is not None:
            patched = self._patch(node, x)
            return node if patched is None else patched
        args = list(node.args)
        if isinstance(node, (sympy.Add, sympy.Mul)):  # x*y/expm1(x): the part x/expm1(x)
            for x in {self._variable(a) for a in args} - {None}:
                part = [a for a in args if self._variable(a) == x]
                patched = self._patch(node.func(*part), x) if len(part) > 1 else None
                if patched is not None:
                    args = [a for a in args if a not in part] + [patched]
        visited = [self.visit(a) for a in args]
        return node.func(*visited) if visited != list(node.args) else node

    def _variable(self, node: sympy.Basic) -> sympy.Symbol | None:
        """The tensor ``node`` depends on, if it depends on exactly one and on nothing else."""
        free = node.free_symbols
        return next(iter(free)) if len(free) == 1 and free <= self.tensors else None

    def _patch(self, part: sympy.Expr, x: sympy.Symbol) -> sympy.Expr | None:
        """Piecewise((Taylor polynomial, |x| < SERIES_RADIUS), (part, True)) where ``part`` is 0/0 at x = 0
        with a finite limit and its polynomial is accurate at the radius; else None."""
        try:
            if part.subs(x, 0) is not sympy.nan or sympy.count_ops(part) > _SERIES_SIZE:
                return None
            literal = _elementary(to_literal(part))
            # No finite limit (student_t's lgamma(nu/2) - log(nu)/2, inf - inf at 0): its values at 1e-8 and
            # 1e-12 differ (by 14 for a logarithm), and sympy's series would take half a minute to fail.
            near = [literal.subs(x, sympy.Rational(1, 10**k)).evalf(50) for k in (8, 12)]
            if not all(v.is_finite for v in near) or abs(near[0] - near[1]) > 1e-3 * (1 + abs(near[0])):
                return None
            polynomial = literal.series(x, 0, SERIES_ORDER).removeO()
            if not polynomial.is_polynomial(x) or polynomial.has(sympy.nan, sympy.zoo, sympy.oo):
                return None
            for edge in (-SERIES_RADIUS, SERIES_RADIUS):  # where the series converges slowly, it is not used
                exact = literal.subs(x, edge).evalf(40)
                if not exact.is_finite or abs(polynomial.subs(x, edge) - exact) > 1e-17 * (1 + abs(exact)):
                    return None
        except Exception:  # sympy could not expand it: the part stays as written
            return None
        self.patched.add(x)
        return sympy.Piecewise((polynomial, sympy.Abs(x) < SERIES_RADIUS), (part, True))


# -- steps torch computes and sympy does not differentiate: round (half to even, as torch.round), floor, ceil,
# trunc. Their derivative is 0 wherever it exists; a straight-through rule is the user's, in [gradients].


class _Rounding(sympy.Function):
    """A step to an integer: exact on numbers (a Fraction, so that 2.5 rounds as torch rounds it), 0 as its
    derivative, an integer for a real argument."""

    nargs = 1
    _to_integer: staticmethod

    @classmethod
    def eval(cls, x):
        if x.is_Rational:
            return sympy.Integer(cls._to_integer(fractions.Fraction(int(x.p), int(x.q))))
        if x.is_Float:
            return sympy.Integer(cls._to_integer(fractions.Fraction(float(x))))
        return None

    def fdiff(self, argindex=1):
        return sympy.S.Zero

    def _eval_is_integer(self):
        return self.args[0].is_extended_real

    def _eval_is_extended_real(self):
        return self.args[0].is_extended_real


class round(_Rounding):  # noqa: N801, A001 - torch.round's name; rounds half to even, as torch.round does
    _to_integer = staticmethod(builtins.round)


class floor(_Rounding):  # noqa: N801
    _to_integer = staticmethod(math.floor)


class ceil(_Rounding):  # noqa: N801
    _to_integer = staticmethod(math.ceil)


class trunc(_Rounding):  # noqa: N801
    _to_integer = staticmethod(math.trunc)
