"""scripts/one_pipeline_probe.py: elementwise ops through the structured path (issue 33's probe), run in a
process of its own (it makes every program structured in the process that runs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "one_pipeline_probe.py"


def _probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_an_elementwise_op_passes_its_generated_tests_through_the_structured_path():
    result = _probe("--groups", "catalogue", "--ops", "sign_op")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "catalogue: 1 of 1 ops generated" in result.stdout
    assert " passed" in result.stdout and "failed" not in result.stdout


def test_an_unknown_group_is_refused():
    result = _probe("--groups", "catalogue,nope")
    assert result.returncode == 2
    assert "unknown group(s) nope; choose from catalogue, realistic" in result.stderr
