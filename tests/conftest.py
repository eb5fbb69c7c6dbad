from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from scaffold import generate_op, spec_from_mapping, write_files
from scaffold.render import render_runtime
from scaffold.spec import RUNTIME_FILE

try:
    from .forked_pytest import PytestRun
except ImportError:  # tests/ run as a plain folder, not a package
    from forked_pytest import PytestRun

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
