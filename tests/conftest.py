from __future__ import annotations

import importlib
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

# torch.compile's and Triton's on-disk caches, fresh for the session (the processes it forks inherit them): a
# session compiles as CI's fresh machine does, however warm this machine's caches (/tmp/torchinductor_USER,
# ~/.triton), and writes nothing there. Set either variable to reuse a cache of your own.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="scaffold-inductor-"))
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="scaffold-triton-"))

import torch  # noqa: E402 (after the caches are chosen)

# Fused ops' Triton kernels run on the CPU in Triton's interpreter, which must be on before anything imports
# Triton (torch.compile does): as a generated test file turns it on, where there is no GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from scaffold import generate_op, spec_from_mapping, write_files
from scaffold.render import render_runtime
from scaffold.spec import RUNTIME_FILE

try:
    from .forked_pytest import PytestRun
    from .forked_pytest import context as forked_pytest_context
except ImportError:  # tests/ run as a plain folder, not a package
    from forked_pytest import PytestRun
    from forked_pytest import context as forked_pytest_context

SPECS = Path(__file__).parent / "specs"

# A generated module imports the runtime written beside it (_scaffold_runtime.py, the same text for every op).
# Tests that load a module from its path alone, or write the module without it, find this one (appended:
# a folder the test put first wins, and every copy of this scaffold's runtime is the same anyway).
_RUNTIME_DIR = tempfile.mkdtemp(prefix="scaffold-runtime-")
(Path(_RUNTIME_DIR) / RUNTIME_FILE).write_text(render_runtime(), encoding="utf-8")
sys.path.append(_RUNTIME_DIR)

#: SCAFFOLD_THOROUGH=1 runs the property tests on their full example sets (minutes more); the default keeps
#: the suite within its time on CI's two cores, with the same derandomized examples, fewer of them.
THOROUGH = os.environ.get("SCAFFOLD_THOROUGH") == "1"


def examples(default: int, thorough: int) -> int:
    """How many examples a property test draws: ``thorough`` under SCAFFOLD_THOROUGH=1, else ``default``."""
    return thorough if THOROUGH else default


def make_spec(name: str, forward: str, tensors: dict | None = None, scalars: dict | None = None, **extra):
    return spec_from_mapping(
        {"name": name, "forward": forward, "tensors": tensors or {"x": {}}, "scalars": scalars or {}, **extra},
        source=f"{name}.toml",
    )


def run_pytest(directory: Path, *args: str, compile_backend: str = "aot_eager") -> subprocess.CompletedProcess:
    """Run the generated tests in ``directory`` in a fresh interpreter (one process for all files).

    Their torch.compile check traces with ``compile_backend``: aot_eager runs Dynamo and AOTAutograd as
    inductor does, without compiling C++ for every op (seconds each); test_generate runs inductor.
    """
    return BackgroundPytest(directory, *args, compile_backend=compile_backend).wait()


class BackgroundPytest(PytestRun):
    """A pytest run of the generated tests in ``directory`` (a fresh process: tests/forked_pytest.py), started
    now and waited for later (:func:`run_pytest` waits at once), so that the calling test process can go on
    with other tests meanwhile: two cores, the generated tests in one, the suite in the other."""

    def __init__(self, directory: Path, *args: str, compile_backend: str = "aot_eager") -> None:
        env = {**os.environ, "SCAFFOLD_COMPILE_BACKEND": compile_backend}
        super().__init__(directory, ["-q", "-p", "no:cacheprovider", "-W", "ignore::UserWarning", *args], env)


def import_generated(directory: Path, spec):
    """Generate ``spec`` into ``directory`` and import its module (by the op's name)."""
    write_files(generate_op(spec), directory)
    sys.path.insert(0, str(directory))
    try:
        return importlib.import_module(spec.name)
    finally:
        sys.path.remove(str(directory))


@pytest.fixture
def generate(tmp_path: Path):
    """Generate an op from (name, forward, tensors, scalars) into tmp_path; return the directory."""

    def _generate(*args, **kwargs) -> Path:
        spec = make_spec(*args, **kwargs)
        write_files(generate_op(spec), tmp_path)
        return tmp_path

    return _generate


# --- the background lane ----------------------------------------------------------------------------------------
# CI has two cores. A test that runs generated tests and waits for them leaves one idle; the suite's heavier
# such runs are instead decorated ``@background_run(prepare)``: one after another, in the background while the
# suite goes on, ``prepare(folder)`` writes each selected test's files and returns its runs (in a forked process
# of the lane's own, so that generating them takes no time of the suite's process), and the runs run; the test
# reads their results from the ``background_results`` fixture, and runs last in the session (a test's outcome
# does not depend on the order), so that the lane has the whole suite's time to finish them in.


#: A run's arguments that leave out the generated tests' torch.compile checks (about 2 s of an op's 6), for the ops
#: of a file whose code paths another op of it compiles already.
WITHOUT_COMPILE = ("-k", "not compile")


@dataclass(frozen=True)
class GeneratedRun:
    """A run of the generated tests in ``directory``, as :func:`run_pytest` makes it."""

    directory: Path
    args: tuple[str, ...] = ()
    compile_backend: str = "aot_eager"


