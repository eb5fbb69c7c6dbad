"""The checks behind every generated test file: one :class:`OpTests` per op, one method per check.

A generated ``test_NAME.py`` holds only what is specific to its op (the forward as written, in plain torch,
as the reference; each input's shape, range and hard points; the scalars) and one test function per check,
each calling the method of the same name here, so that a user can read it as a specification and edit or
skip one check. What a check does, and why, is written once, below.

This module imports nothing but the standard library, torch and pytest: tests of ops generated outside a
project import it from the installed scaffold (``from scaffold.testing import ...``), and inside a project
scaffold copies it, unchanged, to ``tests/scaffold_testing.py``, so that the project's tests run after the
project's own set-up, without scaffold, and do not change when scaffold is upgraded until ``scaffold
update`` updates the copy.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

__all__ = ["DEVICES", "Input", "OpTests", "device_fixture"]

#: CPU, and CUDA where there is one.
#: The dtype the autocast check runs in, by device type: each device's default for torch.autocast.
AUTOCAST_DTYPES = {"cpu": torch.bfloat16, "cuda": torch.float16}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
#: How close the op and the reference must be in float64: the reference as written cancels where the op does
#: not (1 - sigmoid(20) keeps 8 of float64's 16 digits); a wrong derivative is off by far more.
CLOSE = {"rtol": 1e-6, "atol": 1e-7}
#: At the second shape: what it catches (a dim counted from the wrong end, a gradient not summed over a batch
#: dimension) is wrong by far more; more elements than the example's meet more points where a reference as
#: written cancels (log(1 - sigmoid(v)) at v = 40: 3e-6 off in float64 where the generated op is exact).
SECOND_SHAPE_CLOSE = {"rtol": 1e-4, "atol": 1e-6}
#: Where the reference is 0/0 (x/expm1(x) at x = 0) and its limit is taken as the mean of its values at -1e-4
#: and +1e-4 from the point, which is off by about 1e-8 times its second derivative.
LIMIT_CLOSE = {"rtol": 1e-3, "atol": 1e-4}
#: How far random inputs keep from an input's kinks and poles, where finite differences are meaningless.
AVOID_MARGIN = 0.05
#: The backend of the torch.compile check; aot_eager traces the same graphs as inductor, without its codegen.
COMPILE_BACKEND = os.environ.get("SCAFFOLD_COMPILE_BACKEND", "inductor")


def device_fixture():
    """A ``device`` fixture for a test module (``device = device_fixture()``): each test that takes it runs
    on the CPU and on CUDA, CUDA skipped where there is none. A project's tests/conftest.py defines its own."""

    @pytest.fixture(params=DEVICES, name="device")
    def device(request: pytest.FixtureRequest) -> str:
        return request.param

    return device


def _quietly(check: Callable[..., None]) -> Callable[..., None]:
    """``check`` with torch's own deprecation notices kept out of the user's test output (see
    :func:`_quiet_torch`): a fused op compiles inside forward, torch.func registers decompositions on first
    use."""

    @functools.wraps(check)
    def quiet(*args, **kwargs):
        with _quiet_torch():
            return check(*args, **kwargs)

    return quiet


@dataclass(frozen=True)
class Init:
    """How the Module initialises a learnable input (the spec's ``init``): ``"constant"`` (``args``: the
    value), ``"normal"`` (mean, std), ``"uniform"`` (low, high), ``"kaiming_uniform"``, ``"xavier_uniform"``
    or ``"linear"`` (nn.Linear's: a weight of two or more dimensions kaiming-uniform with a = sqrt(5), bound
    1/sqrt(fan_in); a bias, which names its ``weight``, uniform within 1/sqrt(that weight's fan_in))."""

    scheme: str
    args: tuple[float, ...] = ()
    weight: str = ""


#: How many values of a random init the Module test pools (over calls of reset_parameters) to check it.
INIT_DRAWS = 4096
#: How far the spread of a random init may be from the scheme's (a ratio; 4096 draws: about 2% either way).
SPREAD_TOLERANCE = 0.15
#: The chance the coverage check of a uniform init may fail on a right one (it is seeded, so no flake).
INIT_MISS = 1e-9


