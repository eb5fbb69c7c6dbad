"""The checks of ``scaffold check``, one method per check id of :data:`scaffold.check.CHECKS`.

A :class:`FunctionChecks` holds the generated test file's :class:`~scaffold.testing.OpTests` with the user's
callable in it (``tests``), and the :class:`~scaffold.check.Subject`. Each ``check_ID(device)`` returns
nothing when the Function holds, raises AssertionError (a failure), ``_Soft`` (a warning unless --strict) or
pytest's skip; :meth:`FunctionChecks.run` turns that into a :class:`~scaffold.check.Verdict`, with the
smallest shapes that show a failure. The messages say what the Function does wrong in the words of the
Function rules, and how to fix it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator, Sequence

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError, gradcheck, gradgradcheck
from torch.utils._python_dispatch import TorchDispatchMode

from .check import SHRUNK, Subject, Verdict, _Note, _Soft, smallest_shapes
from .testing import CLOSE, SECOND_SHAPE_CLOSE, _as_tuple, _quiet_torch

#: How many characters of a torch error a verdict quotes.
QUOTE = 300


class _Running:
    """Running one check into a verdict, and shrinking a failure to the smallest shapes that show it."""

    def run(self, check: str, device: str = "cpu") -> Verdict:
        """One check's verdict on ``device``."""
        method = getattr(self, f"check_{check}")
        with _quiet_torch():
            try:
                method(device)
            except pytest.skip.Exception as exc:
                return Verdict(check, "skip", str(exc.msg))
            except _Soft as exc:
                return Verdict(check, "warn", str(exc))
            except _Note as exc:
                return Verdict(check, "pass", str(exc))
            except (AssertionError, pytest.fail.Exception, Exception) as exc:  # a failure, or what the Function raised
                message = _message(exc, self)
                example = self._smallest_example(check, device) if check in SHRUNK else ""
                return Verdict(check, "fail", message, example)
        return Verdict(check, "pass")

    def assert_holds(self, check: str, device: str = "cpu", strict: bool = False) -> None:
        """For a generated test file: fail the test where the check fails (or warns, under ``strict``), skip it
        where the check does not apply, and issue a warning where it warns."""
        verdict = self.run(check, device)
        text = f"{verdict.message}\n{verdict.example}".strip()
        if verdict.status == "skip":
            pytest.skip(text)
        if verdict.status == "fail" or (strict and verdict.status == "warn"):
            pytest.fail(f"{check}: {text}", pytrace=False)
        if verdict.status == "warn":
            import warnings

            warnings.warn(f"{check}: {text}", stacklevel=2)

    def _smallest_example(self, check: str, device: str) -> str:
        """The fewest elements at which ``check`` still fails (the reference finite there), with the inputs."""
        base = self._second_shapes() if check == "second_shape" else None
        base = base or [i.shape for i in self.tests.inputs]
        at = getattr(self, f"_{check}_at")
        for shapes in smallest_shapes(base):
            try:
                inputs = self.tests.make_inputs(device, shapes=shapes)
                if not self._reference_finite(inputs):
                    continue
            except Exception:  # the math does not hold at these shapes (a reshape): not a candidate
                continue
            try:
                at(inputs)
            except Exception:  # noqa: BLE001 - it fails here: the smallest
                return _describe(self.tests.inputs, inputs)
            if list(shapes) == list(base):
                break
        return ""

    def _reference_finite(self, inputs: Sequence[torch.Tensor]) -> bool:
        xs = [x.detach().clone().requires_grad_() for x in inputs]
        outs = self.tests._outputs(self.tests.reference(*xs, *self.tests._scalars))
        grads = torch.autograd.grad(_sum(outs), xs, allow_unused=True)
        return all(bool(torch.isfinite(t).all()) for t in [*outs, *(g for g in grads if g is not None)])


