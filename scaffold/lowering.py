"""Stage 5b: lowering, how each value is computed (not what), before common subexpressions are shared.

The derivation's formulas are exact math; printed as they stand, some of them compute an inf or a nan
that the math does not have. Each rewrite here keeps the value and changes the computation:

* :func:`guard_branches`: the input of a ``Piecewise`` branch (or of what a step multiplies) is kept
  inside the branch's region, ``exp(within(x, x <= 0, -1))``, so that the untaken side of a
  ``torch.where`` is finite: its zero gradient times an inf (exp(100) in float32) is nan, at first order
  for log and sqrt, at second for exp. Done before CSE, so that CSE cannot lift ``exp(x)`` out of the
  ``where`` into a temporary computed everywhere (it did: ELU inside a Huber loss);
* :func:`pair_powers`: ``sigma**12 * r**-12`` (sympy's expansion of ``(sigma/r)**12``) is computed as
  ``tmp = sigma / r; tmp**12``, since each factor alone overflows float32 where the quotient is 1;
* :func:`tanh_softplus_in_sigmoids`: mish's ``tanh(softplus(x))`` is computed from ``sigmoid(x)``, which
  CSE can then share with the rest of the formula (in eager code mish itself too);
* :func:`products_with_exp`: ``xexpy(x, y)`` becomes ``x * finite_at_zero(exp(y), x)``, 0 (not 0 * inf)
  where x = 0, with exp(y) one temporary;
* :func:`one_logarithm_of_odds`: ``c*log(u) - c*log1p(-u)`` (binary cross-entropy's target gradient) is
  computed as ``c*logit(u)`` (``c*log(a / (1 + b))`` where u is guarded), one logarithm, not two;
* :func:`negated_weights`: ``-xlog1py(1 - y, -p)`` is ``xlog1py(y - 1, -p)``, a weight that costs what
  ``1 - y`` does, and no negation;
* :func:`guarded_sums`: ``1 + log_argument(-1, 0, y, x)`` (xlog1py's guarded argument, where only one plus it
  is read) is ``log_argument(0, 1, 1 + y, x)``, one plus ``y`` guarded, whose pole is 0, which is cheaper
  to test than -1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import sympy
from sympy.codegen.cfunctions import log1p

from . import functions, stable

#: Functions a Piecewise branch keeps its input inside the branch's region for: those whose inputs are
#: restricted (log, asin, ...), and those that overflow for large inputs (exp, sinh, ...), whose derivative
#: in an untaken branch may be inf: where() passes the branch a zero gradient, so double backward would
#: compute 0 * inf = nan. Both from the registry (:mod:`.functions`).
_GUARDED = functions.restricted_classes() + functions.growing_classes()

Replacements = list[tuple[sympy.Symbol, sympy.Expr]]


class within(sympy.Function):  # noqa: N801 - sympy's convention: functions print by class name
    """``value`` where ``condition`` holds, else ``inside`` (a point where it holds): how a branch's
    input is kept inside the branch's region. Printed as ``torch.where(condition, value, inside)``."""

    nargs = 3


class sum_to(sympy.Function):  # noqa: N801 - sympy's convention: functions print by class name
    """``part`` summed over the dimensions broadcasting added, to the shape named by the symbol ``shape``:
    one output's part of a gradient when an op has several outputs (of shapes that may differ, so that each
    part is reduced before the parts are added). A marker while the plan chooses what backward reads; the
    plan takes the parts apart (:func:`without_sum_to`) before anything is printed, and render reduces each."""

    nargs = 2


def without_sum_to(expr: sympy.Basic) -> sympy.Basic:
    """``expr`` with each :class:`sum_to` replaced by its part: the elementwise formula, to differentiate."""
    return expr.replace(lambda e: isinstance(e, sum_to), lambda e: e.args[0])


def needs_guard(value: sympy.Basic, is_tensor: Callable[[sympy.Basic], bool]) -> bool:
    """Whether a Piecewise branch must see its input kept inside its region: the branch's functions of
    tensors are undefined (log, sqrt, ...), infinite (1/x) or overflow (exp, x**3) elsewhere, and the
    untaken branch of a where() would put nan into the gradient (log) or into the gradient's gradient (exp)."""
    return any(
        (isinstance(p, _GUARDED) or (p.is_Pow and not (p.exp.is_Number and p.exp in (0, 1, 2)))) and is_tensor(p)
        for p in sympy.preorder_traversal(value)
    )