def pytest_configure(config):
    config.addinivalue_line("markers", "background_run(prepare): see background_run in tests/conftest.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.get_closest_marker("background_run") is not None)  # stable: otherwise in order


def background_run(prepare):
    """Mark a test whose generated tests ``prepare(folder, **the test's parameters)`` writes, returning a
    GeneratedRun or {name: GeneratedRun}: they run in the background lane, and the test takes their results
    (CompletedProcess, or {name: CompletedProcess}) from the ``background_results`` fixture."""
    return pytest.mark.background_run.with_args(prepare)


class _Lane:
    """Prepares and runs one after another in a thread of their own (the thread only waits: each preparation is
    in the lane's worker process, each run a forked process)."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._results: dict[str, object] = {}
        self._done: dict[str, threading.Event] = {}
        self._current: BackgroundPytest | None = None
        self._closed = False
        self._key = ""
        self._worker = _Worker()
        self.seconds: dict[str, float] = {}  # each run's wall time, by test and name (pytest --durations)
        threading.Thread(target=self._work, daemon=True).start()

    def submit(self, key: str, prepare, folder: Path, params: dict) -> None:
        """Queue ``prepare(folder, **params)`` (a module-level function: the worker imports it) and its runs."""
        self._done[key] = threading.Event()
        self._queue.put((key, prepare, folder, params))

    def result(self, key: str, timeout: float = 1800):
        """What the run (or runs, by name) gave: CompletedProcess; prepare's exception is raised here."""
        if not self._done[key].wait(timeout):
            raise TimeoutError(f"{key}: the background lane did not finish it in {timeout} s")
        result = self._results[key]
        if isinstance(result, BaseException):
            raise result
        return result

    def _work(self) -> None:
        while True:
            key, prepare, folder, params = self._queue.get()
            self._key = key
            try:
                runs = self._worker.prepare(prepare, folder, params)
                self._results[key] = self._run(runs)
            except Exception as exc:  # prepare failed, or a run timed out: the test fails with it
                self._results[key] = exc
            self._done[key].set()

    def _run(self, runs: GeneratedRun | dict[str, GeneratedRun]):
        if isinstance(runs, GeneratedRun):
            return self._run({"": runs})[""]
        results = {}
        for name, run in runs.items():
            if self._closed:
                raise RuntimeError("the session ended before this run")
            began = time.perf_counter()
            self._current = BackgroundPytest(run.directory, *run.args, compile_backend=run.compile_backend)
            results[name] = self._current.wait()
            self.seconds[f"{self._key} {name}".rstrip()] = time.perf_counter() - began
        return results

    def close(self) -> None:
        self._closed = True
        if self._current is not None:
            self._current.close()
        self._worker.close()


class _Worker:
    """One forked process (tests/forked_pytest.py's forkserver) that prepares runs, asked by the lane's thread
    alone, one request at a time, over a pipe: imports and caches of scaffold stay warm between them."""

    def __init__(self) -> None:
        self._connection, child = forked_pytest_context().Pipe()
        # Not a daemon: generating an op forks a process of its own (scaffold.limits), which a daemon may not.
        self._process = forked_pytest_context().Process(target=_serve, args=(child,))
        self._process.start()
        child.close()

    def prepare(self, prepare, folder: Path, params: dict) -> GeneratedRun | dict[str, GeneratedRun]:
        """``prepare(folder, **params)`` (a module-level function: the worker imports it by name)."""
        self._connection.send((prepare, folder, params))
        try:
            status, value = self._connection.recv()
        except EOFError:
            raise RuntimeError(f"the lane's worker died (exit code {self._process.exitcode})") from None
        if status == "error":
            raise RuntimeError(f"preparing the background run failed:\n{value}")
        return value

    def close(self) -> None:
        self._process.kill()
        self._process.join()
        self._connection.close()


def _serve(connection) -> None:
    """The worker: each request's runs, or its traceback (pytest's outcome exceptions do not pickle)."""
    while True:
        try:
            prepare, folder, params = connection.recv()
        except EOFError:  # the suite's process is gone
            return
        try:
            answer = ("ok", prepare(folder, **params))
        except BaseException as exc:
            answer = ("error", "".join(traceback.format_exception(exc)))
        connection.send(answer)


@pytest.fixture(scope="session", autouse=True)
def _background_lane(request, tmp_path_factory):
    lane = _Lane()
    for item in request.session.items:
        marker = item.get_closest_marker("background_run")
        if marker is not None:
            params = item.callspec.params if hasattr(item, "callspec") else {}
            folder = tmp_path_factory.mktemp(re.sub(r"\W", "_", item.name)[:40])  # as tmp_path names it
            lane.submit(item.nodeid, marker.args[0], folder, params)
    yield lane
    lane.close()
    _LANES.append(lane)


_LANES: list[_Lane] = []


def pytest_terminal_summary(terminalreporter, config):
    """With --durations, the background lane's slowest runs too (their tests wait on them, not run them)."""
    count = config.getoption("durations", None)
    seconds = {k: v for lane in _LANES for k, v in lane.seconds.items()}
    if count is None or not seconds:
        return
    terminalreporter.section(f"slowest background runs of generated tests ({sum(seconds.values()):.0f} s in all)")
    for key, value in sorted(seconds.items(), key=lambda kv: -kv[1])[: count or None]:
        terminalreporter.write_line(f"{value:8.2f}s {key}")


@pytest.fixture
def background_results(request, _background_lane):
    """The results of the test's :func:`background_run`."""
    return _background_lane.result(request.node.nodeid)