@dataclass(frozen=True)
class Input:
    """One tensor argument of the op, as the tests draw it.

    ``shape`` is small (gradcheck builds a Jacobian of elements in by elements out) and broadcasts as the
    spec's example shapes do. Random values are uniform in [``low``, ``high``], kept ``AVOID_MARGIN`` away
    from the points in ``avoid`` (kinks and poles); ``typical`` is an ordinary value, which the input takes
    while another is at its extremes. ``extremes`` are large and tiny values inside the op's support, and
    ``special`` the points where the op is hardest (the ends of its support, 0 where the formula as written
    is 0/0). A ``learnable`` input is a parameter of the Module, of shape ``module_shape``; the others have
    that shape in the Module's test. ``second_shape`` is another shape the op must take (a leading batch
    dimension more and other sizes, where its math allows), for :meth:`OpTests.check_second_shape`.

    An input of ``dtype`` "int64" holds class indices from ``low`` to ``high`` (both included). The checks
    carry it as a floating-point tensor of integer values, like every other input (cast, moved, batched
    alike), and the op, its Function, its Module and the reference receive it as int64 (:func:`_indices`):
    it is never perturbed, and its gradient is zero (None from the op's backward). An input of ``dtype``
    "bool" is a mask, carried alike as floats 0 and 1 and received as bool: drawn True or False at random,
    with at least one True in each line along each dimension of size above 1 (:func:`_one_true_per_line`),
    so that a count of a reduced row is never 0 and a masked mean never 0/0.
    """

    name: str
    shape: tuple[int, ...]
    low: float = -3.0
    high: float = 3.0
    typical: float = 1.0
    avoid: tuple[float, ...] = ()
    extremes: tuple[float, ...] = ()
    special: tuple[float, ...] = ()
    learnable: bool = False
    module_shape: tuple[int, ...] | None = None
    second_shape: tuple[int, ...] | None = None
    #: The size name of each dimension of ``module_shape`` (None: a fixed size); empty: none has one.
    size_names: tuple[str | None, ...] = ()
    #: A learnable input's init scheme (None: not learnable).
    init: Init | None = None
    #: "float", "int64" for class indices, or "bool" for a mask.
    dtype: str = "float"

    def __post_init__(self) -> None:
        if self.boolean:  # True ordinarily, and at its extremes both values (one True in each line kept)
            object.__setattr__(self, "low", 0.0)
            object.__setattr__(self, "high", 1.0)
            object.__setattr__(self, "typical", 1.0)
            object.__setattr__(self, "extremes", (0.0, 1.0))
        if self.integer:  # its ordinary value the middle class, its extremes every class
            object.__setattr__(self, "typical", float((int(self.low) + int(self.high)) // 2))
            object.__setattr__(
                self, "extremes", self.extremes or tuple(map(float, range(int(self.low), int(self.high) + 1)))
            )

    @property
    def integer(self) -> bool:
        return self.dtype == "int64"

    @property
    def boolean(self) -> bool:
        return self.dtype == "bool"

    @property
    def discrete(self) -> bool:
        """Whether the op takes it as int64 or bool: carried as floats, never perturbed, no gradient."""
        return self.dtype != "float"


class _Calls:
    """The op and its reference called on tensors, their outputs and gradients, and the names they
    go by: what every check below reads."""

    def _float_outputs(self, *args: object) -> tuple[torch.Tensor, ...]:
        # not the bool masks, nor the statistics marked non-differentiable (with no gradient of their own)
        return tuple(o for o in _as_tuple(self._differentiable(*args)) if o.is_floating_point() and o.requires_grad)

    @property
    def _differentiable(self) -> Callable[..., object]:
        """What the gradient checks differentiate: the custom op (through its registered autograd), or the
        Function, hidden outputs included."""
        return self.custom_op if self.custom_op is not None else self.function.apply

    def _assert_same_as_op(self, outs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> None:
        """``outs`` (the op's outputs at ``inputs``, computed another way) and their gradients are the op's."""
        grads = torch.autograd.grad(_total(outs), inputs)
        expected = self._outputs(self.op(*inputs, *self._scalars))
        self._assert_values_close(outs, expected, **CLOSE)
        for name, grad, expected_grad in zip(self._names, grads, torch.autograd.grad(_total(expected), inputs)):
            torch.testing.assert_close(grad, expected_grad, **CLOSE, msg=lambda m, n=name: f"gradient of {n}: {m}")

    def _skip_under_torch_func(self, transform: str) -> None:
        """Skip a torch.func check of a custom op, saying why (PyTorch's limits, not the op's)."""
        if self.custom_op is None:
            return
        if transform == "jvp":
            why = "a torch.library custom op has no forward-mode rule, and torch.func.jvp gets zero tangents from it"
        else:
            why = (
                f"torch.func.{transform} cannot differentiate a torch.library custom op through its "
                "register_autograd (PyTorch issues #168393, #170834, #179652)"
            )
        pytest.skip(f"{why}; use {self.function.__name__}.apply, generated beside it, under torch.func")

    @property
    def _names(self) -> list[str]:
        return [i.name for i in self.inputs]

    @property
    def _value_names(self) -> list[str]:
        """How messages name each output's value."""
        return [f"value of {name}" for name in self.outputs] if self.outputs else ["value"]

    def _outputs(self, value: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The op's (or the reference's) outputs as a tuple, checking that there are as many as named."""
        outs = tuple(value) if isinstance(value, (tuple, list)) else (value,)
        assert len(outs) == max(1, len(self.outputs)), f"{len(outs)} outputs, expected {len(self.outputs) or 1}"
        return outs

    def _returned(self, value: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The outputs the op returns, of what its Function's apply returns: after them, forward may return
        intermediates for backward to read (hidden outputs, which the functional and the Module drop)."""
        return self._outputs(_as_tuple(value)[: max(1, len(self.outputs))])

    def _assert_values_close(
        self, values: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], **tolerance
    ) -> None:
        for what, value, expected_value in zip(self._value_names, values, expected, strict=True):
            torch.testing.assert_close(value, expected_value, **tolerance, msg=lambda m, w=what: f"{w}: {m}")

    @property
    def _scalars(self) -> tuple[object, ...]:
        return tuple(self.scalars.values())

    @property
    def _typical(self) -> dict[str, float]:
        return {i.name: i.typical for i in self.inputs}

    def _op_of_tensors(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.op(*tensors, *self._scalars)

    def _reference_of_tensors(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.reference(*tensors, *self._scalars)

    def _reference_values(self, inputs: Sequence[torch.Tensor], shift: float = 0.0) -> list[torch.Tensor]:
        """The reference's values and gradients at ``inputs``, each moved by ``shift``."""
        moved = [(x.detach() + shift).requires_grad_() for x in inputs]
        outs = self._outputs(self.reference(*moved, *self._scalars))
        return [*(o.detach() for o in outs), *(g.detach() for g in self._expected_grads(outs, moved))]

    def _expected_grads(
        self,
        outs: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor],
        upstream: Sequence[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """What each input's gradient should be for the reference's outputs ``outs`` (not summed) and their
        ``upstream`` gradients (default: ones): autograd's, or the custom gradient's formula."""
        outs = self._outputs(outs)
        upstream = [_upstream(torch.ones_like, o) for o in outs] if upstream is None else list(upstream)
        grads = _reference_grads(outs, inputs, upstream)
        for index, i in enumerate(self.inputs):
            if i.name in self.gradients:
                with torch.no_grad():
                    grads[index] = self._custom_gradient(index, upstream, [t.detach() for t in inputs])
        return grads

    def _custom_gradient(
        self, index: int, upstream: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """The custom gradient of input ``index`` by its formula (over each output's upstream gradient),
        broadcast to the input's shape (an elementwise op's backward computes it at its output's shape) and
        summed back to it."""
        value = self.gradients[self.inputs[index].name](*upstream, *inputs, *self._scalars)
        value = torch.as_tensor(value, dtype=upstream[0].dtype, device=upstream[0].device)
        shapes = [value.shape, inputs[index].shape, *(u.shape for u in upstream if self.elementwise)]
        return torch.broadcast_to(value, torch.broadcast_shapes(*shapes)).sum_to_size(inputs[index].shape)

    def _without_custom_gradients(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """``inputs``, those with a custom gradient not requiring grad (finite differences of the value
        are not their gradient); skips the check when none is left."""
        if all(i.name in self.gradients for i in self.inputs):
            pytest.skip("every tensor has a custom gradient: check_matches_reference compares them with their formulas")
        return [x.detach() if i.name in self.gradients else x for i, x in zip(self.inputs, inputs)]

    def _assert_custom_double_backward(self, inputs: list[torch.Tensor]) -> None:
        """Each custom gradient's own derivative, in grad_output and the inputs, as autograd takes it of its
        formula: backward is differentiated again, through the custom gradient."""
        for index, i in enumerate(self.inputs):
            if i.name not in self.gradients:
                continue
            xs = [x.detach().requires_grad_() for x in inputs]
            outs = self._returned(self.function.apply(*xs, *self._scalars))
            generator = torch.Generator().manual_seed(3)
            upstream = [_random_like(o, generator).requires_grad_(o.is_floating_point()) for o in outs]
            floating, weights = zip(*((o, u) for o, u in zip(outs, upstream) if o.is_floating_point()))
            (grad,) = torch.autograd.grad(floating, xs[index], weights, create_graph=True)
            formula = self._custom_gradient(index, upstream, xs)
            torch.testing.assert_close(grad, formula, **CLOSE, msg=lambda m, n=i.name: f"custom gradient of {n}: {m}")
            weights = torch.randn(grad.shape, generator=generator, dtype=grad.dtype).to(grad.device)
            wrt = [*upstream, *xs]
            second = _grads_or_zeros(grad, wrt, weights)
            expected = _grads_or_zeros(formula, wrt, weights)
            names = [f"grad_{n}" for n in self.outputs] if self.outputs else ["grad_output"]
            for what, value, expected_value in zip([*names, *self._names], second, expected):
                torch.testing.assert_close(
                    value, expected_value, **CLOSE, msg=lambda m, w=what, n=i.name: f"d(gradient of {n})/d {w}: {m}"
                )

    def _row(self, columns: Sequence[torch.Tensor], row: int) -> dict[str, float]:
        return {name: column[row].item() for name, column in zip(self._names, columns)}


class _Inputs:
    """The test inputs: drawn in each input's domain at the example's shapes (again where the draw
    would make a check meaningless), and at the inputs' extremes."""

    def make_inputs(
        self,
        device: str,
        dtype: torch.dtype = torch.float64,
        requires_grad: bool = True,
        seed: int = 0,
        shapes: Sequence[tuple[int, ...]] | None = None,
    ) -> list[torch.Tensor]:
        """Seeded random inputs where float64 is accurate, for gradcheck and the comparisons with the
        reference: finite differences (step 1e-6) lose about 1e-10 of the largest value or gradient
        involved, the reference as written overflows where the op grows fast (exp(x**3) at x = 3), and it
        cancels where a textbook form does (log(1 - sigmoid(u)) keeps 3 digits in float64 at u = 30, and a
        mean over a row carries that into every row it is in). So the draw is narrowed around the ordinary
        values until values and gradients stay below 1e4 and the reference's value is accurate (the least
        large draw, accurate first, if none is).

        It is drawn again (another seed, up to 8 times) where some input's gradient would be zero
        everywhere: with few elements, every unit of a relu layer can be off, and a test of a zero gradient
        proves nothing about backward."""
        shapes = [i.shape for i in self.inputs] if shapes is None else shapes
        chosen = None
        for attempt in range(8):
            inputs = self._accurate_draw(device, shapes, seed + 7919 * attempt)
            chosen = inputs if chosen is None else chosen
            probe = [x.detach().requires_grad_() for x in inputs]
            outs = self._outputs(self.reference(*probe, *self._scalars))
            weights = torch.Generator().manual_seed(5)  # the gradient of sum(softmax(x)) is 0: weigh the outputs
            upstream = [_random_like(o, weights) for o in outs]
            grads = _reference_grads(outs, probe, upstream)
            if all(bool((g != 0).any()) for i, g in zip(self.inputs, grads) if not i.discrete):
                chosen = inputs
                break
        return [x.detach().to(dtype).requires_grad_(requires_grad) for x in chosen]

    def _accurate_draw(self, device: str, shapes: Sequence[tuple[int, ...]], seed: int) -> list[torch.Tensor]:
        """:meth:`make_inputs`' draw, in float64, narrowed until the reference is accurate there."""
        best = None
        for scale in (1.0, 0.5, 0.25, 0.125):
            inputs = [x.requires_grad_() for x in self._draw(device, shapes, seed, scale)]
            outs = self._outputs(self.reference(*inputs, *self._scalars))
            grads = _reference_grads(_total(outs), inputs)
            size = max(float(t.detach().abs().max()) for t in [*outs, *grads])
            size = size if math.isfinite(size) else math.inf
            accurate = self._value_is_accurate(inputs, outs)
            if best is None or (not accurate, size) < best[0]:
                best = ((not accurate, size), inputs)
            if size <= 1e4 and accurate:
                break
        return [x.detach() for x in best[1]]

    def _value_is_accurate(self, inputs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> bool:
        """Whether the reference's value at ``inputs`` (``outs``, in float64) is accurate: its value in
        float32 is within 1% of it everywhere (float64 rounds 2**29 times finer; where float32 is further
        off, the formula as written cancels or overflows, and float64 keeps few digits there too)."""
        with torch.no_grad():
            outs32 = self._outputs(self.reference(*(x.detach().float() for x in inputs), *self._scalars))
        return all(
            bool(((o32.double() - o.detach()).abs() <= 1e-2 * o.detach().abs() + 1e-6).all())
            for o32, o in zip(outs32, outs)
        )

    def _draw(self, device: str, shapes: Sequence[tuple[int, ...]], seed: int, scale: float) -> list[torch.Tensor]:
        """Seeded float64 inputs; ``scale`` < 1 draws each from that fraction of its interval, around its
        ordinary value."""
        generator = torch.Generator().manual_seed(seed)
        tensors = []
        for shape, i in zip(shapes, self.inputs):
            if i.integer:  # every class, whatever the scale
                x = torch.randint(int(i.low), int(i.high) + 1, shape, generator=generator).to(torch.float64)
                tensors.append(x.to(device))
                continue
            if i.boolean:  # True and False, whatever the scale
                x = _one_true_per_line(torch.rand(shape, generator=generator, dtype=torch.float64) < 0.5)
                tensors.append(x.to(torch.float64).to(device))
                continue
            center = min(max(i.typical, i.low), i.high)
            low, high = center - (center - i.low) * scale, center + (i.high - center) * scale
            x = torch.rand(shape, generator=generator, dtype=torch.float64) * (high - low) + low
            for point in i.avoid:
                near = (x - point).abs() < AVOID_MARGIN
                x = torch.where(near, point + torch.where(x < point, -2.0, 2.0) * AVOID_MARGIN, x)
            tensors.append(x.to(device))
        return tensors

    def extreme_inputs(self) -> list[torch.Tensor]:
        """The extreme-input tests' inputs, in float64: an elementwise op's :meth:`extreme_columns`; for an op
        that mixes values across a row, each input at its own shape, every element drawn (seeded) from its
        extremes, so that large and tiny values meet in a row."""
        if self.elementwise:
            return self.extreme_columns()
        generator = torch.Generator().manual_seed(3)
        inputs = []
        for i in self.inputs:
            values = torch.tensor(i.extremes or (i.typical,), dtype=torch.float64)
            x = values[torch.randint(len(values), i.shape, generator=generator)]
            inputs.append(_one_true_per_line(x != 0).to(torch.float64) if i.boolean else x)
        return inputs

    def extreme_columns(self) -> list[torch.Tensor]:
        """The extreme-input tests' inputs, one 1-d column per input: each input in turn at each of its
        extremes, the others at their ordinary values and at their extremes nearest to the value and its
        negative (the same or the opposite sign) and to its reciprocals (a tiny input against a huge one, as
        in sigmoid(1e4 * 1e-3)): the number of rows grows linearly with the number of inputs."""
        extremes = {i.name: i.extremes or (i.typical,) for i in self.inputs}

        def partners(value: float) -> list[dict[str, float]]:
            targets = [value, -value] + ([1 / value, -1 / value] if value else [])
            return [self._typical] + [{n: _nearest(column, t) for n, column in extremes.items()} for t in targets]

        return self._one_at_a_time(extremes, partners)

    def _one_at_a_time(
        self, values: Mapping[str, Sequence[float]], partners: Callable[[float], list[dict[str, float]]]
    ) -> list[torch.Tensor]:
        rows: dict[tuple[float, ...], None] = {}
        for name, column in values.items():
            for value in column:
                for others in partners(value):
                    rows.setdefault(tuple(value if n == name else others[n] for n in self._names))
        return list(torch.tensor([*rows], dtype=torch.float64).reshape(-1, len(self.inputs)).T)


class _ReferenceChecks:
    """Values and gradients against the reference and finite differences, and the rules of a
    Function's backward (only the gradients needed, no tensors on ctx, partly used outputs)."""

    @_quietly
    def check_opcheck(self, device: str) -> None:
        """torch.library.opcheck of the custom op, in float64: its schema, its fake-tensor kernel (the
        shapes torch.compile and export see), its autograd registration, and AOTAutograd with dynamic
        shapes agree with the real kernel. It does not check the math: the other checks do."""
        assert self.custom_op is not None, "not a custom op: remove this test"
        inputs = self.make_inputs(device)
        # the custom op itself, not its wrapper for the checks (__post_init__): its int64 inputs as int64
        inputs = [_received(x, i.dtype) if i.discrete else x for i, x in zip(self.inputs, inputs)]
        torch.library.opcheck(getattr(self.custom_op, "__wrapped__", self.custom_op), (*inputs, *self._scalars))

    @_quietly
    def check_gradcheck(self, device: str) -> None:
        """Backward against finite differences, in float64, at the inputs' shapes (broadcasting ones), for
        the outputs and the hidden outputs (an intermediate forward returns for backward: its gradient
        arrives in a second derivative); not for the bool masks forward returns, which have no gradient,
        nor for the tensors with custom gradients (check_matches_reference compares those with their
        formulas)."""
        inputs = self._without_custom_gradients(self.make_inputs(device))
        assert gradcheck(self._float_outputs, (*inputs, *self._scalars))

    @_quietly
    def check_gradgradcheck(self, device: str) -> None:
        """Double backward against finite differences of backward; a custom gradient's own derivative
        against autograd's of its formula. An elementwise op's tensors take the full broadcast shape:
        second derivatives are elementwise, and finite differences of a gradient summed over broadcast
        dimensions lose the small terms to the rounding of the large ones (lennard-jones near its pole);
        check_gradcheck covers the sums. Other ops' tensors keep their own shapes."""
        shapes = [i.shape for i in self.inputs]
        if self.elementwise:
            shapes = [torch.broadcast_shapes(*shapes)] * len(shapes)
        inputs = self.make_inputs(device, shapes=shapes)
        self._assert_custom_double_backward(inputs)
        if any(i.name not in self.gradients for i in self.inputs):
            assert gradgradcheck(self._float_outputs, (*self._without_custom_gradients(inputs), *self._scalars))

    @_quietly
    def check_matches_reference(self, device: str) -> None:
        """Value and every gradient (for a random grad_output) against the reference; gradients have their
        input's shape."""
        self._assert_matches_reference_at(device, [i.shape for i in self.inputs])

    @_quietly
    def check_second_shape(self, device: str) -> None:
        """:meth:`check_matches_reference` at each input's ``second_shape``: an op is called at other ranks
        and sizes than its example's, where it must still be the forward as written (a dim counted from
        the front or the back as torch counts it, a product's gradient summed over broadcast batch
        dimensions), with outputs of the reference's shapes; and backward against finite differences there,
        along a random direction (gradcheck's fast mode: a few evaluations, not one per element)."""
        shapes = [i.second_shape or i.shape for i in self.inputs]
        self._assert_matches_reference_at(device, shapes, SECOND_SHAPE_CLOSE)
        if all(i.name in self.gradients for i in self.inputs):
            return  # every gradient is a formula, compared with it above
        inputs = self._without_custom_gradients(self.make_inputs(device, shapes=shapes))
        assert gradcheck(self._float_outputs, (*inputs, *self._scalars), fast_mode=True)

    def _assert_matches_reference_at(
        self, device: str, shapes: Sequence[tuple[int, ...]], close: dict[str, float] = CLOSE
    ) -> None:
        inputs = self.make_inputs(device, shapes=shapes)
        outs = self._outputs(self.op(*inputs, *self._scalars))
        expected = self._outputs(self.reference(*inputs, *self._scalars))
        self._assert_values_close(outs, expected, **close)
        generator = torch.Generator().manual_seed(1)
        upstream = [_random_like(o, generator, torch.float64) for o in outs]
        # (int64 outputs, indices, have no gradient)
        floating, weights = zip(*((o, u) for o, u in zip(outs, upstream) if o.is_floating_point()))
        grads = torch.autograd.grad(floating, inputs, weights)
        expected_grads = self._expected_grads(expected, inputs, upstream)
        for name, tensor, grad, expected_grad in zip(self._names, inputs, grads, expected_grads):
            assert grad.shape == tensor.shape, f"gradient of {name} has shape {grad.shape}, input {tensor.shape}"
            torch.testing.assert_close(grad, expected_grad, **close, msg=lambda m, n=name: f"gradient of {n}: {m}")

    @_quietly
    def check_partly_used_outputs(self, device: str) -> None:
        """With several outputs, each used alone (the others' gradients never computed: backward receives
        zeros for them): the gradients are that output's alone, as the reference's."""
        assert len(self.outputs) > 1, "the op has one output: remove this test"
        inputs = self.make_inputs(device)
        generator = torch.Generator().manual_seed(4)
        for k, name in enumerate(self.outputs):
            out = self._outputs(self.op(*inputs, *self._scalars))[k]
            if not out.is_floating_point():  # int64 indices: no gradient
                continue
            expected_outs = self._outputs(self.reference(*inputs, *self._scalars))
            upstream = torch.randn(out.shape, generator=generator, dtype=out.dtype).to(device)
            grads = torch.autograd.grad(out, inputs, upstream, allow_unused=True)
            zeros = [_upstream(torch.zeros_like, o) for o in expected_outs]
            expected = self._expected_grads(expected_outs, inputs, [*zeros[:k], upstream, *zeros[k + 1 :]])
            for arg, x, grad, expected_grad in zip(self._names, inputs, grads, expected):
                grad = torch.zeros_like(x) if grad is None else grad
                torch.testing.assert_close(
                    grad, expected_grad, **CLOSE, msg=lambda m, a=arg, n=name: f"gradient of {a} from {n} alone: {m}"
                )
        if not self.gradients:
            self._assert_alone_finite_at_extremes(device)

    def _assert_alone_finite_at_extremes(self, device: str) -> None:
        """At extreme inputs, in float32 and float64, each output used alone has finite gradients wherever the
        reference's output alone has: an unused output that overflows there (exp(100) in float32) passes nothing
        on (0 * inf is nan)."""
        extremes = [x.float().to(device) for x in self.extreme_inputs()]
        for columns, k in itertools.product(([x.double() for x in extremes], extremes), range(len(self.outputs))):
            name = self.outputs[k]
            inputs = [x.clone().requires_grad_() for x in columns]
            out = self._outputs(self.op(*inputs, *self._scalars))[k]
            if not out.is_floating_point():  # int64 indices: no gradient
                continue
            grads = torch.autograd.grad(out, inputs, torch.ones_like(out), allow_unused=True)
            plain = [x.clone().requires_grad_() for x in columns]
            reference = self._outputs(self.reference(*plain, *self._scalars))[k]
            expected = torch.autograd.grad(reference, plain, torch.ones_like(reference), allow_unused=True)
            for arg, grad, expected_grad in zip(self._names, grads, expected):
                if grad is None or expected_grad is None:
                    continue
                finite = torch.isfinite(expected_grad)
                assert torch.isfinite(grad[finite]).all(), (
                    f"gradient of {arg} from {name} alone at extreme inputs is not finite where the reference's is"
                )

    @_quietly
    def check_only_needed_gradients(self, device: str) -> None:
        """With one input requiring grad at a time, backward returns one value per forward argument, a
        gradient of the right shape for that input and None for every other."""
        for index in range(len(self.inputs)):
            if self.inputs[index].discrete:  # the Function takes it as int64 or bool, which cannot require grad
                continue
            inputs = self.make_inputs(device, requires_grad=False)
            inputs[index].requires_grad_(True)
            outs = _as_tuple(self.function.apply(*inputs, *self._scalars))  # with any hidden outputs
            # grad_fn.apply calls the Function's backward with this call's ctx.
            grads = outs[0].grad_fn.apply(*(torch.ones_like(o) for o in outs))
            assert len(grads) == len(inputs) + len(self.scalars), "backward must return one value per argument"
            for i, grad in enumerate(grads):
                if i == index:
                    assert grad is not None and grad.shape == inputs[i].shape, f"gradient of {self._names[i]}"
                else:
                    assert grad is None, f"backward computed a gradient nobody needs (argument {i})"

    @_quietly
    def check_ctx_holds_no_tensors(self) -> None:
        """Tensors reach backward through save_for_backward, not as ctx attributes (which leak memory and
        escape the saved-tensor checks)."""
        out = _as_tuple(self.function.apply(*self.make_inputs("cpu"), *self._scalars))[0]
        attributes = [k for k, v in vars(out.grad_fn).items() if isinstance(v, torch.Tensor)]
        assert not attributes, f"tensors must go through save_for_backward, not ctx attributes: {attributes}"

    @_quietly
    def check_float32(self, device: str) -> None:
        """float32 in, float32 out, close to the float64 reference."""
        inputs = self.make_inputs(device)
        inputs32 = [x.detach().float().requires_grad_() for x in inputs]
        outs32 = self._outputs(self.op(*inputs32, *self._scalars))
        assert all(o.dtype == torch.float32 for o in outs32 if o.dtype != torch.int64)  # (int64 indices stay so)
        expected = self._outputs(self.reference(*inputs, *self._scalars))
        self._assert_values_close([_double(o) for o in outs32], expected, rtol=1e-4, atol=1e-5)
        grads32 = torch.autograd.grad(_total(outs32), inputs32)
        for name, grad, expected_grad in zip(self._names, grads32, self._expected_grads(expected, inputs)):
            assert grad.dtype == torch.float32, name
            torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-3, atol=1e-4)


class _RowKernelChecks:
    """Fused mode's Triton kernels (``rows``: the Function that runs them), where they run: on CUDA, or on the
    CPU in Triton's interpreter."""

    @_quietly
    def check_row_kernels(self, device: str) -> None:
        """The op through its Triton kernels, on CUDA or, on the CPU, in Triton's interpreter
        (TRITON_INTERPRET=1, set before Triton is imported): in float64, the checks of values and gradients
        against the reference at the example's shapes and at the second shapes, gradcheck, and gradgradcheck (a
        second derivative differentiates the derived Function); in float32 and bfloat16, which the kernels
        compute in float32, values and gradients against the float64 reference of the same inputs, within the
        rounding of the dtype. Each check must have launched both kernels: a fallback to the Function would pass them
        without testing the kernels."""
        pytest.importorskip("triton")
        assert self.rows is not None, "the op has no row kernels: remove this test"
        forward, backward = self.rows.kernels
        checks = (
            self.check_matches_reference,
            self._assert_rows_at_another_rank,
            self._rows_gradchecks,
            self._assert_rows_in(torch.float32, {"rtol": 1e-4, "atol": 1e-5}),
            self._assert_rows_in(torch.bfloat16, {"rtol": 1.6e-2, "atol": 1e-3}),
        )
        if device == "cpu" and not triton_interprets():
            pytest.skip(
                "Triton's interpreter is off: TRITON_INTERPRET=1 must be set before Triton is imported (the generated "
                "test file sets it where there is no GPU, unless something imported Triton first), with Triton 3.7 "
                "or newer"
            )
        for check in checks:
            launched = forward.launches, backward.launches
            check(device)
            ran = forward.launches > launched[0], backward.launches > launched[1]
            assert all(ran), f"{getattr(check, '__name__', check)} ran without the kernels: {ran}"

    def _assert_rows_at_another_rank(self, device: str) -> None:
        """:meth:`check_second_shape`'s comparison at the lead tensor's second shape (the first float tensor
        of the highest rank), the others' shapes following it as the kernels take them: a weight (its last
        dimension), one value per row, a 0-d tensor."""
        shapes = [i.shape for i in self.inputs]
        rank = max(len(s) for s in shapes)
        lead = next(i for i in self.inputs if len(i.shape) == rank and not i.discrete)
        example, other = lead.shape, lead.second_shape or lead.shape
        follows = {example: other, example[-1:]: other[-1:], (*example[:-1], 1): (*other[:-1], 1)}
        follows[example[:-1]] = other[:-1]
        follows[()] = ()
        self._assert_matches_reference_at(device, [follows.get(s, s) for s in shapes], SECOND_SHAPE_CLOSE)

    def _rows_gradchecks(self, device: str) -> None:
        """gradcheck and gradgradcheck of the op (its entry point, which runs the kernels), in float64."""
        inputs = self._without_custom_gradients(self.make_inputs(device))

        def op(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(o for o in self._outputs(self.op(*tensors, *self._scalars)) if o.is_floating_point())

        assert gradcheck(op, inputs)
        assert gradgradcheck(op, inputs)

    def _assert_rows_in(self, dtype: torch.dtype, close: dict[str, float]) -> Callable[[str], None]:
        def check(device: str) -> None:
            inputs = self.make_inputs(device)
            low = [x.detach().to(dtype).requires_grad_() if x.is_floating_point() else x for x in inputs]
            exact = [x.detach().double().requires_grad_() if x.is_floating_point() else x for x in low]
            outs = self._outputs(self.op(*low, *self._scalars))
            assert all(o.dtype == dtype for o in outs if o.is_floating_point()), [o.dtype for o in outs]
            expected = self._outputs(self.reference(*exact, *self._scalars))
            self._assert_values_close([o.double() for o in outs], expected, **close)
            generator = torch.Generator().manual_seed(2)
            upstream = [_random_like(o, generator, torch.float64) for o in expected]
            floating = [x for x in low if x.requires_grad]
            grads = torch.autograd.grad(outs, floating, [u.to(dtype) for u in upstream])
            expected_grads = torch.autograd.grad(expected, [x for x in exact if x.requires_grad], upstream)
            for name, grad, expected_grad in zip(self._names, grads, expected_grads):
                assert grad.dtype == dtype, f"gradient of {name} is {grad.dtype}"
                torch.testing.assert_close(grad.double(), expected_grad, **close, msg=lambda m, n=name: f"{n}: {m}")

        check.__name__ = f"{dtype} values and gradients"
        return check


def triton_interprets() -> bool:
    """Whether Triton's interpreter runs kernels on CPU tensors: TRITON_INTERPRET=1 was set before Triton was
    imported, as the generated test file of an op with Triton kernels sets it where there is no GPU, and the
    interpreter is Triton 3.7's or newer (3.6's cannot run a loop whose bounds are computed, under NumPy 2)."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return False
    version = tuple(int(part) for part in triton.__version__.split(".")[:2] if part.isdigit())
    return version >= (3, 7) and type(tl.sum).__name__ == "InterpretedFunction"


class _Comparisons:
    """The op against the reference at given inputs: values and gradients close, gradients against
    finite differences, and values finite and equal wherever the reference's are (or its limit, where it is
    0/0)."""

    def assert_matches_reference(
        self,
        columns: Sequence[torch.Tensor],
        device: str,
        where: str,
        accurate: torch.Tensor | None = None,
        limits: bool = False,
    ) -> None:
        """In float64 at the inputs ``columns``, the op's value and gradients are finite wherever the
        reference's are, and close to them (rtol 1e-3); given ``accurate``, a mask of where the reference's
        value is, only the value and only there. Where the reference's value overflows, its gradients are not
        trusted either (sqrt(inf**2 + y**2) has gradient 0 in y). With ``limits``, where the reference is 0/0
        (x/expm1(x) at x = 0) it is replaced by its limit: the mean of its values at the inputs moved by
        -1e-4 and +1e-4."""
        inputs = [x.to(device).requires_grad_() for x in columns]
        outs = self._outputs(self.op(*inputs, *self._scalars))
        grads = torch.autograd.grad(_total(outs), inputs)
        expected_values = self._reference_values(inputs)
        count = len(outs)
        if limits:
            below, above = self._reference_values(inputs, -1e-4), self._reference_values(inputs, 1e-4)
            removable = functools.reduce(torch.logical_or, [e.isnan() for e in expected_values[:count]])
            expected_values = [torch.where(removable, (b + a) / 2, e) for e, b, a in zip(expected_values, below, above)]
        expected_outs, expected_grads = expected_values[:count], expected_values[count:]
        values_finite = functools.reduce(torch.logical_and, [torch.isfinite(e) for e in expected_outs])
        # Where two inputs are equal or opposite, a kink between them (Max, Min, Abs, a comparison) may sit,
        # whose derivative is a convention (torch.maximum splits the gradient at a tie): only finiteness is
        # checked there.
        tie = _tie(inputs, inputs[0].shape)
        compare = [~tie] * (count + len(inputs))
        if accurate is not None:
            compare = [~tie & accurate.to(tie.device)] * count + [torch.zeros_like(tie)] * len(inputs)
        results = zip([*self._value_names, *self._names], [*outs, *grads], [*expected_outs, *expected_grads], compare)
        for what, value, expected_value, compared in results:
            finite = values_finite & torch.isfinite(expected_value)
            broken = (finite & ~torch.isfinite(value)).nonzero().flatten().tolist()
            if broken:
                pytest.fail(
                    f"{what} at {where} is {value[broken[0]].item()} where the reference's is "
                    f"{expected_value[broken[0]].item()}, at {self._row(inputs, broken[0])} "
                    f"({len(broken)} such points)"
                )
            torch.testing.assert_close(
                value[finite & compared],
                expected_value[finite & compared],
                rtol=1e-3,
                atol=1e-4,
                msg=lambda m, what=what: f"{what} at {where}: {m}",
            )

    def assert_gradients_match_differences(self, columns: Sequence[torch.Tensor], device: str, where: str) -> None:
        """In float64 at the inputs ``columns``, each gradient of the op agrees with central differences of
        its own value wherever those are reliable: the value finite, the one-sided differences agreeing (no
        kink), and central differences with steps of 1e-6 and 1e-6/8 of the input (1e-9 at least) agreeing
        (the value varies slowly at that scale: not so for erf(w * (x - y)) at x = y = w = -1e4). A gradient
        wrong only in a branch that ordinary inputs never reach (|x - y| > w in a wing loss) is caught there,
        whatever the reference as written does at those inputs."""
        inputs = [x.to(device).requires_grad_() for x in columns]
        outs = self._outputs(self.op(*inputs, *self._scalars))
        # each output on its own: a sum of outputs can be smooth where each has a kink (Max(x, y) + Min(x, y))
        for k, (value_name, out) in enumerate(zip(self._value_names, outs)):
            if not out.is_floating_point():  # int64 indices: no gradient
                continue
            # an output that does not depend on an input gives it no gradient (None), as plain autograd does
            grads = torch.autograd.grad(out.sum(), inputs, retain_graph=True, allow_unused=True)
            grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs)]
            of = f" ({value_name[len('value of ') :]})" if self.outputs else ""
            self._assert_output_matches_differences(inputs, k, out.detach(), grads, where + of)

    def _assert_output_matches_differences(
        self, inputs: list[torch.Tensor], k: int, out: torch.Tensor, grads: Sequence[torch.Tensor], where: str
    ) -> None:
        def differences(index: int, step: torch.Tensor) -> tuple[torch.Tensor, ...]:
            with torch.no_grad():
                moved = [[*inputs[:index], inputs[index] + s, *inputs[index + 1 :]] for s in (step, -step)]
                above, below = [self._outputs(self.op(*args, *self._scalars))[k] for args in moved]
            # What rounding each value to float64 (a few units in its last place) can do to a difference.
            rounding = 64 * 2.0**-52 * (above.abs() + out.abs() + below.abs()) / step
            finite = torch.isfinite(above) & torch.isfinite(below) & torch.isfinite(out)
            return (above - out) / step, (out - below) / step, (above - below) / (2 * step), rounding, finite

        for index, (what, grad) in enumerate(zip(self._names, grads)):
            if what in self.gradients:  # not the value's derivative by design
                continue
            step = 1e-6 * inputs[index].detach().abs().clamp(min=1e-3)
            right, left, coarse, _, finite = differences(index, step)
            _, _, central, rounding, finite_too = differences(index, step / 8)
            reliable = (
                finite
                & finite_too
                & ((right - left).abs() <= 1e-3 * (right.abs() + left.abs()) + rounding)
                & ((coarse - central).abs() <= 1e-3 * central.abs() + rounding)
            )
            wrong = reliable & ~((grad - central).abs() <= 1e-4 + 1e-3 * central.abs() + rounding)
            if wrong.any():
                row = wrong.nonzero().flatten()[0].item()
                pytest.fail(
                    f"gradient of {what} at {where} is {grad[row].item()}, differences of the value give "
                    f"{central[row].item()}, at {self._row(inputs, row)} ({int(wrong.sum())} such points)"
                )

    def _assert_matches_where_finite(
        self,
        inputs: Sequence[torch.Tensor],
        where: str,
        ties: Sequence[torch.Tensor] | None = None,
        limit: tuple[int, torch.Tensor] | None = None,
    ) -> None:
        """The op's value and gradients at ``inputs`` against the reference's, wherever those are finite: a
        nan or an inf there, or another value, fails. Where ``ties`` (a mask per input) is set, a kink may
        sit whose derivative is a convention (torch.maximum splits the gradient at a tie): that input's
        gradient is only required to be finite there. With ``limit`` (an input's index and a mask of it),
        where the reference is nan it is replaced by its limit (:meth:`_limits`)."""
        outs = self._outputs(self.op(*inputs, *self._scalars))
        grads = torch.autograd.grad(_total(outs), inputs)
        expected = self._reference_values(inputs)  # a custom gradient's by its formula
        limited = [torch.zeros_like(e, dtype=torch.bool) for e in expected]
        if limit is not None:
            expected, limited = self._limits(inputs, expected, *limit)
        pairs = zip([*self._value_names, *self._names], [*outs, *grads], expected, limited)
        compared = [None] * len(outs) + ([None] * len(inputs) if ties is None else [~t for t in ties])
        for (what, value, reference, at_limit), compare in zip(pairs, compared):
            value = value.detach()
            finite = torch.isfinite(reference)
            if not finite.any():
                continue
            scale = float(reference[finite].abs().max())
            assert torch.isfinite(value[finite]).all(), f"{what} at {where} is not finite where the reference is"
            if compare is not None:
                finite &= compare
            close = {"rtol": 1e-5, "atol": 1e-9 * max(scale, 1.0)}
            for part, tolerance in ((finite & ~at_limit, close), (finite & at_limit, LIMIT_CLOSE)):
                torch.testing.assert_close(
                    value[part], reference[part], **tolerance, msg=lambda m, w=what: f"{w} at {where}: {m}"
                )

    def _limits(
        self, inputs: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], k: int, at: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The reference's values and gradients ``expected`` at ``inputs``, each replaced by its limit where
        it is nan (0/0 as written: x/expm1(x) at x = 0): the mean of its values with input ``k`` moved by
        -1e-4 and +1e-4 where ``at`` is set; and where each was replaced."""
        moved = [[x + shift * at if j == k else x for j, x in enumerate(inputs)] for shift in (-1e-4, 1e-4)]
        below, above = (self._reference_values(m) for m in moved)
        limits = [torch.where(e.isnan(), (b + a) / 2, e) for e, b, a in zip(expected, below, above)]
        return limits, [e.isnan() for e in expected]


class _ExtremeChecks:
    """The op at the ends of its inputs' ranges: float32 against float64 at extreme inputs, float64
    there against the reference wherever it is finite, and the special points of each input."""

    @_quietly
    def check_extreme_inputs(self, device: str) -> None:
        """float32 at large and tiny inputs inside the op's support agrees with float64 wherever float64 is
        finite: no intermediate overflows (exp(100) in float32), no inf - inf or 0 * inf.

        Where the math itself loses float32 digits (a difference of large lgamma values), a result may be
        off by the rounding its condition number implies (:meth:`float32_rounding`), or as far as finite
        plain autograd of the forward as written is in float32, but no further; gradients are compared only
        where the value itself is representable in float32. An op that mixes values across a row takes
        whole tensors of extremes (:meth:`extreme_inputs`): its values and gradients are compared element
        by element, each allowed the rounding its condition number over the row implies.
        """
        columns = self.extreme_inputs()
        inputs32 = [x.float().to(device).requires_grad_() for x in columns]
        inputs64 = [x.detach().double().requires_grad_() for x in inputs32]
        outs32 = self._outputs(self.op(*inputs32, *self._scalars))
        outs64 = self._outputs(self.op(*inputs64, *self._scalars))
        # materialized: a hand-written Function (scaffold check) may return None for a gradient that is 0
        grads32 = torch.autograd.grad(_total(outs32), inputs32, allow_unused=True, materialize_grads=True)
        grads64 = torch.autograd.grad(_total(outs64), inputs64, allow_unused=True, materialize_grads=True)
        plain32 = [x.detach().requires_grad_() for x in inputs32]
        expected32 = self._outputs(self.reference(*plain32, *self._scalars))
        plain_grads32 = self._expected_grads(expected32, plain32)
        results = zip(
            [*self._value_names, *self._names],
            [*outs32, *grads32],
            [*outs64, *grads64],
            [*expected32, *plain_grads32],
            self.float32_rounding(columns),
            self._representable(outs64, len(grads64)),
        )
        for what, value32, value64, plain, allowance, value_representable in results:
            value32, value64, plain = (v.detach().double().flatten() for v in (value32, value64, plain))
            allowance, value_representable = allowance.flatten(), value_representable.flatten()
            representable = value_representable & torch.isfinite(value64) & (value64.abs() < 1e30)
            allowed = 1e-4 + 1e-3 * value64.abs() + allowance.to(value64.device)
            # ... only where plain autograd got the result roughly right, or where the result lies below the
            # noise of float32 arithmetic that plain autograd shows (a gradient that cancels to 0 exactly, as
            # causal linear attention's in q at its first position); 0 for a nonzero gradient (s * (1 - s) once
            # s rounds to 1) excuses nothing.
            plain_error = (plain - value64).abs()
            below_noise = (plain != 0) & (plain_error >= value64.abs())
            roughly_right = torch.isfinite(plain) & ((plain_error < value64.abs() / 2) | below_noise)
            allowed = allowed + torch.where(roughly_right, 2 * plain_error, 0)
            wrong = representable & ~((value32 - value64).abs() <= allowed)
            if wrong.any():
                row = wrong.nonzero().flatten()[0].item()
                at = self._row(inputs32, row) if self.elementwise else f"element {row} of the {what} (flattened)"
                pytest.fail(
                    f"{what} in float32 at extreme inputs is {value32[row].item()}, float64 gives "
                    f"{value64[row].item()} and plain autograd in float32 {plain[row].item()}, at "
                    f"{at} ({int(wrong.sum())} such points)"
                )

    def _representable(self, outs64: Sequence[torch.Tensor], gradients: int) -> list[torch.Tensor]:
        """Where each output's value and each gradient is compared at extreme inputs: where the values are
        representable in float32 (finite, below 1e30). An elementwise op's row is its own (every output's
        value there); a gradient of an op that mixes values across a row reads every value of it."""
        masks = [torch.isfinite(o) & (o.abs() < 1e30) for o in outs64]
        if self.elementwise:
            return [functools.reduce(torch.logical_and, masks)] * (len(masks) + gradients)
        every = functools.reduce(torch.logical_and, [m.all() for m in masks])
        return masks + [every] * gradients

    @_quietly
    def check_extreme_inputs_float64(self, device: str) -> None:
        """float64 at the same inputs, so that a nan in float64 cannot hide from check_extreme_inputs, nor a
        value or gradient wrong only where no ordinary input reaches (a branch for |x| > 20). The reference
        as written can be far off there (1 - sigmoid(30.5) is 1.5e-3 off in float64): its value is compared
        only where it is accurate, and the gradients against differences of the op's own value.

        An op that mixes values across a row: its value and gradients are finite and match the reference's
        wherever the reference's are finite. Where the forward as written overflows (a textbook logsumexp at
        1000) the reference is not compared, and the op may do better; it may not produce a nan where the
        reference is finite."""
        columns = [x.float().double() for x in self.extreme_inputs()]
        if not self.elementwise:
            inputs = [x.to(device).requires_grad_() for x in columns]
            self._assert_matches_where_finite(inputs, "extreme inputs", _ties(inputs))
            return
        accurate = self.reference_is_accurate(columns)
        self.assert_matches_reference(columns, device, "extreme inputs", accurate=accurate)
        self.assert_gradients_match_differences(columns, device, "extreme inputs")

    #: The name of :meth:`check_extreme_inputs_float64` in the test files of structured ops generated before
    #: it was one check for every op.
    check_large_inputs = check_extreme_inputs_float64

    @_quietly
    def check_special_points(self, device: str) -> None:
        """float64 where the op is hardest, one input at a time, the others at ordinary values: n*x**(n-1)
        written as n*x**n/x is 0/0 at x = 0, and so is x/expm1(x) (there the reference's limit is compared).
        An op that mixes values across a row has one input at a time at each special point at every element,
        then at every other element (the others drawn as usual): :meth:`_assert_special_rows`."""
        special = {i.name: i.special for i in self.inputs if i.special}
        assert special, "no input has special points: remove this test"
        if not self.elementwise:
            self._assert_special_rows(device)
            return
        columns = self._one_at_a_time(special, lambda value: [self._typical])
        self.assert_matches_reference(columns, device, "special points", limits=True)

    def reference_is_accurate(self, columns: Sequence[torch.Tensor]) -> torch.Tensor:
        """Where the reference's value as written is accurate in float64: where it is already within 1% in
        float32 (float64 rounds 2**29 times finer), and no intermediate value overflowed on the way (x /
        log(1 + exp(x)) is 0 at x = 1e4 in both). Elsewhere the formula as written cancels (1 - sigmoid(30)
        is 0 in float32 and keeps 3 of its digits in float64) or overflows."""
        with _Overflows(len(columns[0])) as overflows:
            values64 = self._outputs(self.reference(*columns, *self._scalars))
        values32 = self._outputs(self.reference(*(x.float() for x in columns), *self._scalars))
        accurate = ~overflows.rows
        for value32, value64 in zip(values32, values64):
            accurate &= (value32.double() - value64).abs() <= 1e-2 * value64.abs() + 1e-6
        return accurate

    def float32_rounding(self, columns: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """How far float32 may be off at ``columns`` however carefully it computes, for the value and each
        gradient: 8 unit roundoffs times the condition number, sum_i |x_i * d/dx_i|, from the reference's
        float64 derivatives (0 where they are not finite). A result that cancels (S * ndtr(d1) - K * ...
        in Black-Scholes at tiny sigma) cannot be more accurate than its inputs' rounding lets it be. For an
        op that mixes values across a row the sum runs over every element each result reads."""
        if not self.elementwise:
            return self._row_rounding(columns)
        inputs = [x.detach().double().requires_grad_() for x in columns]
        outs = self._outputs(self.reference(*inputs, *self._scalars))
        sizes = [x.detach().abs() for x in inputs]

        def condition(derivatives: Sequence[torch.Tensor | None]) -> torch.Tensor:
            terms = [torch.zeros_like(s) if d is None else (s * d.detach()).abs() for s, d in zip(sizes, derivatives)]
            total = sum(terms)
            return 8 * 2.0**-24 * torch.where(torch.isfinite(total), total, 0)

        rounding = []
        for out in outs:
            grads = _reference_grads(out.sum(), inputs, create_graph=True)
            rounding.append(condition(grads))
        grads = _reference_grads(_total(outs), inputs, create_graph=True)
        for grad in grads:
            second: Sequence[torch.Tensor | None] = [None] * len(inputs)
            if grad.requires_grad:
                second = torch.autograd.grad(grad.sum(), inputs, retain_graph=True, allow_unused=True)
            rounding.append(condition(second))
        return rounding

    def _row_rounding(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """:meth:`float32_rounding` of an op that mixes values across a row, from the reference's Jacobian
        (for the values) and Hessian (for the gradients) in float64 at ``inputs``: sum_j |d r/d x_j * x_j|
        over every element x_j of every input, for each element r of each result."""
        inputs = tuple(x.detach().double() for x in inputs)
        sizes = [x.abs().flatten() for x in inputs]

        def condition(blocks: Sequence[torch.Tensor], shape: torch.Size) -> torch.Tensor:
            terms = [b.reshape(shape.numel(), -1).abs() @ size for b, size in zip(blocks, sizes)]
            total = sum(terms).reshape(shape)
            return 8 * 2.0**-24 * torch.where(torch.isfinite(total), total, 0)

        def values(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self._outputs(self.reference(*xs, *self._scalars))

        outs = values(*inputs)
        jacobian = torch.autograd.functional.jacobian(values, inputs)
        hessian = torch.autograd.functional.hessian(lambda *xs: _total(values(*xs)), inputs)
        return [condition(row, out.shape) for row, out in zip(jacobian, outs)] + [
            condition(row, x.shape) for row, x in zip(hessian, inputs)
        ]

    def _assert_special_rows(self, device: str) -> None:
        """:meth:`check_special_points` of an op that mixes values across a row: one input at a time at each of
        its special points (the ends of its support: a target probability of 0 or 1; 0 where the forward as
        written is 0/0), every element at it, then every other element: the op's value and gradients are
        finite and match the reference's wherever the reference's are finite; where the reference is 0/0
        there (nan), its limit, the mean of its values with those elements moved by -1e-4 and +1e-4."""
        for k, i in enumerate(self.inputs):
            for value in i.special:
                for step in (1, 2):
                    inputs = self.make_inputs(device, requires_grad=False)
                    at = torch.zeros_like(inputs[k], dtype=torch.bool)
                    at.view(-1)[::step] = True
                    inputs[k] = torch.where(at, value, inputs[k])
                    every = "every element" if step == 1 else "every other element"
                    where = f"{i.name} = {value!r} at {every}"
                    self._assert_matches_where_finite([x.requires_grad_() for x in inputs], where, limit=(k, at))


class _TransformChecks:
    """The op inside the PyTorch ecosystem: forward mode, torch.func transforms, torch.compile,
    checkpointing and autocast."""

    @_quietly
    def check_forward_mode(self, device: str) -> None:
        """torch.func.jvp (forward mode, the Function's jvp) against the reference's."""
        self._skip_under_torch_func("jvp")
        primals = tuple(self.make_inputs(device, requires_grad=False))
        tangents = tuple(self.make_inputs(device, requires_grad=False, seed=2))
        out, tangent = torch.func.jvp(self._op_of_tensors, primals, tangents)
        expected, expected_tangent = torch.func.jvp(self._reference_of_tensors, primals, tangents)
        torch.testing.assert_close(out, expected, **CLOSE)
        torch.testing.assert_close(tangent, expected_tangent, **CLOSE)

    @_quietly
    def check_hessian(self, device: str) -> None:
        """torch.func.hessian (forward mode over reverse mode) of the summed output, every block, against
        the reference's, to rtol 1e-4: second derivatives of the formula as written lose more digits to
        its cancellations than first ones (1 - 1/(1 + exp(-a)) at a = 8 keeps 12 of 16); gradgradcheck
        checks them closely, against the op's own backward."""
        if self.gradients:
            pytest.skip("custom gradients: torch.func.hessian differentiates the custom backward, not the forward")
        self._skip_under_torch_func("hessian")
        inputs = tuple(self.make_inputs(device, requires_grad=False))
        argnums = tuple(range(len(inputs)))
        hessian = torch.func.hessian(lambda *xs: _total(self._outputs(self._op_of_tensors(*xs))), argnums)(*inputs)
        expected = torch.func.hessian(lambda *xs: _total(self._outputs(self._reference_of_tensors(*xs))), argnums)(
            *inputs
        )
        for i, row in enumerate(expected):
            for j, block in enumerate(row):
                what = f"d2 out / d {self._names[i]} d {self._names[j]}"
                torch.testing.assert_close(
                    hessian[i][j], block, rtol=1e-4, atol=1e-6, msg=lambda m, w=what: f"{w}: {m}"
                )

    @_quietly
    def check_jacrev(self, device: str) -> None:
        """torch.func.jacrev (reverse mode, the Function's backward batched by vmap over the rows of the
        Jacobian) of every output with respect to every tensor input against the reference's, in float64:
        each row is backward for one output element alone, the others' gradients zero."""
        if self.gradients:
            pytest.skip("custom gradients: the op's Jacobian is its custom backward's, not the reference's")
        self._skip_under_torch_func("jacrev")
        inputs = tuple(self.make_inputs(device, requires_grad=False))
        argnums = tuple(range(len(inputs)))
        # the floating-point outputs: int64 indices have no Jacobian
        floating = [k for k, o in enumerate(self._outputs(self._op_of_tensors(*inputs))) if o.is_floating_point()]

        def jacobian_of(f: Callable[..., object]) -> tuple:
            return torch.func.jacrev(lambda *xs: tuple(self._outputs(f(*xs))[k] for k in floating), argnums)(*inputs)

        jacobian, expected = jacobian_of(self._op_of_tensors), jacobian_of(self._reference_of_tensors)
        outputs = [(self.outputs or ["out"])[k] for k in floating]
        for output, row, expected_row in zip(outputs, jacobian, expected, strict=True):
            for name, block, expected_block in zip(self._names, row, expected_row):
                what = f"d {output} / d {name}"
                torch.testing.assert_close(block, expected_block, **CLOSE, msg=lambda m, w=what: f"{w}: {m}")

    @_quietly
    def check_vmap_and_func_grad(self) -> None:
        """torch.func.vmap over a batch of two inputs, and torch.func.grad, against the reference."""
        samples = [self.make_inputs("cpu", requires_grad=False, seed=seed) for seed in (0, 1)]
        batched = [torch.stack(xs) for xs in zip(*samples)]
        outs = self._outputs(torch.func.vmap(self._op_of_tensors)(*batched))
        expected_outs = zip(*(self._outputs(self._reference_of_tensors(*xs)) for xs in samples))
        self._assert_values_close(outs, [torch.stack(e) for e in expected_outs], **CLOSE)
        self._skip_under_torch_func("grad")  # vmap passed
        argnums = tuple(range(len(self.inputs)))

        def total(*xs: torch.Tensor) -> torch.Tensor:
            return _total(self._outputs(self._op_of_tensors(*xs)))

        grads = torch.func.grad(total, argnums=argnums)(*samples[0])
        inputs = [x.requires_grad_() for x in samples[0]]
        expected = self._expected_grads(self._reference_of_tensors(*inputs), inputs)
        for grad, expected_grad in zip(grads, expected):
            torch.testing.assert_close(grad, expected_grad, **CLOSE)

    @_quietly
    def check_compile(self, device: str) -> None:
        """torch.compile(fullgraph=True) of the op, value and gradients, against the op in eager: the op
        traces as one graph, with no graph break. Skipped where the backend itself cannot compile even
        ``x + 1`` (inductor without a C++ compiler): that says nothing about the op."""
        _skip_without_backend(device)
        if self.custom_op is not None:
            # Dynamo keeps compiled code per Python function, and every custom op is called through the same
            # one (CustomOpDef.__call__): compiling a project's ops one after another in one process would
            # reach its recompile limit (8). Each custom op's check starts afresh.
            torch.compiler.reset()
        inputs = self.make_inputs(device)
        compiled = torch.compile(self.op, fullgraph=True, backend=COMPILE_BACKEND, dynamic=False)
        outs = self._outputs(compiled(*inputs, *self._scalars))
        self._assert_same_as_op(outs, inputs)

    @_quietly
    def check_checkpoint(self, device: str) -> None:
        """torch.utils.checkpoint, non-reentrant (forward keeps only the inputs; backward runs the op's forward
        again, recording it, and differentiates that): the same outputs and gradients as the op, in float64.
        Recomputing must save the same tensors as the first forward did, or checkpoint raises."""
        inputs = self.make_inputs(device)
        checkpointed = torch.utils.checkpoint.checkpoint(self.op, *inputs, *self._scalars, use_reentrant=False)
        outs = self._outputs(checkpointed)
        self._assert_same_as_op(outs, inputs)

    @_quietly
    def check_autocast(self, device: str) -> None:
        """Under torch.autocast (bfloat16 on the CPU, float16 on CUDA) the op computes in float32, the choice
        its module documents: with float32 inputs and with inputs in autocast's dtype, the output is
        float32 and close to the float64 reference at the same inputs (as check_float32's), and each input's
        gradient (taken outside autocast, as PyTorch recommends) is finite and in that input's dtype."""
        low = AUTOCAST_DTYPES.get(torch.device(device).type, torch.float16)
        inputs = self.make_inputs(device)
        for dtype in (torch.float32, low):
            xs = [x.detach().to(dtype).requires_grad_() for x in inputs]
            with torch.autocast(device, dtype=low):
                outs = self._outputs(self.op(*xs, *self._scalars))
            for what, out in zip(self._value_names, outs):
                if out.dtype != torch.int64:  # (int64 indices stay so)
                    assert out.dtype == torch.float32, f"{what} is {out.dtype} under autocast from {dtype} inputs"
            expected = self._outputs(self.reference(*(x.detach().double() for x in xs), *self._scalars))
            self._assert_values_close([_double(o) for o in outs], expected, rtol=1e-4, atol=1e-5)
            grads = torch.autograd.grad(_total(outs), xs)
            for name, grad, finite in zip(self._names, grads, self._finite_in(dtype, grads, xs)):
                assert grad.dtype == dtype, f"gradient of {name} is {grad.dtype}, its input {dtype}"
                assert finite.all(), f"gradient of {name} under autocast is not finite where it fits {dtype}"

    def _finite_in(
        self, dtype: torch.dtype, grads: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Where each gradient is finite, or is past ``dtype``'s largest value at the float64 reference (as
        autograd's own gradient in that dtype would be: float16 ends at 65504)."""
        finite = [torch.isfinite(g) for g in grads]
        if all(f.all() for f in finite):
            return finite
        moved = [x.detach().double().requires_grad_() for x in inputs]
        expected = self._expected_grads(self.reference(*moved, *self._scalars), moved)
        largest = torch.finfo(dtype).max * (1 - 1e-3)  # float32's rounding may tip a value just below it over
        return [f | (e.abs() >= largest) for f, e in zip(finite, expected)]

    @_quietly
    def check_compiled_model(self, device: str) -> None:
        """A small model using the Module (a learnable scale of the first input, the Module, a sum) under
        torch.compile(fullgraph=True), against the same model in eager: its value and the gradients of
        every parameter, the Module's own included. Skipped as check_compile is."""
        _skip_without_backend(device)
        module, _, inputs = self._module_with_inputs(device)
        if not inputs:
            pytest.skip("the Module takes no input (every tensor is learnable): check_module covers it")
        model = _ScaledModel(module, inputs[0].shape).to(device=device, dtype=torch.float64)
        parameters = list(model.parameters())
        expected = model(*inputs)
        expected_grads = torch.autograd.grad(expected, parameters)
        # The model's forward is the same code for every op: without a reset, a process testing many ops
        # reaches Dynamo's recompile limit (8 compilations of one code object), which fullgraph=True fails on.
        torch.compiler.reset()
        compiled = torch.compile(model, fullgraph=True, backend=COMPILE_BACKEND, dynamic=False)
        value = compiled(*inputs)
        grads = torch.autograd.grad(value, parameters)
        torch.testing.assert_close(value, expected, **CLOSE)
        for (name, _), grad, expected_grad in zip(model.named_parameters(), grads, expected_grads):
            torch.testing.assert_close(grad, expected_grad, **CLOSE, msg=lambda m, n=name: f"gradient of {n}: {m}")


class _ModuleChecks:
    """The nn.Module: its forward against the functional, its sizes, and its parameters' init."""

    @_quietly
    def check_module(self, device: str) -> None:
        """The Module, its learnable inputs set to random values, against the reference; every parameter
        receives a finite gradient."""
        module, args, inputs = self._module_with_inputs(device)
        outs = self._outputs(module(*inputs))
        self._assert_values_close(outs, self._outputs(self.reference(*args, *self._scalars)), **CLOSE)
        _total(outs).backward()
        for i, x in zip(self.inputs, args):
            assert x.grad is not None, f"{i.name} received no gradient"
            assert torch.isfinite(x.grad).all(), f"{i.name}'s gradient is not finite"
        for name in self.scalars:
            assert name in repr(module), f"the Module's repr does not show {name}"

    @_quietly
    def check_module_sizes(self, device: str) -> None:
        """The Module at sizes other than the example's, given by position and by keyword: its parameters
        have those sizes, its repr shows them, and its forward at those sizes equals the functional's (and the
        reference's) with the Module's parameters."""
        other = _other_sizes(self.sizes)
        by_position = self.module(*other.values(), **self.scalars)
        by_keyword = self.module(**other, **self.scalars)
        shapes = [self._sized(i, other) for i in self.inputs]
        for how, module in (("by position", by_position), ("by keyword", by_keyword)):
            for i, shape in zip(self.inputs, shapes):
                if i.learnable:
                    got = tuple(getattr(module, i.name).shape)
                    assert got == shape, f"{i.name} has shape {got}, not {shape}, with the sizes {other} {how}"
            shown = ", ".join(str(v) for v in other.values())
            assert module.extra_repr().startswith(shown), f"the repr {module!r} does not show the sizes {shown}"
        module, args, inputs = self._module_with_inputs(device, by_keyword, shapes)
        outs = self._outputs(module(*inputs))
        self._assert_values_close(outs, self._outputs(self.op(*args, *self._scalars)), **CLOSE)
        self._assert_values_close(outs, self._outputs(self.reference(*args, *self._scalars)), **CLOSE)

    @_quietly
    def check_reset_parameters(self) -> None:
        """The constructor initialises each parameter by its scheme and reset_parameters does again: a
        constant scheme restores the value; a random one draws new values, which, pooled over draws until
        there are :data:`INIT_DRAWS`, lie within the scheme's bounds (exact), cover them, and have about its
        mean and spread. A 0-d parameter with a constant init takes it as a keyword."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            module = self.module(**self.scalars)
            learnable = [i for i in self.inputs if i.learnable]
            drawn = {i.name: [getattr(module, i.name).detach().clone()] for i in learnable}
            with torch.no_grad():
                for i in learnable:
                    getattr(module, i.name).add_(7.0)
            module.reset_parameters()
            for i in learnable:
                value = getattr(module, i.name).detach().clone()
                if i.init.scheme == "constant":
                    assert bool((value == i.init.args[0]).all()), f"reset_parameters does not restore {i.name}"
                else:
                    assert not torch.equal(value, drawn[i.name][0]), f"reset_parameters did not draw {i.name} again"
                drawn[i.name].append(value)
            # A random scheme is drawn again until its values pool to INIT_DRAWS; a constant one needs no more.
            random_schemes = [i for i in learnable if i.init.scheme != "constant"]
            while random_schemes and min(sum(v.numel() for v in drawn[i.name]) for i in random_schemes) < INIT_DRAWS:
                module.reset_parameters()
                for i in random_schemes:
                    drawn[i.name].append(getattr(module, i.name).detach().clone())
        for i in learnable:
            self._assert_init(module, i, torch.cat([v.flatten() for v in drawn[i.name]]))
            if i.init.scheme == "constant" and self._sized(i, {}) == ():
                given = i.init.args[0] + 0.5
                module = self.module(**{i.name: given}, **self.scalars)
                # in the parameter's dtype: 2.2159 is not a float32
                assert bool(getattr(module, i.name) == given), f"the Module does not start from {i.name}={given}"
                with torch.no_grad():
                    getattr(module, i.name).add_(7.0)
                module.reset_parameters()
                assert bool(getattr(module, i.name) == given), f"reset_parameters does not restore {i.name}={given}"

    def _assert_init(self, module: torch.nn.Module, i: Input, values: torch.Tensor) -> None:
        """``values`` (draws of the parameter ``i``, flattened) are what its init scheme gives."""
        init = i.init
        if init.scheme == "constant":
            assert bool((values == init.args[0]).all()), f"{i.name} does not start at {init.args[0]}"
            return
        values = values.double()
        n = values.numel()
        if init.scheme == "normal":
            mean, spread = init.args
        else:
            low, high = _bounds(module, i)
            mean, spread = (low + high) / 2, (high - low) / math.sqrt(12)
            assert bool(((values >= low) & (values <= high)).all()), (
                f"{i.name} is not within [{low}, {high}] ({init.scheme}): {values.min()} to {values.max()}"
            )
            # n uniform draws all miss a strip of width t at either end with probability about n * (1 - t)**n
            t = math.log(n / INIT_MISS) / n
            covered = float(values.max() - values.min()) / (high - low)
            assert covered >= 1 - t, f"{i.name} covers {covered:.3f} of [{low}, {high}] ({init.scheme})"
        std = float(values.std())
        assert abs(std / spread - 1) <= SPREAD_TOLERANCE, f"{i.name} spreads {std}, not about {spread}"
        assert abs(float(values.mean()) - mean) <= 6 * spread / math.sqrt(n), f"{i.name} has mean {values.mean()}"

    def _sized(self, i: Input, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """``i``'s shape in the Module's test with the Module's sizes ``sizes``."""
        shape = i.shape if i.module_shape is None else i.module_shape
        names = i.size_names or (None,) * len(shape)
        return tuple(sizes.get(name, n) for n, name in zip(shape, names))

    def _module_with_inputs(
        self,
        device: str,
        module: torch.nn.Module | None = None,
        shapes: Sequence[tuple[int, ...]] | None = None,
    ) -> tuple[torch.nn.Module, list[torch.Tensor], list[torch.Tensor]]:
        """The Module (default: at its defaults) in float64, its learnable inputs set to random values; every
        tensor argument of the op (the parameters among them); the Module's own inputs, the others. The
        inputs have ``shapes`` (default: their module_shape)."""
        module = (self.module(**self.scalars) if module is None else module).to(device=device, dtype=torch.float64)
        if shapes is None:
            shapes = [i.shape if i.module_shape is None else i.module_shape for i in self.inputs]
        args = []
        for i, x in zip(self.inputs, self.make_inputs(device, shapes=shapes)):
            if i.learnable:
                parameter = getattr(module, i.name)
                assert parameter.shape == x.shape, f"parameter {i.name} has shape {parameter.shape}, not {x.shape}"
                with torch.no_grad():
                    parameter.copy_(x)
                x = parameter
            args.append(x)
        return module, args, [x for i, x in zip(self.inputs, args) if not i.learnable]


@dataclass(frozen=True)
class OpTests(
    _ReferenceChecks, _ExtremeChecks, _TransformChecks, _ModuleChecks, _RowKernelChecks, _Comparisons, _Inputs, _Calls
):
    """The checks of one op: ``function`` (its autograd.Function), ``op`` (the functional entry point),
    ``module`` (the nn.Module) against ``reference``, the forward as written in plain torch, differentiated
    by autograd. The op takes the ``inputs``' tensors, then the ``scalars``' values, in order, and returns
    one tensor, or a tuple of the ``outputs`` where those are named. A tensor with a custom gradient
    (``gradients``) is checked against its formula, not the reference's derivative.

    The checks come in parts, a class per job: :class:`_ReferenceChecks` (values, gradients, a Function's
    rules), :class:`_ExtremeChecks` (the ends of the inputs' ranges), :class:`_TransformChecks` (torch.func,
    torch.compile, autocast), :class:`_ModuleChecks`; over :class:`_Comparisons`, :class:`_Inputs` and
    :class:`_Calls`, which they share."""

    function: type[torch.autograd.Function]
    op: Callable[..., torch.Tensor]
    module: type[torch.nn.Module]
    reference: Callable[..., torch.Tensor]
    inputs: Sequence[Input]
    scalars: Mapping[str, object] = field(default_factory=dict)
    #: Custom gradients: tensor name -> ``f(grad, *tensors, *scalars)`` (one upstream gradient per output),
    #: what backward returns for it in place of the derived gradient, in plain torch (before summing over
    #: broadcast dimensions).
    gradients: Mapping[str, Callable[..., torch.Tensor]] = field(default_factory=dict)
    #: The names of the op's outputs, where it returns several (a tuple), in order.
    outputs: Sequence[str] = ()
    #: The torch.library custom op (``target = "custom_op"``): ``op`` itself, or the op that ``op`` calls
    #: where it also returns the intermediates backward reads; None for a plain Function.
    custom_op: Callable[..., object] | None = None
    #: Fused mode's Triton kernels: the op's <Camel>Rows Function (its ``kernels`` count their launches); None
    #: where it has none.
    rows: type[torch.autograd.Function] | None = None
    #: The sizes the Module's constructor takes, in order, with their defaults (the example's).
    sizes: Mapping[str, int] = field(default_factory=dict)
    #: Whether each output element reads only the inputs' elements at its own position, broadcast together.
    #: False for an op that reduces, normalizes or multiplies matrices: its inputs have shapes of their own
    #: (gradgradcheck takes them as they are, not one broadcast shape), and its values mix across a row
    #: (extreme inputs and special points fill whole tensors, not a column per input).
    elementwise: bool = True

    def __post_init__(self) -> None:
        positions = {k: i.dtype for k, i in enumerate(self.inputs) if i.discrete}
        if not positions:
            return
        # the Function as the checks call it, un-anchored: its own backward is what they check
        function = type(
            self.function.__name__, (), {"apply": staticmethod(_indices(self.function.apply, positions, False))}
        )
        object.__setattr__(self, "function", function)
        for name in ("op", "reference", "custom_op"):
            call = getattr(self, name)
            if call is not None:
                object.__setattr__(self, name, _indices(call, positions))
        module = self.module
        # the Module's forward takes the inputs that are not its parameters
        taken = {k: i.dtype for k, i in enumerate(i for i in self.inputs if not i.learnable) if i.discrete}

        def made(*args, **kwargs):
            instance = module(*args, **kwargs)
            instance.forward = _indices(instance.forward, taken)
            return instance

        object.__setattr__(self, "module", made)


def _indices(call: Callable[..., object], positions: Mapping[int, str], anchored: bool = True) -> Callable[..., object]:
    """``call`` taking the arguments at ``positions`` (int64 and bool inputs, carried by the checks as floats
    of integer value) as their dtype there (:func:`_received`). ``anchored``: each floating-point output also
    depends, with derivative zero, on each such float that requires grad, so that autograd gives it a zero
    gradient as it gives every input."""

    @functools.wraps(call)
    def wrapped(*args, **kwargs):
        args, anchors = list(args), []
        for k in positions:
            if k < len(args) and isinstance(args[k], torch.Tensor) and args[k].is_floating_point():
                anchors += [args[k]] if args[k].requires_grad and anchored else []
                args[k] = _received(args[k], positions[k])
        result = call(*args, **kwargs)
        if not anchors:
            return result
        zero = sum(a.sum() for a in anchors) * 0
        outs = [o + zero.to(o.dtype) if o.is_floating_point() else o for o in _as_tuple(result)]
        return tuple(outs) if isinstance(result, (tuple, list)) else outs[0]

    return wrapped


def _received(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """An int64 or bool input, carried by the checks as floats of integer value, as the op receives it."""
    return x.detach().round().long() if dtype == "int64" else x.detach().round() != 0


def _one_true_per_line(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` with True set where the sum of the indices is a multiple of the least size above 1 (a line along
    a dimension of size n >= that size meets such a place): each such line holds a True, so that no reduced
    row (a masked mean's count) is empty. A line along a dimension of size 1 is one element,
    drawn as it is."""
    sizes = [n for n in mask.shape if n > 1]
    if not sizes:
        return mask
    total = sum(
        torch.arange(n, device=mask.device).reshape([n if k == d else 1 for k in range(mask.dim())])
        for d, n in enumerate(mask.shape)
    )
    return mask | (total % min(sizes) == 0)


@dataclass(frozen=True)
class ProgramTests(OpTests):
    """:class:`OpTests` of an op that is not elementwise (``elementwise=False``), by the name the test files of
    structured ops generated before it was one class for every op import."""

    elementwise: bool = False


def _ties(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """Where two of ``inputs`` are equal or opposite, broadcast together, as a mask of each input's shape
    (set where any element it broadcasts to ties); None where their shapes do not broadcast together."""
    try:
        shape = torch.broadcast_shapes(*(x.shape for x in inputs))
    except RuntimeError:
        return None
    tie = _tie(inputs, shape).double()
    return [tie.sum_to_size(x.shape) > 0 for x in inputs]


def _tie(inputs: Sequence[torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """Where two of ``inputs``, broadcast to ``shape``, are equal or opposite: where a kink between them (Max,
    Min, Abs of a difference) may sit."""
    magnitudes = torch.stack([x.detach().abs().expand(shape) for x in inputs]).sort(dim=0).values
    return (magnitudes[1:] == magnitudes[:-1]).any(dim=0)


def _other_sizes(sizes: Mapping[str, int]) -> dict[str, int]:
    """Sizes other than ``sizes``, each one more (or more still), all distinct: a size taken for another
    shows."""
    taken = set(sizes.values())
    other = {}
    for name, size in sizes.items():
        size += 1
        while size in taken:
            size += 1
        other[name] = size
        taken.add(size)
    return other


def _fans(shape: Sequence[int]) -> tuple[int, int]:
    """torch.nn.init's fan-in and fan-out: dimension 1 and dimension 0 times the receptive field."""
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _bounds(module: torch.nn.Module, i: Input) -> tuple[float, float]:
    """The interval a uniform init scheme draws the parameter ``i`` of ``module`` from."""
    init = i.init
    shape = tuple(getattr(module, i.name).shape)
    if init.scheme == "uniform":
        return init.args[0], init.args[1]
    if init.scheme == "kaiming_uniform":  # a = 0, leaky_relu's gain sqrt(2)
        bound = math.sqrt(2.0) * math.sqrt(3.0 / _fans(shape)[0])
    elif init.scheme == "xavier_uniform":
        bound = math.sqrt(6.0 / sum(_fans(shape)))
    elif init.scheme == "linear" and init.weight:  # a bias: 1/sqrt(fan_in) of its weight
        bound = 1 / math.sqrt(_fans(tuple(getattr(module, init.weight).shape))[0])
    elif init.scheme == "linear":  # kaiming-uniform with a = sqrt(5): gain sqrt(1/3), bound 1/sqrt(fan_in)
        bound = 1 / math.sqrt(_fans(shape)[0])
    else:
        raise ValueError(f"unknown init scheme {init.scheme!r} of {i.name}")
    return -bound, bound


class _ScaledModel(torch.nn.Module):
    """The op's Module inside a model: a learnable scale (ones) of its first input, the Module, the sum of
    its outputs."""

    def __init__(self, module: torch.nn.Module, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(shape))
        self.module = module

    def forward(self, first: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
        return _total(_as_tuple(self.module(self.scale * first, *others)))


def _reference_grads(outs, inputs: Sequence[torch.Tensor], upstream=None, **kwargs) -> list:
    """Autograd's gradients of the reference's outputs ``outs`` (a tensor or a sequence) for their ``upstream``
    gradients: 0 for an input it uses only in a comparison (x > t), where autograd has none."""
    outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
    upstream = (
        [None] * len(outs) if upstream is None else [upstream] if isinstance(upstream, torch.Tensor) else upstream
    )
    pairs = [(o, u) for o, u in zip(outs, upstream) if o.requires_grad]
    if not pairs:
        return [torch.zeros_like(x) for x in inputs]
    outs, upstream = [o for o, _ in pairs], [u for _, u in pairs]
    upstream = None if all(u is None for u in upstream) else upstream
    grads = torch.autograd.grad(outs, inputs, upstream, allow_unused=True, **kwargs)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs)]


def _as_tuple(value: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _total(outs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sum of every element of every floating-point output (not int64 indices, which have no gradient):
    what the checks that need one number differentiate."""
    return sum(o.sum() for o in outs if o.is_floating_point())


def _double(out: torch.Tensor) -> torch.Tensor:
    """A floating-point output in float64, to compare with the reference's; int64 indices as they are."""
    return out.double() if out.is_floating_point() else out


def _upstream(like: Callable[..., torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """``like(out)`` (ones_like, zeros_like) as an upstream gradient of ``out``: zeros in the default
    floating-point dtype for int64 indices, which have no gradient."""
    return like(out) if out.is_floating_point() else torch.zeros(out.shape, device=out.device)


def _random_like(out: torch.Tensor, generator: torch.Generator, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A random upstream gradient of ``out`` (in ``dtype``, default its own); zeros for int64 indices."""
    if not out.is_floating_point():
        return _upstream(torch.zeros_like, out)
    return torch.randn(out.shape, generator=generator, dtype=dtype or out.dtype).to(out.device)


def _grads_or_zeros(out: torch.Tensor, inputs: Sequence[torch.Tensor], weights: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of ``(out * weights).sum()``, zeros where ``out`` does not depend on an input (or the
    input requires none: an int64 output's upstream gradient)."""
    differentiated = [x for x in inputs if x.requires_grad]
    if not out.requires_grad or not differentiated:
        return [torch.zeros_like(x) for x in inputs]
    grads = iter(torch.autograd.grad(out, differentiated, weights, allow_unused=True, retain_graph=True))
    found = [next(grads) if x.requires_grad else None for x in inputs]
    return [torch.zeros_like(x) if g is None else g for g, x in zip(found, inputs)]


def _nearest(values: Sequence[float], target: float) -> float:
    """The value nearest to ``target`` on a scale that is logarithmic on each side of 0 (1e-4 is nearest to
    1e-3, not to -1e-3)."""
    return min(values, key=lambda v: abs(math.asinh(v * 1e3) - math.asinh(target * 1e3)))


class _Overflows(torch.overrides.TorchFunctionMode):
    """Marks the inputs (rows of 1-d columns) at which an intermediate value of the code it runs is inf or
    nan."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows = torch.zeros(rows, dtype=torch.bool)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.is_floating_point() and out.shape == self.rows.shape:
            self.rows |= ~torch.isfinite(out.detach()).cpu()
        return out


def _skip_without_backend(device: str) -> None:
    """Skip a compile check where the backend itself cannot compile even ``x + 1``: that says nothing
    about the op."""
    unavailable = _backend_unavailable(COMPILE_BACKEND, device)
    if unavailable:
        pytest.skip(
            f"torch.compile's {COMPILE_BACKEND} backend does not work here ({unavailable}); "
            "SCAFFOLD_COMPILE_BACKEND=aot_eager checks the tracing without it"
        )


@functools.cache
def _backend_unavailable(backend: str, device: str) -> str:
    """Why torch.compile with ``backend`` cannot compile a trivial function on ``device`` ("" if it can); once
    per backend and device in a process (kept by both, so that a check under another backend asks again)."""
    try:
        torch.compile(lambda x: x + 1, backend=backend, fullgraph=True)(torch.ones(2, device=device))
    except Exception as exc:  # noqa: BLE001 - a missing compiler, an unsupported platform: anything but the op
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return ""


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """Keeps torch's own deprecation notices out of the user's test output: torch.func registers its jvp
    decompositions through the deprecated torch.jit.script on first use."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.* is deprecated", category=DeprecationWarning)
        # torch 2.14 says it as a FutureWarning
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.* is deprecated", category=FutureWarning)
        yield
