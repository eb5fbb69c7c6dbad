"""Stage 6c: print sympy expressions as Triton source (fused mode's row kernels, :mod:`.rows`).

Strict, as :mod:`.printing` is: a node without a faithful translation into ``triton.language`` raises
:class:`NotPrintableError`, and :mod:`.rows` then leaves the op to torch.compile; nothing is printed half-right.
Only what Triton's interpreter (``TRITON_INTERPRET=1``) also runs is printed, so that the kernels are
tested on the CPU: ``tl.exp``, ``tl.log``, ``tl.sqrt``, ``tl.sin``, ``tl.cos``, ``tl.abs``, ``tl.erf``,
``tl.sigmoid``, ``tl.maximum``, ``tl.minimum`` and ``tl.where``. libdevice (``tanh``, ``log1p``, ...)
has no interpreter implementation: ops that need it are not printed.

A value ``v`` of the program prints as ``v_v`` (the kernels' own names, ``row``, ``cols``, ``inside``,
cannot clash with the spec's names, which start with a letter and may be ``tl``). Every compound operand
is parenthesized: the text is read by Triton's compiler, which folds what it does not need.
"""

from __future__ import annotations

import sympy

from . import stable
from .lowering import within

VALUE_PREFIX = "v_"
#: sympy functions of one argument and their triton.language names
_FUNCTIONS = {
    sympy.exp: "tl.exp",
    sympy.log: "tl.log",
    sympy.sin: "tl.sin",
    sympy.cos: "tl.cos",
    sympy.Abs: "tl.abs",
    sympy.erf: "tl.erf",
    stable.sigmoid: "tl.sigmoid",
}
_RELATIONS = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


class NotPrintableError(Exception):
    """A node the Triton printer has no faithful translation for; ``node`` names it."""

    def __init__(self, node: sympy.Basic) -> None:
        super().__init__(f"no Triton translation of {type(node).__name__} ({sympy.sstr(node)[:60]})")
        self.node = node


def value_name(name: str) -> str:
    """The kernel's name of the program's value ``name``."""
    return VALUE_PREFIX + name


def print_triton(expr: sympy.Basic) -> str:
    """``expr`` as a triton.language expression over the kernel's value names."""
    return _print(expr)


def _wrapped(text: str) -> str:
    """``text`` as an operand: parenthesized unless it is a name, a number or a call."""
    if text.replace("_", "").replace(".", "").isalnum() or (text.endswith(")") and _one_call(text)):
        return text
    return f"({text})"


def _one_call(text: str) -> bool:
    """Whether ``text`` is one call, ``f(...)``, its parentheses closing at the end."""
    head = text.split("(", 1)[0]
    if not head or not head.replace("_", "").replace(".", "").isalnum():
        return head == "" and _closes_at_end(text)
    return _closes_at_end(text[len(head) :])


def _closes_at_end(text: str) -> bool:
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and i < len(text) - 1:
            return False
    return depth == 0


def _number(value: sympy.Basic) -> str:
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        raise NotPrintableError(value)
    return repr(number)


