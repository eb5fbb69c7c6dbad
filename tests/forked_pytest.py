"""pytest runs in fresh processes forked from one that has imported torch and pytest.

The generated tests of an op, or a generated project's tests, run in an interpreter of their own: their
modules are imported by name from their folder (the op, the runtime beside it, the project's package),
which must not meet the suite's or another run's. Started as ``python -m pytest``, each such run paid for
importing torch (seconds of CPU, more on CI's two busy cores) before its first test, and the suite makes
dozens of them. Here each run is a child of one multiprocessing forkserver that imported torch and pytest
once, with what torch.compile and forward-mode AD import on first use (:data:`PRELOADED`): the child starts
with them imported, and is otherwise the interpreter ``python -m pytest -p no:hypothesispytest`` would have
been in the run's folder: its own working directory, environment and sys.path (a fresh interpreter's under
that environment, the folder first), nothing of the suite's in sys.modules, its own output, and pytest's
exit status as its own. An exit status of 255 is multiprocessing's for a status it could not read from the
forkserver, not pytest's.

This module imports only the standard library: the forkserver imports it to run :func:`_run` in a child.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: Imported once, by the forkserver, before any child: what every run imports first, and the modules of torch
#: that a generated test file's torch.compile and forward-mode checks load (a second or two in each run).
PRELOADED = [
    "torch",
    "pytest",
    "sympy",
    "torch._dynamo",
    "torch._functorch.aot_autograd",
    "torch._inductor.pattern_matcher",
    "torch._decomp.decompositions_for_jvp",
]


class PytestRun:
    """``pytest *args`` in ``directory`` with the environment ``env``, started now, waited for by
    :meth:`wait` (the calling process goes on meanwhile)."""

    def __init__(self, directory: Path | str, args: list[str], env: dict[str, str]) -> None:
        # Without hypothesis's pytest plugin, a dev dependency that no run here uses: loading it is a second.
        self.args = ["-p", "no:hypothesispytest", *args]
        self._output = tempfile.mkdtemp(prefix="scaffold-pytest-run-")
        self._streams = [os.path.join(self._output, name) for name in ("stdout", "stderr")]
        sys_path = _fresh_sys_path(env.get("PYTHONPATH", ""))
        self._process = context().Process(target=_run, args=(str(directory), self.args, env, sys_path, *self._streams))
        self._process.start()
        self._result: subprocess.CompletedProcess | None = None

    def wait(self, timeout: float = 600) -> subprocess.CompletedProcess:
        """The run's exit status (pytest's) and output, once it is over (TimeoutExpired after ``timeout``)."""
        if self._result is None:
            self._process.join(timeout)
            if self._process.exitcode is None:
                self.close()
                raise subprocess.TimeoutExpired(["pytest", *self.args], timeout)
            stdout, stderr = (Path(path).read_text(encoding="utf-8", errors="replace") for path in self._streams)
            self._result = subprocess.CompletedProcess(self.args, self._process.exitcode, stdout, stderr)
            self.close()
        return self._result

    def close(self) -> None:
        """Stop the run if nobody waited for it (a test deselected with -k)."""
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join()
        shutil.rmtree(self._output, ignore_errors=True)


@functools.cache
def context() -> multiprocessing.context.ForkServerContext:
    """The forkserver's context (for a process pool of the suite's own, as in tests/test_realistic.py)."""
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload([__name__, *PRELOADED])
    return forkserver


@functools.cache
def _fresh_sys_path(pythonpath: str) -> tuple[str, ...]:
    """sys.path of a fresh interpreter under ``PYTHONPATH=pythonpath``, after its working directory."""
    code = "import json, sys; print(json.dumps(sys.path[1:]))"
    env = {**os.environ, "PYTHONPATH": pythonpath}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return tuple(json.loads(done.stdout))


def _run(directory: str, args: list[str], env: dict[str, str], sys_path: tuple[str, ...], out: str, err: str):
    """The child: become ``python -m pytest *args`` started in ``directory``; exit with pytest's status."""
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 (the process's own streams)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(directory)
    sys.path[:] = [directory, *sys_path]
    sys.argv[:] = ["pytest", *args]
    # This module and its package are the suite's: the run's folder may have modules of those names.
    for name in (__name__, __name__.rpartition(".")[0]):
        sys.modules.pop(name, None)

    import pytest

    status = int(pytest.main(list(args)))
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(status)