def region_bound(region: sympy.Basic, is_tensor: Callable[[sympy.Basic], bool]) -> tuple[sympy.Expr, sympy.Expr] | None:
    """For a region ``u > a``, ``u <= a`` (...), ``|u| <= a`` or ``|u| > a`` with ``a`` free of tensors:
    ``u`` and a point inside the region; else None."""
    region = sympy.simplify_logic(region) if isinstance(region, sympy.And) else region
    if isinstance(region, sympy.Not) and isinstance(region.args[0], sympy.core.relational.Relational):
        region = region.args[0].negated
    if not isinstance(region, (sympy.StrictGreaterThan, sympy.GreaterThan, sympy.StrictLessThan, sympy.LessThan)):
        return None
    lhs, rhs = region.lhs, region.rhs
    if not is_tensor(lhs):
        lhs, rhs, region = rhs, lhs, region.reversed
    if not is_tensor(lhs) or is_tensor(rhs):
        return None
    upward = isinstance(region, (sympy.StrictGreaterThan, sympy.GreaterThan))
    if isinstance(lhs, sympy.Abs):  # |u| > a holds at u = |a| + 1, |u| <= a (if anywhere) at u = 0
        return lhs.args[0], sympy.Abs(rhs) + 1 if upward else sympy.S.Zero
    return lhs, rhs + 1 if upward else rhs - 1


def guard_value(value: sympy.Expr, region: sympy.Basic, is_tensor: Callable[[sympy.Basic], bool]) -> sympy.Expr:
    """``value`` with its input kept inside ``region`` where its functions need that (and it can be
    done: the region bounds one expression that ``value`` contains)."""
    if not needs_guard(value, is_tensor):
        return value
    bound = region_bound(region, is_tensor)
    if bound is None:
        return value
    u, inside = bound
    kept = within(u, region, inside)
    placeholder = sympy.Dummy(real=True)
    rest = value.xreplace({u: placeholder, -u: -placeholder})
    if rest == value or not needs_guard(rest, lambda e: e.has(placeholder) or is_tensor(e)):
        return value  # no u in value, or nothing grows with u: u alone is finite wherever it is computed
    return value.xreplace({u: kept, -u: -kept})


def guard_branches(expr: sympy.Expr, scalars: set[sympy.Symbol] | frozenset[sympy.Symbol]) -> sympy.Expr:
    """``expr`` with each Piecewise branch, and each factor a step multiplies, kept inside its region.
    Every symbol but ``scalars`` is a tensor."""

    def is_tensor(e: sympy.Basic) -> bool:
        return bool(e.free_symbols - scalars)

    def piecewise(node: sympy.Piecewise) -> sympy.Piecewise:
        pairs, previous = [], []
        for value, cond in node.args:
            region = sympy.And(cond, *[sympy.Not(c) for c in previous]) if previous else cond
            previous.append(cond)
            pairs.append((guard_value(value, region, is_tensor) if is_tensor(region) else value, cond))
        return sympy.Piecewise(*pairs)

    def step_product(node: sympy.Mul) -> sympy.Expr:
        steps = [f for f in node.args if _is_step(f) and is_tensor(f)]
        if len(steps) != 1:
            return node
        rest = sympy.Mul(*[f for f in node.args if f is not steps[0]])
        return steps[0] * guard_value(rest, step_relational(steps[0]), is_tensor)

    def visit(node: sympy.Basic) -> sympy.Basic:
        if node.is_Atom or not node.args:
            return node
        args = tuple(visit(a) for a in node.args)
        node = node.func(*args) if args != node.args else node
        if isinstance(node, sympy.Piecewise):
            return piecewise(node)
        if isinstance(node, sympy.Mul):
            return step_product(node)
        return node

    return visit(expr)


def _is_step(expr: sympy.Basic) -> bool:
    return (isinstance(expr, sympy.Heaviside) and expr.args[1] in (0, 1)) or is_indicator(expr)


def is_indicator(expr: sympy.Basic) -> bool:
    """``Piecewise((1, condition), (0, True))``: a step on a condition, e.g. a saved mask."""
    return (
        isinstance(expr, sympy.Piecewise)
        and len(expr.args) == 2
        and expr.args[0].expr == 1
        and expr.args[1].expr == 0
        and expr.args[1].cond is sympy.true
    )