def _print(expr: sympy.Basic) -> str:  # noqa: C901, PLR0911, PLR0912 - one case per kind of node
    if isinstance(expr, sympy.Symbol):
        return value_name(expr.name)
    if expr is sympy.true or expr is sympy.false:
        return str(bool(expr))
    if isinstance(expr, (sympy.Integer, sympy.Rational, sympy.Float)) or expr in (sympy.pi, sympy.E):
        return _number(expr)
    if isinstance(expr, sympy.Add):
        # a term with a minus sign as a subtraction; a term (a product, a call) binds tighter than + and -
        terms = sorted(sympy.Add.make_args(expr), key=lambda t: t.could_extract_minus_sign())
        text = _print(terms[0])
        for term in terms[1:]:
            text += f" - {_print(-term)}" if term.could_extract_minus_sign() else f" + {_print(term)}"
        return text
    if isinstance(expr, sympy.Mul):
        coefficient, factors = expr.as_coeff_mul()
        if coefficient == -1:
            return f"-{_wrapped(_print(sympy.Mul(*factors)))}"
        numerator = [_wrapped(_print(f)) for f in factors if not _is_reciprocal(f)]
        denominator = [_wrapped(_print(1 / f)) for f in factors if _is_reciprocal(f)]
        if coefficient != 1 or not numerator:
            numerator.insert(0, _wrapped(_number(coefficient)))
        text = " * ".join(numerator)
        return f"{text} / {_wrapped(' * '.join(denominator))}" if denominator else text
    if isinstance(expr, sympy.Pow):
        return _power(expr)
    if isinstance(expr, sympy.Function) and expr.func in _FUNCTIONS:
        (arg,) = expr.args
        return f"{_FUNCTIONS[expr.func]}({_print(arg)})"
    if isinstance(expr, (sympy.Max, sympy.Min)):
        name = "tl.maximum" if isinstance(expr, sympy.Max) else "tl.minimum"
        args = sorted(expr.args, key=sympy.default_sort_key)
        text = _print(args[0])
        for arg in args[1:]:
            text = f"{name}({text}, {_print(arg)})"
        return text
    if isinstance(expr, sympy.sign):
        (arg,) = expr.args
        a = _wrapped(_print(arg))
        return f"tl.where({a} > 0, 1.0, tl.where({a} < 0, -1.0, 0.0))"
    if isinstance(expr, sympy.Heaviside):
        arg, at_zero = expr.args
        a = _wrapped(_print(arg))
        return f"tl.where({a} > 0, 1.0, tl.where({a} == 0, {_number(at_zero)}, 0.0))"
    if isinstance(expr, sympy.Piecewise):
        pairs = list(expr.args)
        if pairs[-1].cond is not sympy.true:
            raise NotPrintableError(expr)
        text = _print(pairs[-1].expr)
        for value, cond in reversed(pairs[:-1]):
            text = f"tl.where({_print(cond)}, {_print(value)}, {text})"
        return text
    if isinstance(expr, within):
        value, condition, inside = expr.args
        return f"tl.where({_print(condition)}, {_print(value)}, {_print(inside)})"
    if isinstance(expr, stable.kept):
        return _print(expr.args[0])
    if isinstance(expr, stable.xexpy):  # x * exp(y), 0 where x is 0 even where exp(y) overflows
        x, y = (_print(a) for a in expr.args)
        return f"tl.where({_wrapped(x)} == 0, 0.0, {_wrapped(x)} * tl.exp({y}))"
    if isinstance(expr, (stable.softplus, stable.logsigmoid)):
        return _softplus(expr.args[0]) if isinstance(expr, stable.softplus) else f"-{_softplus(-expr.args[0])}"
    if isinstance(expr, stable.silu):
        x = _print(expr.args[0])
        return f"{_wrapped(x)} * tl.sigmoid({x})"
    if isinstance(expr, sympy.core.relational.Relational) and expr.rel_op in _RELATIONS:
        return f"{_wrapped(_print(expr.lhs))} {_RELATIONS[expr.rel_op]} {_wrapped(_print(expr.rhs))}"
    if isinstance(expr, (sympy.And, sympy.Or)):
        op = " & " if isinstance(expr, sympy.And) else " | "
        return op.join(_wrapped(_print(a)) for a in sorted(expr.args, key=sympy.default_sort_key))
    if isinstance(expr, sympy.Not):
        return f"~{_wrapped(_print(expr.args[0]))}"
    raise NotPrintableError(expr)


def _softplus(arg: sympy.Basic) -> str:
    """log(1 + exp(t)) without libdevice's log1p, within an ulp: ``max(t, 0) + log(u) + (e - (u - 1))``
    with ``e = exp(-|t|)`` and ``u = 1 + e`` (the last term is the rounding error of u), as fused code
    prints it for inductor (:mod:`.plan`)."""
    t = _wrapped(_print(arg))
    e = f"tl.exp(-tl.abs({t}))"
    return f"(tl.maximum({t}, 0.0) + tl.log(1.0 + {e}) + ({e} - ((1.0 + {e}) - 1.0)))"


def _is_reciprocal(factor: sympy.Basic) -> bool:
    return isinstance(factor, sympy.Pow) and factor.exp.is_number and factor.exp.is_negative


def _power(expr: sympy.Pow) -> str:
    """Integer powers as products, square roots by ``tl.sqrt``; other exponents are not printed (a general
    power needs libdevice)."""
    base, exponent = expr.args
    if base is sympy.E:
        return f"tl.exp({_print(exponent)})"
    if not exponent.is_number:
        raise NotPrintableError(expr)
    if exponent.is_negative:
        return f"1.0 / {_wrapped(_power(sympy.Pow(base, -exponent, evaluate=False)))}"
    b = _wrapped(_print(base))
    if exponent.is_integer and 1 <= exponent <= 8:
        return " * ".join([b] * int(exponent))
    if exponent == sympy.Rational(1, 2):
        return f"tl.sqrt({_print(base)})"
    if exponent.is_Rational and exponent.q == 2 and 1 <= exponent.p <= 7:
        return " * ".join([b] * (int(exponent.p) // 2) + [f"tl.sqrt({_print(base)})"])
    raise NotPrintableError(expr)