class _Calls:
    """The user's callable and the math, called on tensors: what every check reads."""

    @property
    def _scalars(self) -> tuple[object, ...]:
        return self.tests._scalars

    @property
    def _names(self) -> list[str]:
        return self.tests._names

    def _outputs(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The spec's outputs of the user's call, with what forward raised said as such."""
        try:
            value = self.tests.op(*inputs, *self._scalars)
        except Exception as exc:
            hint = _order_hint(exc, self)
            raise _RaisedError(f"forward raised {type(exc).__name__}: {_quote(exc)}{hint}") from None
        outs = _as_tuple(value)
        if len(outs) != max(1, len(self.tests.outputs)) or not all(isinstance(o, torch.Tensor) for o in outs):
            raise AssertionError(
                f"forward returned {_kinds(value)}, the math has {max(1, len(self.tests.outputs))} tensor output(s)"
            )
        return outs

    def _gradients(self, outs, inputs, upstream, **kwargs) -> tuple[torch.Tensor | None, ...]:
        """The user's backward, with what it raised said as such."""
        try:
            return torch.autograd.grad(outs, inputs, upstream, allow_unused=True, **kwargs)
        except Exception as exc:
            raise _RaisedError(_backward_error(exc, self)) from None

    def _upstream(self, outs: Sequence[torch.Tensor], seed: int = 1) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return [torch.randn(o.shape, generator=generator, dtype=o.dtype).to(o.device) for o in outs]

    def _node(self, inputs: Sequence[torch.Tensor]):
        """The autograd node of the user's Function in this call's graph (its ctx), or skip: the target is not
        (or does not call) an autograd.Function."""
        outs = self._outputs(inputs)
        node = outs[0].grad_fn
        seen = set()
        while node is not None and not isinstance(node, torch.autograd.function.BackwardCFunction):
            seen.add(node)  # a wrapper's own ops (a Module's reshape) before the Function's node
            parents = [n for n, _ in node.next_functions if n is not None and n not in seen]
            node = parents[0] if parents else None
        if node is None:
            pytest.skip("not an autograd.Function: its result comes from PyTorch's own ops, which follow these rules")
        return outs, node


class _ValueChecks:
    """Values and gradients against the math: at the example, finite differences, a second shape, extreme inputs."""

    def check_forward(self, device: str) -> None:
        self._forward_at(self.tests.make_inputs(device))

    def _forward_at(self, inputs: Sequence[torch.Tensor], close: dict = CLOSE) -> None:
        expected, _, _ = self._expected(inputs)
        outs = self._outputs(inputs)
        for what, out, exp in zip(self.tests._value_names, outs, expected):
            _assert_close(out, exp, f"forward's {what}", close)

    def check_gradients(self, device: str) -> None:
        self._gradients_at(self.tests.make_inputs(device))

    def _gradients_at(self, inputs: Sequence[torch.Tensor], close: dict = CLOSE) -> None:
        expected, upstream, expected_grads = self._expected(inputs)
        outs = self._outputs(inputs)
        for what, out, exp in zip(self.tests._value_names, outs, expected):
            if out.shape != exp.shape:
                raise AssertionError(f"forward's {what} has shape {tuple(out.shape)}, the math's {tuple(exp.shape)}")
        grads = self._gradients(outs, inputs, upstream)
        for name, x, grad, exp in zip(self._names, inputs, grads, expected_grads):
            if grad is None and not exp.any():
                continue  # None is autograd's zero
            if grad is None:
                raise AssertionError(
                    f"backward returned None for {name}, whose gradient is needed and not zero (where the math "
                    f'should not be differentiated in {name}, say so in the spec: [gradients] {name} = "0")'
                )
            if grad.shape != x.shape:
                raise AssertionError(f"the gradient of {name} has shape {tuple(grad.shape)}, {name} {tuple(x.shape)}")
            _assert_close(grad, exp, f"the gradient of {name}", close)

    def _expected(self, inputs: Sequence[torch.Tensor]) -> tuple[list, list, list]:
        """The math's values, a random upstream gradient and the math's gradients for it, at ``inputs``: before
        the user's call, which may change them."""
        xs = [x.detach().clone().requires_grad_() for x in inputs]
        outs = self.tests._outputs(self.tests.reference(*xs, *self._scalars))
        upstream = self._upstream(outs)
        grads = self.tests._expected_grads(outs, xs, upstream)
        return [o.detach() for o in outs], upstream, [g.detach() for g in grads]

    def check_gradcheck(self, device: str) -> None:
        self._gradcheck_at(self.tests.make_inputs(device))

    def _gradcheck_at(self, inputs: Sequence[torch.Tensor]) -> None:
        if all(i.name in self.tests.gradients for i in self.tests.inputs):
            pytest.skip("every tensor has a custom gradient: the gradients check compares them with their formulas")
        inputs = self.tests._without_custom_gradients(list(inputs))
        try:
            gradcheck(self.tests._float_outputs, (*inputs, *self._scalars))
        except GradcheckError as exc:
            raise AssertionError(
                f"backward disagrees with finite differences: {_gradcheck_summary(exc, self._names)}"
            ) from None

    def check_gradgradcheck(self, device: str) -> None:
        """Warn "not twice differentiable" where backward's result carries no graph, or its derivative is off."""
        inputs = self.tests.make_inputs(device)
        outs = self._outputs(inputs)
        upstream = [u.requires_grad_() for u in self._upstream(outs)]  # relu's gradient is linear in it alone
        grads = self._gradients(outs, inputs, upstream, create_graph=True)
        if not any(g is not None and g.requires_grad for g in grads):
            raise _Soft(
                "not twice differentiable: backward's gradients carry no graph (computed under no_grad, from "
                ".detach() or .data, or by a backward marked once_differentiable); a second derivative "
                "(gradgradcheck, torch.func.hessian, a gradient penalty) raises"
            )
        # A custom gradient's own derivative, where backward returns one (None: zero, as its formula "0" says);
        # then gradgradcheck over the other tensors, at their own shapes (the generated tests broadcast an
        # elementwise op's: a 0-d beta stays 0-d here).
        returned = {i.name for i, g in zip(self.tests.inputs, grads) if g is not None}
        custom = {n: f for n, f in self.tests.gradients.items() if n in returned}
        tests = dataclasses.replace(self.tests, elementwise=False, gradients=custom)
        try:
            tests._assert_custom_double_backward(self.tests.make_inputs(device))
            if any(i.name not in self.tests.gradients for i in self.tests.inputs):
                differentiated = self.tests._without_custom_gradients(self.tests.make_inputs(device))
                gradgradcheck(self.tests._float_outputs, (*differentiated, *self._scalars))
        except GradcheckError as exc:
            off = _gradcheck_summary(exc, self._names)
            raise _Soft(
                f"not twice differentiable: the derivative of backward disagrees with finite differences ({off}); "
                "backward probably reads a tensor computed in forward (no graph back to the inputs) or changes one "
                "in place: compute it in backward from the saved inputs"
            ) from None
        except Exception as exc:
            raise _Soft(
                f"not twice differentiable: the second derivative raised {type(exc).__name__}: {_quote(exc)}"
            ) from None

    def _second_shapes(self) -> list[tuple[int, ...]]:
        """The generated tests' second shapes, but a 0-d tensor stays 0-d: a hand-written Function may take
        its parameter as one number (Swish's beta), and the spec declares it so."""
        return [i.shape if i.shape == () else (i.second_shape or i.shape) for i in self.tests.inputs]

    def check_second_shape(self, device: str) -> None:
        """The second shape; where the Function raises there, the same sizes without the batch dimension
        (which must hold), and a warning that it takes no batch dimension although the math does."""
        shapes = self._second_shapes()
        if shapes == [i.shape for i in self.tests.inputs]:
            pytest.skip("the math takes no other shape than the example's")
        inputs = self.tests.make_inputs(device, shapes=shapes)
        try:
            self._outputs([x.detach() for x in inputs])
        except _RaisedError as exc:  # forward refuses the rank: the sizes must hold without the batch dimension
            unbatched = [s[1:] if len(s) == len(i.shape) + 1 else s for s, i in zip(shapes, self.tests.inputs)]
            if unbatched == shapes:
                raise
            self._second_shape_at(self.tests.make_inputs(device, shapes=unbatched))
            raise _Soft(f"takes no batch dimension more, which the math does (other sizes pass): {exc}") from None
        self._second_shape_at(inputs)

    def _second_shape_at(self, inputs: Sequence[torch.Tensor]) -> None:
        self._forward_at(inputs, SECOND_SHAPE_CLOSE)
        self._gradients_at(inputs, SECOND_SHAPE_CLOSE)

    def check_extreme_inputs(self, device: str) -> None:
        """float32 at large and tiny inputs inside the domain against scaffold's derived op in float64 (stable
        where the forward as written overflows), as the generated tests hold a generated op: no inf or nan
        where the math is finite, no digits lost beyond the math's own conditioning or plain autograd's."""
        user, derived = self.tests.op, self.derived.op

        def by_dtype(*args: object) -> object:
            return (derived if args[0].dtype == torch.float64 else user)(*args)

        # whole tensors at their declared shapes, every element drawn from its extremes (not an elementwise op's
        # columns, which would change a parameter's rank)
        dataclasses.replace(self.tests, op=by_dtype, elementwise=False).check_extreme_inputs(device)


class _RuleChecks:
    """The Function's rules: needs_input_grad, ctx, a second backward, inputs left as they were."""

    def check_needs_input_grad(self, device: str) -> None:
        """With one tensor needing a gradient at a time: None for each other (autograd throws them away: the
        work was wasted), and no more operations than with every gradient needed."""
        names = self._names
        if len(names) < 2:
            pytest.skip("one tensor argument: its gradient is always the one needed")
        everything = self._backward_operations(self.tests.make_inputs(device), None)
        wasted = []
        for index, name in enumerate(names):
            inputs = self.tests.make_inputs(device, requires_grad=False)
            inputs[index].requires_grad_(True)
            returned, count = self._backward_operations(inputs, index)
            if returned[index] is None and self._expected(inputs)[2][index].any():
                raise AssertionError(f"backward returned None for {name}, whose gradient is needed and not zero")
            extra = [names[i] for i, g in enumerate(returned[: len(names)]) if g is not None and i != index]
            if extra:
                wasted.append(f"computes the gradient of {', '.join(extra)} when only {name}'s is needed")
            if count > everything[1]:
                raise AssertionError(
                    f"backward runs {count} tensor operations when only {name}'s gradient is needed, more than the "
                    f"{everything[1]} it runs for every gradient"
                )
        if wasted:
            raise _Soft(
                "backward ignores ctx.needs_input_grad: it "
                + "; ".join(wasted)
                + " (autograd throws those away: test ctx.needs_input_grad[i] before computing each)"
            )

    def _backward_operations(self, inputs: list[torch.Tensor], index: int | None) -> tuple[list, int]:
        """What the Function's backward returned (one value per forward argument), and how many tensor
        operations the whole backward ran."""
        outs, node = self._node(inputs)
        if node is not outs[0].grad_fn or len(node.next_functions) != len(inputs):
            pytest.skip(
                "the Function is called inside a wrapper, not on the spec's tensors: which inputs it needs "
                "gradients for is the wrapper's business"
            )
        returned: list = []
        node.register_hook(lambda grad_inputs, grad_outputs: returned.extend(grad_inputs))
        wanted = [x for x in inputs if x.requires_grad]
        with _Counting() as counter:
            self._gradients(outs, wanted, self._upstream(outs))
        return returned, counter.count

    def check_ctx(self, device: str) -> None:
        """Tensors through one save_for_backward, none as ctx attributes (the wrong number of values from
        backward, or a gradient for a non-tensor, fails every check that runs backward, in these words)."""
        inputs = self.tests.make_inputs(device)
        with _counting_saves() as saves:
            outs, node = self._node(inputs)
        if saves.get(id(node), 0) > 1:
            raise AssertionError(
                f"forward calls ctx.save_for_backward {saves[id(node)]} times: each call replaces the tensors the "
                "one before saved, so backward reads only the last ones; save every tensor in one call"
            )
        held = _tensor_attributes(node)
        ours = {id(t) for t in [*inputs, *outs]}
        arguments = [n for n, values in held.items() if any(id(v) in ours for v in values)]
        if arguments:
            raise AssertionError(
                f"forward keeps its inputs or outputs as ctx attributes ({', '.join(f'ctx.{n}' for n in arguments)}): "
                "save them with ctx.save_for_backward(...) and read ctx.saved_tensors (an attribute skips autograd's "
                "check that they are unchanged when backward runs, and an output on ctx is a reference cycle that "
                "keeps the graph alive)"
            )
        if held:
            raise _Soft(
                f"forward keeps tensors as ctx attributes ({', '.join(f'ctx.{n}' for n in held)}): save them with "
                "ctx.save_for_backward(...) (an attribute skips autograd's check that they are unchanged when "
                "backward runs, and outlives backward)"
            )
        self._gradients(outs, inputs, self._upstream(outs))

    def check_retain_graph(self, device: str) -> None:
        self._retain_graph_at(self.tests.make_inputs(device))

    def _retain_graph_at(self, inputs: Sequence[torch.Tensor]) -> None:
        outs = self._outputs(inputs)
        upstream = self._upstream(outs)
        saved = _saved(outs[0].grad_fn)
        copies = [t.detach().clone() for t in saved]
        first = self._gradients(outs, inputs, upstream, retain_graph=True)
        changed = [i for i, (t, copy) in enumerate(zip(saved, copies)) if not _same(t.detach(), copy)]
        which = f" (ctx.saved_tensors[{changed[0]}])" if changed else ""
        try:
            second = torch.autograd.grad(outs, inputs, upstream, allow_unused=True)
        except RuntimeError as exc:
            why = "autograd's version check" if "inplace operation" in str(exc) else _quote(exc)
            raise AssertionError(
                f"backward changes a saved tensor in place{which}: a second backward (retain_graph=True) raises "
                f"({why}); compute into new tensors (out of place)"
            ) from None
        for name, a, b in zip(self._names, first, second):
            if a is not None and b is not None and not torch.equal(a, b):
                gap = (a - b).abs().max().item()
                raise AssertionError(
                    f"backward changes a saved tensor in place{which}: a second backward (retain_graph=True) "
                    f"differs by {gap:.1e} in the gradient of {name}; compute into new tensors (out of place)"
                )

    def check_inputs_unchanged(self, device: str) -> None:
        self._inputs_unchanged_at(self.tests.make_inputs(device))

    def _inputs_unchanged_at(self, inputs: Sequence[torch.Tensor]) -> None:
        before = [x.detach().clone() for x in inputs]
        outs = self._outputs(inputs)
        for name, x, b in zip(self._names, inputs, before):
            if not _same(x.detach(), b):
                raise AssertionError(
                    f"forward changes its input {name} in place: the caller's tensor is overwritten (compute out "
                    "of place, or mark it with ctx.mark_dirty and return it)"
                )
        upstream = self._upstream(outs)
        kept = [u.clone() for u in upstream]
        self._gradients(outs, inputs, upstream)
        for name, x, b in zip(self._names, inputs, before):
            if not _same(x.detach(), b):
                raise AssertionError(f"backward changes the input {name} in place: the caller's tensor is overwritten")
        for u, k in zip(upstream, kept):
            if not _same(u, k):
                raise AssertionError(
                    "backward changes grad_output in place: autograd may pass the same tensor to other nodes "
                    "(compute into a new tensor)"
                )


class _EcosystemChecks:
    """The Function inside PyTorch: torch.compile and torch.func."""

    def check_compile(self, device: str) -> None:
        """torch.compile (graph breaks allowed) gives eager's values and gradients."""
        from .testing import COMPILE_BACKEND, _skip_without_backend

        _skip_without_backend(device)
        torch.compiler.reset()
        inputs = self.tests.make_inputs(device)
        compiled = torch.compile(self.tests.op, backend=COMPILE_BACKEND, dynamic=False)
        results = []
        for call in (compiled, self.tests.op):  # each on its own copies: a Function may change its inputs
            xs = [x.detach().clone().requires_grad_() for x in inputs]
            try:
                outs = self.tests._outputs(call(*xs, *self._scalars))
                grads = torch.autograd.grad(_sum(outs), xs, allow_unused=True)
            except Exception as exc:
                if call is self.tests.op:
                    raise
                raise AssertionError(f"torch.compile of it raised {type(exc).__name__}: {_quote(exc)}") from None
            results.append([*outs, *grads])
        names = [
            *(f"torch.compile's {v}" for v in self.tests._value_names),
            *(f"torch.compile's gradient of {n}" for n in self._names),
        ]
        for what, compiled_value, eager in zip(names, *results):
            if compiled_value is not None and eager is not None:
                _assert_close(compiled_value, eager.detach(), what, CLOSE)

    def check_torch_func(self, device: str) -> None:
        """torch.func.grad (and vmap, and jvp, where the Function supports them) against the math; what it does
        not support is said in the verdict, not failed."""
        from .testing import _total

        inputs = self.tests.make_inputs(device, requires_grad=False)
        argnums = tuple(range(len(inputs)))
        try:
            grads = torch.func.grad(lambda *xs: _total(self.tests._outputs(self.tests._op_of_tensors(*xs))), argnums)(
                *inputs
            )
        except RuntimeError as exc:
            if "setup_context" in str(exc):
                pytest.skip(
                    "torch.func cannot run it: forward takes ctx (write forward(*args) and a staticmethod "
                    "setup_context(ctx, inputs, output) to use it under torch.func)"
                )
            raise AssertionError(f"torch.func.grad of it raised {type(exc).__name__}: {_quote(exc)}") from None
        xs = [x.detach().requires_grad_() for x in inputs]
        expected = self.tests._expected_grads(self.tests._reference_of_tensors(*xs), xs)
        for name, grad, exp in zip(self._names, grads, expected):
            _assert_close(grad, exp, f"torch.func.grad's gradient of {name}", CLOSE)
        unsupported = []
        try:
            self.tests.check_vmap_and_func_grad()
        except RuntimeError as exc:
            if "does not have vmap support" not in str(exc):
                raise AssertionError(f"torch.func.vmap of it raised {type(exc).__name__}: {_quote(exc)}") from None
            unsupported.append("vmap (set generate_vmap_rule = True, or write a vmap staticmethod)")
        function = self.subject.function
        if function is not None and "jvp" not in vars(function):
            unsupported.append("jvp (no jvp staticmethod: forward mode raises)")
        else:
            self.tests.check_forward_mode(device)
        if unsupported:
            raise _Note(f"torch.func.grad passes; not supported: {'; '.join(unsupported)}")


class FunctionChecks(_Running, _ValueChecks, _RuleChecks, _EcosystemChecks, _Calls):
    """The checks of one hand-written Function against the math (see the module docstring)."""

    def __init__(self, tests, subject: Subject, derived) -> None:
        self.tests = tests  # the generated tests' OpTests, the user's callable in place of the op
        self.subject = subject
        self.derived = derived  # the generated tests' OpTests as generated: scaffold's derived op


# --- helpers ---------------------------------------------------------------------------------------------------


class _RaisedError(AssertionError):
    """A failure because the Function raised (not because a value is off)."""


class _Counting(TorchDispatchMode):
    """Counts the tensor operations run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _counting_saves() -> Iterator[dict[int, int]]:
    """How many times each ctx calls save_for_backward while inside."""
    counts: dict[int, int] = {}
    context = torch.autograd.function.FunctionCtx
    original = context.save_for_backward

    def save_for_backward(ctx, *tensors):
        counts[id(ctx)] = counts.get(id(ctx), 0) + 1
        return original(ctx, *tensors)

    context.save_for_backward = save_for_backward
    try:
        yield counts
    finally:
        context.save_for_backward = original


def _tensor_attributes(node) -> dict[str, list[torch.Tensor]]:
    """The ctx attributes holding tensors (alone, or in a list or tuple), by name."""
    held = {}
    for name, value in vars(node).items():
        values = value if isinstance(value, (list, tuple)) else [value]
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        if tensors:
            held[name] = tensors
    return held


def _saved(node) -> list[torch.Tensor]:
    """The tensors a Function's node saved (the same storage as the ones backward reads), where it has any."""
    try:
        return [t for t in node.saved_tensors if isinstance(t, torch.Tensor)]
    except (AttributeError, RuntimeError):
        return []


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _sum(outs: Sequence[torch.Tensor]) -> torch.Tensor:
    return sum(o.sum() for o in outs)


def _assert_close(value: torch.Tensor, expected: torch.Tensor, what: str, close: dict) -> None:
    if value.shape != expected.shape:
        raise AssertionError(f"{what} has shape {tuple(value.shape)}, the math's {tuple(expected.shape)}")
    value = value.detach().to(expected.dtype)
    bad = ~torch.isclose(value, expected, **close, equal_nan=True)
    if bad.any():
        index = tuple(bad.nonzero()[0].tolist())
        at = f" at {list(index)}" if index else ""
        raise AssertionError(
            f"{what} is {value[index].item():.6g}{at}, the math gives {expected[index].item():.6g} "
            f"({int(bad.sum())} of {bad.numel()} elements differ)"
        )


def _describe(inputs, values: Sequence[torch.Tensor]) -> str:
    """``smallest failing input: x = [[0.5, -1.25]] (shape (1, 2)), ...``."""
    parts = []
    for i, x in zip(inputs, values):
        data = x.detach().cpu()
        text = str([round(v, 4) for v in data.flatten().tolist()]) if data.numel() <= 12 else "(drawn as usual)"
        parts.append(f"{i.name} of shape {tuple(data.shape)}: {text}")
    return "smallest failing input: " + "; ".join(parts)


def _message(exc: BaseException, checks: FunctionChecks) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, (AssertionError, pytest.fail.Exception)):
        return text.splitlines()[0] if len(text) > 4 * QUOTE else text
    return _backward_error(exc, checks)


