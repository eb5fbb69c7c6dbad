"""A forked pytest run (tests/forked_pytest.py) is the ``python -m pytest`` it replaces: its folder first on a
fresh interpreter's sys.path, its own environment and working directory, nothing of the suite's imported,
its output and pytest's exit status."""

from __future__ import annotations

import os
import sys

from .forked_pytest import PytestRun

_TEST = """\
import os
import sys


def test_the_process_is_a_fresh_pytest():
    assert os.getcwd() == {folder!r}
    assert sys.path[0] == {folder!r}
    assert os.environ["FORKED_PYTEST_CHECK"] == "1"
    assert not {{"scaffold", "tests", "tests.forked_pytest", "tests.conftest"}} & set(sys.modules)
    import helper  # beside this file, as under python -m pytest

    assert helper.VALUE == 3
    print("PRINTED")


def test_a_failure_is_reported():
    assert False, "FAILED ON PURPOSE"
"""


def test_a_forked_run_is_a_fresh_pytest_in_its_folder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "helper.py").write_text("VALUE = 3\n")
    (folder / "test_fresh.py").write_text(_TEST.format(folder=str(folder)))
    env = {**os.environ, "FORKED_PYTEST_CHECK": "1"}
    result = PytestRun(folder, ["-q", "-p", "no:cacheprovider", "-rA", "-s"], env).wait(timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed" in result.stdout, result.stdout
    assert "FAILED ON PURPOSE" in result.stdout and "PRINTED" in result.stdout
    assert "FORKED_PYTEST_CHECK" not in os.environ and os.getcwd() != str(folder)
    assert str(folder) not in sys.path
