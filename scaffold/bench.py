"""Benchmarks: how the generated op compares with the same math in plain PyTorch.

One spec, several candidates, each called with the same inputs (tensors, then the scalars' defaults):

    scaffold eager         the generated op (fuse = false)
    scaffold fused         the generated op with fuse = true (its math through torch.compile)
    scaffold out of place  the generated op without stage 6b's in-place temporaries (on request: what
                           computing in place gains)
    plain autograd         the forward as written, in plain torch, differentiated by autograd
    plain torch.compile    that, under torch.compile
    native <name>          a PyTorch op the user names, e.g. torch.nn.functional.gelu

For each: the forward time (with requires_grad inputs, so building the graph counts), the forward plus
``torch.autograd.grad`` time, both as median and interquartile range from :mod:`torch.utils.benchmark`,
and the bytes autograd keeps for backward, counted by ``saved_tensors_hooks`` (each storage once, inputs
included). Compiling happens while warming up; a candidate that fails there gets a note, not a crash.
The candidates take turns being timed, in a few rounds, so that a change in the machine's load while
the benchmark runs falls on all of them rather than on one.

This module imports torch; the command line imports it only for ``scaffold bench``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import platform
import statistics
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils import benchmark

from .api import compile_op, generate_op
from .domain import InputDomain
from .errors import BenchError, SpecError
from .expression import parse_forward
from .limits import TIME_LIMIT, run_with_time_limit
from .program import build_program
from .project import find_project
from .render import reference_module, render_runtime
from .spec import RUNTIME_MODULE, OpSpec, check_identifier
from .testing import _one_true_per_line

#: Elements of the largest input by default: 4 Mi float32 values are 16 MiB, beyond most CPU caches.
DEFAULT_NUMEL = 4 * 1024 * 1024
DEFAULT_MIN_TIME = 1.0
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}

EAGER = "scaffold eager"
FUSED = "scaffold fused"
OUT_OF_PLACE = "scaffold out of place"
PLAIN = "plain autograd"
COMPILED = "plain torch.compile"
NATIVE_PREFIX = "native "

AVOID_MARGIN = 0.05  # as in the generated tests: inputs keep this far from kinks and poles
WARMUP_CALLS = 3
#: The candidates take turns being timed, this many times each (see _time_interleaved).
ROUNDS = 10
SEED = 0
#: Outputs further apart than this (relative and absolute) from plain autograd's get a note.
_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}


@dataclass(frozen=True)
class Timing:
    """The :class:`torch.utils.benchmark.Measurement` of one candidate, its rounds merged; seconds per call."""

    median: float
    iqr: float
    runs: int  # timed blocks the median is over
    rounds: tuple[float, ...] = ()  # the median of each round, in the order the rounds ran

    @classmethod
    def of(cls, measurement: benchmark.Measurement, rounds: tuple[float, ...] = ()) -> Timing:
        return cls(median=measurement.median, iqr=measurement.iqr, runs=len(measurement.times), rounds=rounds)


@dataclass(frozen=True)
class BenchRow:
    """One candidate; ``forward``, ``fwd_bwd`` and ``saved_bytes`` are None where it could not be measured."""

    name: str
    forward: Timing | None = None
    fwd_bwd: Timing | None = None
    saved_bytes: int | None = None
    note: str = ""


@dataclass(frozen=True)
class BenchReport:
    """What :func:`bench_op` measured and where; ``rows`` in the order the candidates are listed above."""

    op: str
    device: str
    dtype: str
    numel: int
    shapes: dict[str, tuple[int, ...]]
    machine: str
    torch_version: str
    threads: int
    min_time: float
    rounds: int
    rows: tuple[BenchRow, ...]

    def row(self, name: str) -> BenchRow | None:
        return next((r for r in self.rows if r.name == name), None)

    @property
    def baseline(self) -> BenchRow | None:
        return self.row(PLAIN)


# --- choosing what to run ----------------------------------------------------------------------------


_DTYPE_HINT = f"use one of {', '.join(DTYPES)}"


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise BenchError(f"dtype {dtype} is not a floating type scaffold benchmarks", hint=_DTYPE_HINT)
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise BenchError(f"unknown dtype {dtype!r}", hint=_DTYPE_HINT)
    return DTYPES[name]


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch.device, after checking a tensor can live there."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BenchError(f"unknown device {str(device)!r}: {_first_line(exc)}", hint="e.g. cpu, cuda, cuda:1") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise BenchError("CUDA is not available on this machine", hint="use --device cpu, or run it where a GPU is")
    try:
        torch.empty(1, device=resolved)
    except (RuntimeError, AssertionError) as exc:
        raise BenchError(f"device {str(device)!r} is not available: {_first_line(exc)}", hint="use cpu") from None
    return resolved


def resolve_native(dotted: str) -> Callable[..., Any]:
    """The callable a dotted name such as ``torch.nn.functional.gelu`` names; imported, never evaluated."""
    parts = dotted.strip().split(".")
    hint = "give the full dotted name of a callable, e.g. torch.nn.functional.gelu or torch.special.erf"
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise BenchError(f"cannot read the native op {dotted!r}", hint=hint)
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            target: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                continue  # that prefix is not a module: try a shorter one
            raise BenchError(f"importing {module_name} for {dotted} failed: {exc}", hint=hint) from None
        except Exception as exc:
            raise BenchError(f"importing {module_name} for {dotted} failed: {_first_line(exc)}", hint=hint) from None
        for index, attribute in enumerate(parts[split:], start=split):
            if not hasattr(target, attribute):
                found = ".".join(parts[:index])
                raise BenchError(f"{found} has no attribute {attribute!r}, so {dotted} does not exist", hint=hint)
            target = getattr(target, attribute)
        if not callable(target):
            raise BenchError(f"{dotted} is not callable (it is a {type(target).__name__})", hint=hint)
        return target
    raise BenchError(f"no module {parts[0]!r} to find {dotted} in", hint=hint)


def load_project_spec(name: str, start: str | Path = ".") -> OpSpec:
    """The spec of op ``name`` of the project containing ``start`` (its specs/NAME.toml)."""
    name = check_identifier(name, what="op name", where="scaffold bench")
    project = find_project(start)
    if project is None:
        raise SpecError(
            f"cannot find the op {name!r}: not inside a scaffold project",
            where=str(Path(start).resolve()),
            hint=f"pass the spec file, e.g. scaffold bench --spec {name}.toml, or run it inside a project",
        )
    known = ", ".join(project.spec_names()) or "none"
    return project.load_op_spec(name, missing_hint=f"the project's ops: {known}")


# --- inputs ------------------------------------------------------------------------------------------


def scaled_shapes(
    shapes: Sequence[tuple[int, ...]], numel: int, learnable: Sequence[bool] | None = None
) -> list[tuple[int, ...]]:
    """The spec's example shapes grown so that the broadcast result has about ``numel`` elements.

    The broadcast shape ``B`` of all the shapes becomes ``(numel // prod(B[1:]), *B[1:])``; each shape
    keeps its own dimensions except one aligned (from the right) with ``B``'s leading dimension and of
    its size, which takes the new leading size. Where every shape is 0-dim, the tensors become
    ``(numel,)``, except learnable ones (parameters), which stay 0-dim.
    """
    if numel < 1:
        raise BenchError(f"numel must be positive, got {numel}")
    learnable = list(learnable) if learnable is not None else [False] * len(shapes)
    try:
        broadcast = tuple(torch.broadcast_shapes(*shapes)) if shapes else ()
    except RuntimeError:
        listed = ", ".join(str(list(shape)) for shape in shapes)
        raise BenchError(
            f"the example shapes {listed} do not broadcast together", hint="fix the spec's shapes"
        ) from None
    if not broadcast:
        return [() if learn else (numel,) for learn in learnable]
    lead = max(1, numel // math.prod(broadcast[1:]))
    out = []
    for shape in shapes:
        aligned = len(shape) == len(broadcast) and shape[0] == broadcast[0]
        out.append((lead, *shape[1:]) if aligned else tuple(shape))
    return out


def scaled_program_shapes(spec: OpSpec, numel: int) -> list[tuple[int, ...]]:
    """The example shapes of a structured op with its batch dimension grown, so that the largest value the
    forward computes (an input, a step or an output) has about ``numel`` elements.

    The batch dimension is the first tensor's first one: it grows in every tensor whose first dimension
    has that size (and in no parameter). Where even the example is larger, the example shapes are kept.
    """
    first = spec.tensors[0].shape
    if not first:
        return [tuple(t.shape) for t in spec.tensors]
    batch = first[0]

    def shapes(size: int) -> list[tuple[int, ...]]:
        return [
            (size, *t.shape[1:]) if t.shape and t.shape[0] == batch and not t.learnable else tuple(t.shape)
            for t in spec.tensors
        ]

    def largest(size: int) -> int:
        tensors = tuple(dataclasses.replace(t, shape=s, size_names=()) for t, s in zip(spec.tensors, shapes(size)))
        grown = dataclasses.replace(spec, tensors=tensors, sizes=())
        program = build_program(parse_forward(grown), grown)
        return max(math.prod(v.shape) for v in program.values)

    low, high = 1, max(1, numel)  # the largest multiple k of the batch size with largest(k * batch) <= numel
    if largest(batch) > numel:
        return shapes(batch)
    while low < high:
        middle = (low + high + 1) // 2
        if largest(batch * middle) <= numel:
            low = middle
        else:
            high = middle - 1
    return shapes(batch * low)


def minimal_traffic(spec: OpSpec, numel: int, dtype: torch.dtype) -> int:
    """The bytes forward + backward must move at least, at the benchmark's shapes (:func:`make_inputs`):
    forward reads the inputs and writes the outputs, backward reads the upstream gradients (the outputs'
    size) and the inputs and writes the inputs' gradients: 3 x the inputs' bytes + 2 x the outputs'."""
    shapes = scaled_program_shapes(spec, numel) if spec.structured else None
    if shapes is None:
        shapes = scaled_shapes([t.shape for t in spec.tensors], numel, [t.learnable for t in spec.tensors])
    tensors = tuple(dataclasses.replace(t, shape=s, size_names=()) for t, s in zip(spec.tensors, shapes))
    grown = dataclasses.replace(spec, tensors=tensors, sizes=())
    program = build_program(parse_forward(grown), grown)
    outputs = sum(math.prod(program.value(o.value).shape) for o in program.outputs)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return (3 * sum(math.prod(s) for s in shapes) + 2 * outputs) * itemsize


def copy_bandwidth(device: torch.device, dtype: torch.dtype = torch.float32, numel: int = 64 * 2**20) -> float:
    """Bytes per second a device-to-device copy of ``numel`` elements moves, read and written counted: the
    ceiling that :func:`minimal_traffic` is measured against."""
    x = torch.empty(numel, device=device, dtype=dtype)
    y = torch.empty_like(x)
    timer = benchmark.Timer("y.copy_(x)", globals={"x": x, "y": y})
    seconds = timer.blocked_autorange(min_run_time=0.2).median
    return 2 * x.numel() * x.element_size() / seconds


def _uniform(shape: tuple[int, ...], domain: InputDomain, generator: torch.Generator) -> torch.Tensor:
    x = torch.rand(shape, generator=generator, dtype=torch.float64) * (domain.high - domain.low) + domain.low
    for point in domain.avoid:
        near = (x - point).abs() < AVOID_MARGIN
        x = torch.where(near, point + torch.where(x < point, -2.0, 2.0) * AVOID_MARGIN, x)
    return x


def make_inputs(
    spec: OpSpec,
    domains: Sequence[InputDomain],
    *,
    numel: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = SEED,
) -> list[torch.Tensor]:
    """Seeded inputs, uniform in their domains and away from the points to avoid, requiring grad; an int64
    tensor's integers in its domain and a bool tensor's True and False (a True in each line, as the
    generated tests draw it), which take no gradient."""
    by_name = {d.name: d for d in domains}
    if spec.structured:
        shapes = scaled_program_shapes(spec, numel)
    else:
        shapes = scaled_shapes([t.shape for t in spec.tensors], numel, [t.learnable for t in spec.tensors])
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for t, shape in zip(spec.tensors, shapes):
        if t.integer:
            tensors.append(torch.randint(t.domain[0], t.domain[1] + 1, shape, generator=generator).to(device))
        elif t.boolean:
            tensors.append(_one_true_per_line(torch.rand(shape, generator=generator) < 0.5).to(device))
        else:
            tensors.append(_uniform(shape, by_name[t.name], generator).to(device=device, dtype=dtype).requires_grad_())
    return tensors


# --- the candidates ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sources:
    eager: str
    fused: str | None
    fused_error: str
    reference: str
    domains: tuple[InputDomain, ...]
    out_of_place: str | None = None


def _sources(spec: OpSpec, fused: bool, out_of_place: bool = False) -> _Sources:
    """The generated modules and the reference; the symbolic work, run in a worker under a time limit."""
    op = compile_op(spec)
    eager_spec = dataclasses.replace(spec, fuse=False)
    eager = generate_op(eager_spec, time_limit=None)[f"{spec.name}.py"]
    unrewritten = generate_op(eager_spec, time_limit=None, in_place=False)[f"{spec.name}.py"] if out_of_place else None
    fused_source, fused_error = None, ""
    if fused:
        try:
            fused_source = generate_op(dataclasses.replace(spec, fuse=True), time_limit=None)[f"{spec.name}.py"]
        except Exception as exc:  # the eager op exists: report the fused one as unavailable
            fused_error = f"generating it failed: {_first_line(exc)}"
    reference = reference_module(eager_spec, op.parsed)
    return _Sources(eager, fused_source, fused_error, reference, op.domains, unrewritten)


@contextmanager
def _modules() -> Iterator[Callable[[str, str], ModuleType]]:
    """``load(source, name)`` imports source as a fresh module; everything is removed on exit.

    A generated module imports the runtime (``_scaffold_runtime``): it gets this scaffold's, loaded once,
    not one that the process may have imported from elsewhere."""
    loaded: list[str] = []
    with tempfile.TemporaryDirectory(prefix="scaffold-bench-") as folder:

        def exec_file(source: str, module_name: str) -> ModuleType:
            path = Path(folder) / f"{module_name}.py"
            path.write_text(source, encoding="utf-8")
            spec = importlib.util.spec_from_file_location(module_name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            loaded.append(module_name)
            spec.loader.exec_module(module)
            return module

        runtime = exec_file(render_runtime(), f"_scaffold_bench_runtime_{uuid.uuid4().hex[:8]}")

        def load(source: str, name: str) -> ModuleType:
            other = sys.modules.get(RUNTIME_MODULE)
            sys.modules[RUNTIME_MODULE] = runtime
            try:
                return exec_file(source, f"_scaffold_bench_{name}_{uuid.uuid4().hex[:8]}")
            finally:
                if other is None:
                    del sys.modules[RUNTIME_MODULE]
                else:
                    sys.modules[RUNTIME_MODULE] = other

        try:
            yield load
        finally:
            for module_name in loaded:
                sys.modules.pop(module_name, None)


@dataclass(frozen=True)
class _Candidate:
    name: str
    fn: Callable[..., Any] | None
    compiles: bool = False
    note: str = ""  # why fn is None


def _native_candidate(native: str | Callable[..., Any], native_name: str | None) -> _Candidate:
    if isinstance(native, str):
        return _Candidate(NATIVE_PREFIX + (native_name or native.strip()), resolve_native(native))
    if not callable(native):
        raise BenchError(f"native must be a dotted name or a callable, got {native!r}")
    label = native_name or f"{getattr(native, '__module__', None) or ''}.{getattr(native, '__name__', repr(native))}"
    return _Candidate(NATIVE_PREFIX + label.lstrip("."), native)


# --- measuring ---------------------------------------------------------------------------------------


def _fwd_bwd(fn: Callable[..., Any], args: tuple, tensors: tuple, grad_out: tuple[torch.Tensor, ...]) -> None:
    torch.autograd.grad(_outputs(fn(*args)), tensors, grad_out, allow_unused=True)


def _outputs(out: Any) -> tuple[Any, ...]:
    """An op's outputs as a tuple (an op with several returns one)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def saved_bytes(fn: Callable[..., Any], args: Sequence[Any]) -> int:
    """Bytes of the tensors autograd keeps for the backward of ``fn(*args)``, each storage counted once.

    Counts what goes through ``saved_tensors_hooks``: tensors saved by built-in ops and by custom
    Functions' ``save_for_backward`` (inputs included), not tensors kept as Python attributes.
    """
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn(*args)
    del out
    return sum(storages.values())


@dataclass
class _Ready:
    """A candidate that ran: what it needs to be timed, and what is known so far."""

    name: str
    fn: Callable[..., Any]
    env: dict[str, Any]
    notes: list[str]
    forward: list[benchmark.Measurement] = dataclasses.field(default_factory=list)
    fwd_bwd: list[benchmark.Measurement] = dataclasses.field(default_factory=list)


def _warm_up(candidate: _Candidate, args: tuple, tensors: tuple, expected: torch.Tensor | None) -> _Ready | BenchRow:
    """The candidate ready to be timed after a few calls (which compile what compiles), or its row
    saying why it is not available."""
    if candidate.fn is None:
        return BenchRow(candidate.name, note=candidate.note)
    fn = candidate.fn
    # Warnings (a compile that failed and fell back to eager, say) become notes in the table.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            out = fn(*args)
            generator = torch.Generator().manual_seed(SEED + 1)
            grad_out = tuple(
                torch.randn(o.shape, generator=generator, dtype=torch.float64).to(o.device, o.dtype)
                for o in _outputs(out)
            )
            for _ in range(WARMUP_CALLS):
                _fwd_bwd(fn, args, tensors, grad_out)
        except Exception as exc:
            return BenchRow(candidate.name, note=f"not available: {type(exc).__name__}: {_first_line(exc)}")
    notes = [_difference(out, expected)] if expected is not None else []
    notes += dict.fromkeys(f"warning: {_first_line(w.message)}" for w in caught if issubclass(w.category, UserWarning))
    env = {"fn": fn, "args": args, "tensors": tensors, "grad_out": grad_out, "fwd_bwd": _fwd_bwd}
    return _Ready(candidate.name, fn, env, [n for n in notes if n])


_STATEMENTS = {"forward": "fn(*args)", "fwd_bwd": "fwd_bwd(fn, args, tensors, grad_out)"}


def _time_interleaved(ready: list[_Ready], *, min_time: float, rounds: int, say: Callable[[str], None]) -> None:
    """Time every candidate, ``min_time`` seconds in all, in ``rounds`` taking turns.

    Taking turns rather than one candidate after the other spreads any change in the machine's load
    (another process starting) over all of them, so that their ratios stay meaningful; each round starts
    with the next candidate, so that none always runs first (after another's memory was freed).
    """
    for phase, label in (("forward", "forward"), ("fwd_bwd", "forward + backward")):
        threads = torch.get_num_threads()
        timers = [benchmark.Timer(stmt=_STATEMENTS[phase], globals=r.env, num_threads=threads) for r in ready]
        turns = list(zip(ready, timers))
        for round_ in range(rounds):
            say(f"timing {label}, round {round_ + 1}/{rounds}...")
            start = round_ % len(turns)
            for r, timer in turns[start:] + turns[:start]:
                getattr(r, phase).append(timer.blocked_autorange(min_run_time=min_time / rounds))


def _merged(measurements: list[benchmark.Measurement]) -> Timing:
    (merged,) = benchmark.Measurement.merge(measurements)
    return Timing.of(merged, tuple(m.median for m in measurements))


def _finish(r: _Ready, args: tuple) -> BenchRow:
    try:
        saved: int | None = saved_bytes(r.fn, args)
    except Exception as exc:
        saved = None
        r.notes.append(f"saved bytes not measured: {_first_line(exc)}")
    return BenchRow(r.name, _merged(r.forward), _merged(r.fwd_bwd), saved, "; ".join(r.notes))


def _difference(out: Any, expected: torch.Tensor | tuple[torch.Tensor, ...]) -> str:
    """A note when ``out`` is not the plain forward's output, e.g. a native op with other defaults."""
    if isinstance(expected, tuple):
        if not isinstance(out, tuple) or len(out) != len(expected):
            return f"returns {type(out).__name__}, not plain autograd's {len(expected)} outputs"
        return "; ".join(filter(None, (_difference(o, e) for o, e in zip(out, expected))))
    if not isinstance(out, torch.Tensor) or out.shape != expected.shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return f"output {shape} is not shaped like plain autograd's {tuple(expected.shape)}"
    tolerance = _TOLERANCE.get(expected.dtype, 1e-3)
    if torch.allclose(out.detach().to(expected.dtype), expected, rtol=tolerance, atol=tolerance, equal_nan=True):
        return ""
    gap = (out.detach().double() - expected.double()).abs().nan_to_num(nan=math.inf).max().item()
    return f"output differs from plain autograd's (max abs difference {gap:.3g})"


# --- the benchmark -----------------------------------------------------------------------------------


def bench_op(
    spec: OpSpec,
    *,
    device: str | torch.device = "cpu",
    numel: int = DEFAULT_NUMEL,
    dtype: str | torch.dtype = torch.float32,
    native: str | Callable[..., Any] | None = None,
    native_name: str | None = None,
    compile: bool = True,
    min_time: float = DEFAULT_MIN_TIME,
    rounds: int = ROUNDS,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
    time_limit: float | None = TIME_LIMIT,
    out_of_place: bool = False,
) -> BenchReport:
    """Time the op of ``spec`` against plain PyTorch (and ``native``, a dotted name or a callable).

    ``compile=False`` skips the candidates that need torch.compile (scaffold fused, plain torch.compile).
    Each candidate's forward, and its forward + backward, are timed for at least ``min_time`` seconds
    in all, in ``rounds`` where the candidates take turns, on ``threads`` CPU threads (default: torch's
    setting). ``progress`` receives one line per step. The symbolic work runs in a worker stopped after
    ``time_limit`` seconds (None: here, no limit). ``out_of_place`` adds the generated op without its
    in-place temporaries, the measure of what they gain.
    """
    torch_device, torch_dtype = resolve_device(device), resolve_dtype(dtype)
    if not min_time > 0:
        raise BenchError(f"min_time must be a positive number of seconds, got {min_time!r}")
    if rounds < 1 or (threads is not None and threads < 1):
        raise BenchError(f"rounds and threads must be at least 1, got {rounds!r} and {threads!r}")
    native_candidate = _native_candidate(native, native_name) if native is not None else None
    say = progress or (lambda message: None)
    say(f"deriving {spec.name}...")
    sources = _derive(spec, compile, time_limit, out_of_place)
    inputs = make_inputs(spec, sources.domains, numel=numel, device=torch_device, dtype=torch_dtype)
    args = (*inputs, *(s.default for s in spec.scalars))
    threads = threads or torch.get_num_threads()
    with _torch_threads(threads), _modules() as load:
        reference = load(sources.reference, f"{spec.name}_reference").reference
        candidates = _candidates(load, spec, sources, reference, compile, native_candidate)
        floats = tuple(x for x in inputs if x.requires_grad)  # the int64 and bool tensors take no gradient
        rows = _run(candidates, reference, args, floats, min_time=min_time, rounds=rounds, say=say)
        machine = machine_description(torch_device)
    return BenchReport(
        op=spec.name,
        device=str(torch_device),
        dtype=str(torch_dtype).removeprefix("torch."),
        numel=numel,
        shapes={t.name: tuple(x.shape) for t, x in zip(spec.tensors, inputs)},
        machine=machine,
        torch_version=torch.__version__,
        threads=threads,
        min_time=min_time,
        rounds=rounds,
        rows=tuple(rows),
    )


def _derive(spec: OpSpec, fused: bool, time_limit: float | None, out_of_place: bool) -> _Sources:
    if time_limit is None:
        return _sources(spec, fused, out_of_place)
    where = f"{spec.source}: forward"
    args = (spec, fused, out_of_place)
    return run_with_time_limit(_sources, args, seconds=time_limit, where=where, what="deriving the op")


@contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _candidates(
    load: Callable[[str, str], ModuleType],
    spec: OpSpec,
    sources: _Sources,
    reference: Callable[..., Any],
    compile: bool,
    native: _Candidate | None,
) -> list[_Candidate]:
    candidates = [_Candidate(EAGER, getattr(load(sources.eager, spec.name), spec.name))]
    if sources.out_of_place is not None:
        unrewritten = load(sources.out_of_place, f"{spec.name}_out_of_place")
        candidates.append(_Candidate(OUT_OF_PLACE, getattr(unrewritten, spec.name)))
    if compile:
        fused = getattr(load(sources.fused, f"{spec.name}_fused"), spec.name) if sources.fused else None
        candidates.append(_Candidate(FUSED, fused, compiles=True, note=f"not available: {sources.fused_error}"))
    candidates.append(_Candidate(PLAIN, reference))
    if compile:
        candidates.append(_Candidate(COMPILED, torch.compile(reference), compiles=True))
    if native is not None:
        candidates.append(native)
    return candidates


def _run(
    candidates: list[_Candidate],
    reference: Callable[..., Any],
    args: tuple,
    tensors: tuple,
    *,
    min_time: float,
    rounds: int,
    say: Callable[[str], None],
) -> list[BenchRow]:
    """Warm every candidate up, time those that ran in turns, then count what each saves for backward."""
    expected = reference(*args)
    expected = tuple(e.detach() for e in expected) if isinstance(expected, tuple) else expected.detach()
    warmed: list[_Ready | BenchRow] = []
    for index, candidate in enumerate(candidates, start=1):
        compiling = " (compiling)" if candidate.compiles else ""
        say(f"[{index}/{len(candidates)}] {candidate.name}: warming up{compiling}...")
        warmed.append(_warm_up(candidate, args, tensors, None if candidate.name == PLAIN else expected))
    del expected
    ready = [w for w in warmed if isinstance(w, _Ready)]
    _time_interleaved(ready, min_time=min_time, rounds=rounds, say=say)
    say("measuring the bytes saved for backward...")
    return [_finish(w, args) if isinstance(w, _Ready) else w for w in warmed]


# --- reporting ---------------------------------------------------------------------------------------


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_description(device: str | torch.device = "cpu") -> str:
    """E.g. ``AMD EPYC (2 cores), torch 2.13.0, 2 threads`` or the GPU's name for a CUDA device."""
    device = torch.device(device)
    cpu = f"{cpu_name()} ({os.cpu_count()} cores)"
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        return f"{gpu} (CUDA {torch.version.cuda}), host {cpu}, torch {torch.__version__}"
    threads = torch.get_num_threads()
    return f"{cpu}, torch {torch.__version__}, {threads} thread{'s' if threads != 1 else ''}"


def ratio(value: float | int | None, baseline: float | int | None) -> float | None:
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline


def time_ratio(timing: Timing | None, baseline: Timing | None) -> float | None:
    """How many times ``baseline``'s time ``timing`` takes: the median over the rounds of the ratio within
    each round, where both were timed in turn under the same load (a busy second of a shared machine slows
    one round of both, not one candidate); the ratio of the medians where the rounds do not pair up."""
    if timing is None or baseline is None:
        return None
    pairs = [(t, b) for t, b in zip(timing.rounds, baseline.rounds) if b > 0]
    if len(timing.rounds) != len(baseline.rounds) or not pairs:
        return ratio(timing.median, baseline.median)
    return statistics.median(t / b for t, b in pairs)


def time_unit(report: BenchReport) -> tuple[str, float]:
    """The unit the report's times read best in, and seconds' factor to it: ms, or µs for tiny inputs."""
    medians = [t.median for row in report.rows for t in (row.forward, row.fwd_bwd) if t is not None]
    return ("ms", 1e3) if min(medians, default=1.0) >= 1e-4 else ("µs", 1e6)


def format_timing(timing: Timing | None, scale: float = 1e3) -> str:
    """``median ± IQR`` in seconds times ``scale``, to about three significant digits of the median."""
    if timing is None:
        return "n/a"
    median, iqr = timing.median * scale, timing.iqr * scale
    decimals = min(4, max(0, 2 - math.floor(math.log10(median)))) if median > 0 else 0
    return f"{median:.{decimals}f} ± {iqr:.{decimals}f}"


def format_bytes(count: int | None) -> str:
    if count is None:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def format_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def format_table(report: BenchReport) -> str:
    """A markdown table of ``report``, under lines saying what was measured where."""
    shapes = ", ".join(f"{name} {tuple(shape)}" for name, shape in report.shapes.items())
    unit, scale = time_unit(report)
    lines = [
        f"scaffold bench {report.op}: {report.device}, {report.dtype}, {report.numel:,} elements",
        f"machine: {report.machine}",
        f"inputs: {shapes}",
        f"times: {unit} per call, median ± IQR, each timed for at least {report.min_time:g} s in {report.rounds} "
        "rounds taking turns; ratios are to plain autograd, the median of the rounds' ratios (lower is better)",
        "",
        f"| candidate | forward ({unit}) | fwd+bwd ({unit}) | fwd+bwd vs plain | saved for backward | saved vs plain "
        "| note |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    base = report.baseline
    for row in report.rows:
        fwd_bwd_ratio = time_ratio(row.fwd_bwd, base.fwd_bwd if base else None)
        bytes_ratio = ratio(row.saved_bytes, base.saved_bytes if base else None)
        cells = [
            row.name,
            format_timing(row.forward, scale),
            format_timing(row.fwd_bwd, scale),
            format_ratio(fwd_bwd_ratio),
            format_bytes(row.saved_bytes),
            format_ratio(bytes_ratio),
            row.note.replace("|", "\\|"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _first_line(exc: BaseException | Warning) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = [
    "BenchError", "BenchReport", "BenchRow", "Timing", "bench_op", "format_table", "load_project_spec",
    "machine_description", "make_inputs", "resolve_native", "saved_bytes", "scaled_shapes",
]  # fmt: skip