def step_relational(step: sympy.Heaviside | sympy.Piecewise) -> sympy.Basic:
    """Where a step (a Heaviside with value 0 or 1 at 0, or an indicator) is 1: ``x > 0``, ``x < 1``, ``x >= 0``."""
    if isinstance(step, sympy.Piecewise):  # an indicator: 1 where its condition holds
        return step.args[0].cond
    arg, at_zero = step.args
    constant, terms = arg.as_coeff_add()
    lhs, rhs = sympy.Add(*terms), -constant  # x - 1 > 0 reads better as x > 1
    if lhs.could_extract_minus_sign():
        return (sympy.Le if at_zero == 1 else sympy.Lt)(-lhs, -rhs, evaluate=False)
    return (sympy.Ge if at_zero == 1 else sympy.Gt)(lhs, rhs, evaluate=False)


def pair_powers(exprs: list[sympy.Expr], names: Iterator[sympy.Symbol], quotients: Replacements) -> list[sympy.Expr]:
    """``exprs`` with each product ``a**n * b**-m`` (n, m >= 2) written ``q**k * a**(n-k) * b**(k-m)``,
    k = min(n, m), ``q`` a new temporary for ``a / b`` (appended to ``quotients``): ``(sigma/r)**12`` is
    1 at sigma = r = 1e4, while sigma**12 and r**-12 are inf and 0 in float32. Each ``b`` is paired with
    the largest ``a`` it contains, else with the highest power."""
    known: dict[tuple[sympy.Expr, sympy.Expr], sympy.Symbol] = {}

    def powers(factors: tuple[sympy.Expr, ...], sign: int) -> list[sympy.Pow]:
        found = [f for f in factors if f.is_Pow and f.exp.is_Integer and sign * f.exp >= 2 and f.base.free_symbols]
        return sorted(found, key=lambda f: (-sign * f.exp, sympy.default_sort_key(f)))

    def visit(node: sympy.Expr) -> sympy.Expr:
        if node.is_Atom:
            return node
        args = tuple(visit(a) for a in node.args)
        node = node.func(*args) if args != node.args else node
        if not node.is_Mul:
            return node
        factors = list(node.args)
        ups = powers(node.args, 1)
        for down in powers(node.args, -1):
            if not ups:
                break
            # The base that the denominator is made of, the largest first: x**2*w**2/hypot(w, eps)**2 as
            # x**2*(w/hypot(w, eps))**2, 1 where w = (x*y)**3 is 1e24 and w**2 overflows float32.
            up = min(ups, key=lambda u: (not down.base.has(u.base), -sympy.count_ops(u.base)))
            ups.remove(up)
            k = min(up.exp, -down.exp)
            key = (up.base, down.base)
            if key not in known:
                known[key] = next(names)
                quotients.append((known[key], up.base / down.base))
            factors.remove(up)
            factors.remove(down)
            factors += [known[key] ** k, up.base ** (up.exp - k), down.base ** (down.exp + k)]
        return sympy.Mul(*factors)

    return [visit(e) for e in exprs]