def _quote(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= QUOTE else text[: QUOTE - 3] + "..."


def _kinds(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


def _order_hint(exc: BaseException, checks: FunctionChecks) -> str:
    if not isinstance(exc, TypeError):
        return ""
    names = ", ".join([*checks._names, *checks.tests.scalars])
    return (
        f" (scaffold calls it with the spec's arguments in order: {names}; "
        '--call "CLASS.apply(...)" maps them otherwise)'
    )


def _backward_error(exc: BaseException, checks: FunctionChecks) -> str:
    """What backward raised, in the Function rules' words where autograd says a rule was broken."""
    text = str(exc)
    names = [*checks._names, *checks.tests.scalars]
    count = re.search(r"incorrect number of gradients \(expected (\d+), got (\d+)\)", text)
    if count:
        expected, got = count.groups()
        return (
            f"backward returns {got} values for the {expected} arguments of forward ({', '.join(names)}): return "
            "one per argument, None for each that takes no gradient (a non-tensor, an integer tensor)"
        )
    position = re.search(r"gradient different than None at position (\d+)", text)
    if position:
        name = names[int(position.group(1)) - 1] if int(position.group(1)) <= len(names) else "an argument"
        return f"backward returns a gradient for {name}, which is not a tensor: return None in its place"
    shape = re.search(
        r"invalid gradient at index (\d+) - got \[([^\]]*)\] but expected shape compatible with \[([^\]]*)", text
    )
    if shape:
        index, got, want = shape.groups()
        name = names[int(index)] if int(index) < len(names) else f"argument {index}"
        return (
            f"backward returns a gradient of shape [{got}] for {name} of shape [{want}]: sum it over the "
            f"broadcast dimensions (grad.sum_to_size({name}.shape))"
        )
    return f"backward raised {type(exc).__name__}: {_quote(exc)}"


def _gradcheck_summary(exc: BaseException, names: Sequence[str]) -> str:
    """gradcheck's "Jacobian mismatch for output 0 with respect to input 1" as "d out / d beta"."""
    text = " ".join(str(exc).split())
    found = re.search(r"Jacobian mismatch for output (\d+) with respect to input (\d+)", text)
    if not found:
        return _quote(exc)
    output, index = (int(g) for g in found.groups())
    name = names[index] if index < len(names) else "grad_output"
    return f"d output {output} / d {name} is off"