def scaled_sums(
    exprs: list[sympy.Expr], scalars: frozenset[sympy.Symbol], names: Iterator[sympy.Symbol], sums: Replacements
) -> list[sympy.Expr]:
    """``exprs`` with a linear sum of tensors that appears in several numeric multiples computed once: sympy
    distributes ``-2*(input - target)`` into ``-2*input + 2*target``, three tensor operations where one
    multiply of ``input - target`` does, and ``cse`` does not see that they share a sum. Each such sum
    becomes a new temporary (appended to ``sums``), each multiple ``c*temporary``."""

    def linear_term(term: sympy.Basic) -> bool:
        """Numbers and scalars (``1/beta``), times at most one tensor: nothing that could overflow, and
        nothing another lowering rewrites (xexpy, a branch's guarded input)."""
        factors = term.args if term.is_Mul else (term,)
        tensors = [f for f in factors if f.free_symbols - scalars]
        return len(tensors) <= 1 and all(f.is_Symbol for f in tensors)

    def tensor_sum(node: sympy.Basic) -> bool:
        return (
            node.is_Add
            and sum(1 for a in node.args if a.free_symbols - scalars) >= 2
            and all(linear_term(a) for a in node.args)
        )

    def canonical(node: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
        """(c, p) with node = c*p, p's numbers coprime integers and its leading term positive."""
        c, p = node.as_content_primitive()
        if p.could_extract_minus_sign():
            c, p = -c, -p
        return c, p

    seen: dict[sympy.Expr, dict[sympy.Expr, sympy.Expr]] = {}  # p -> {node: c}
    for expr in exprs:
        for node in sympy.preorder_traversal(expr):
            if tensor_sum(node):
                c, p = canonical(node)
                seen.setdefault(p, {})[node] = c
    replacements: dict[sympy.Expr, sympy.Expr] = {}
    for p, multiples in seen.items():
        if len(multiples) < 2:
            continue  # one form only: cse shares it if it repeats
        # the temporary is the multiple written with coefficient 1 where there is one, else p itself
        base, scale = next(((n, c) for n, c in multiples.items() if abs(c) == 1), (p, sympy.S.One))
        temporary = next(names)
        sums.append((temporary, base))
        for node, c in multiples.items():
            replacements[node] = (c / scale) * temporary
    return [e.xreplace(replacements) for e in exprs] if replacements else exprs


def products_with_exp(
    exprs: list[sympy.Expr], names: Iterator[sympy.Symbol], definitions: Replacements
) -> list[sympy.Expr]:
    """``exprs`` with each ``xexpy(x, y)`` written ``x * finite_at_zero(e, x)``, ``e`` a new temporary for
    ``exp(y)`` (appended to ``definitions``), so that exp(y) is computed once."""
    known: dict[sympy.Expr, sympy.Symbol] = {}

    def expand(node: stable.xexpy) -> sympy.Expr:
        x, y = node.args
        if y not in known:
            known[y] = next(names)
            definitions.append((known[y], sympy.exp(y)))
        return x * stable.finite_at_zero(known[y], x)

    return [e.replace(lambda n: isinstance(n, stable.xexpy), expand) for e in exprs]


def tanh_softplus_in_sigmoids(exprs: list[sympy.Expr], eager: bool = False) -> list[sympy.Expr]:
    """``exprs`` with each ``tanh_softplus(x)`` in its sigmoid form (:class:`.stable.tanh_softplus`); in
    ``eager`` code ``mish(x)`` too, as ``x * tanh_softplus(x)``: PyTorch's mish costs ten multiplies on a
    CPU, two sigmoids' worth (4M float32 elements, one thread: 130 ms against 60 ms)."""
    if eager:
        exprs = [
            e.replace(lambda n: isinstance(n, stable.mish), lambda n: n.args[0] * stable.tanh_softplus(n.args[0]))
            for e in exprs
        ]
    return [e.replace(lambda n: isinstance(n, stable.tanh_softplus), lambda n: n.expanded(*n.args)) for e in exprs]


def one_logarithm_of_odds(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each sum's pair of terms ``c*log(a) - c*log1p(b)``, where ``a`` is ``u`` and ``b`` is
    ``-u`` (each as it stands or as the guarded argument of an xlogy / xlog1py derivative,
    :class:`.stable.log_argument`), written ``c*log(a / (1 + b))``, or ``c*logit(u)`` where neither is
    guarded: the log-odds of ``u``, one logarithm where there were two (binary cross-entropy's gradient in
    its target; its fwd+bwd in CPU time, 4M float32 elements, one thread: 81 to 85 ms against 87 ms,
    plain autograd's 51 to 57 ms).

    Exact wherever the two logarithms are: both defined means ``0 <= u <= 1``, so ``a`` lies in [0, 1] and
    ``1 + b`` is 0 or at least half an ulp of 1 (2**-24 in float32; a guard's safe values are 1 and 0), and
    the quotient neither overflows (at most 2**24 times ``a``, inf only where ``1 + b`` is 0, as the log-odds
    is) nor underflows (at least ``a``); one rounding, not two logarithms' cancelling. Outside [0, 1] both
    forms are nan."""
    if not expr.has(log1p):
        return expr
    return expr.replace(lambda n: n.is_Add, _odds_in_sum)


def _odds_in_sum(total: sympy.Add) -> sympy.Expr:
    logs = [(t, *_split(t, sympy.log)) for t in total.args]
    log1ps = [(t, *_split(t, log1p)) for t in total.args]
    terms = list(total.args)
    for term, c, a in ((t, c, a) for t, c, a in logs if a is not None):
        for other, k, b in ((t, k, b) for t, k, b in log1ps if b is not None and t in terms):
            if term in terms and _odds_pair(a, b) and sympy.expand(c + k) == 0:
                terms.remove(term)
                terms.remove(other)
                plain = a == -b  # neither guarded: PyTorch's logit, one kernel
                terms.append(c * (stable.logit(a) if plain else sympy.log(a / (1 + b))))
    return sympy.Add(*terms) if len(terms) < len(total.args) else total


def _split(term: sympy.Expr, kind: type) -> tuple[sympy.Expr, sympy.Expr | None]:
    """``term`` as ``c * kind(argument)``: (c, argument), or (term, None) where it has no one such factor."""
    found = [f for f in sympy.Mul.make_args(term) if isinstance(f, kind)]
    if len(found) != 1:
        return term, None
    return term / found[0], found[0].args[0]


def _odds_pair(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether ``log(a)`` and ``log1p(b)`` are the logarithms of ``u`` and ``1 - u`` for one ``u``."""
    if isinstance(a, stable.log_argument):
        if a.args[:2] != (0, 1):
            return False
        a = a.args[2]
    if isinstance(b, stable.log_argument):
        if b.args[:2] != (-1, 0):
            return False
        b = b.args[2]
    return sympy.expand(a + b) == 0


def guarded_sums(exprs: list[sympy.Expr], names: Iterator[sympy.Symbol], definitions: Replacements) -> list[sympy.Expr]:
    """``exprs`` with each ``1 + log_argument(-1, 0, y, x)`` written ``log_argument(0, 1, t, x)``, ``t`` a new
    temporary for ``1 + y`` (appended to ``definitions``; the guard reads it twice), where ``exprs`` read that
    guarded argument only so (no ``log1p`` of it remains): binary cross-entropy's ``1 - p`` guarded where
    ``p = 1`` and ``y = 1``, as the denominator of its log-odds and of its gradient in ``p``.

    Exact: ``1 + y`` is 0 where ``y`` is -1 and nowhere else (near -1 the sum is exact), and where the guard
    holds both are 1. A test against 0 is the cheaper one (:meth:`.printing.TorchPrinter._print_log_argument`),
    and ``1 + y`` is computed once, where today's form negated, guarded, then added 1."""
    sums = {
        node: argument
        for e in exprs
        for node in sympy.preorder_traversal(e)
        if node.is_Add and len(node.args) == 2 and sympy.S.One in node.args
        for argument in node.args
        if isinstance(argument, stable.log_argument) and argument.args[:2] == (-1, 0)
    }
    if not sums:
        return exprs
    replaced = [e.xreplace({node: sympy.Dummy() for node in sums}) for e in exprs]
    still_read = {n for e in replaced for n in sympy.preorder_traversal(e) if isinstance(n, stable.log_argument)}
    replacements = {}
    for node, argument in sorted(sums.items(), key=lambda item: sympy.default_sort_key(item[0])):
        if argument in still_read:
            continue
        _, _, y, x = argument.args
        total = next(names)
        definitions.append((total, 1 + y))
        replacements[node] = stable.log_argument(0, 1, total, x)
    return [e.xreplace(replacements) for e in exprs] if replacements else exprs


def negated_weights(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each ``-xlogy(x, y)`` (and ``xlog1py``) whose weight ``x`` is a sum with a number term
    written ``xlogy(-x, y)``: ``-(1 - y) * log1p(-p)`` as ``(y - 1) * log1p(-p)``, one negation fewer (binary
    cross-entropy's forward). Exact: negation is, and the weight is 0 where its negation is."""

    def negated(node: sympy.Mul) -> sympy.Expr:
        coefficient, rest = node.as_coeff_Mul()
        if coefficient != -1 or not isinstance(rest, (stable.xlogy, stable.xlog1py)):
            return node
        x, y = rest.args
        if not (x.is_Add and any(t.is_Number for t in x.args)):
            return node
        return type(rest)(-x, y)

    if not expr.has(stable.xlogy, stable.xlog1py):
        return expr
    return expr.replace(lambda n: n.is_Mul, negated)
