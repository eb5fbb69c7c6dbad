"""Derivation runs under a hard time limit in a worker process; its errors come back intact."""

from __future__ import annotations

import time

import pytest

from scaffold import generate_op
from scaffold.cli import main
from scaffold.errors import DerivationError
from scaffold.limits import run_with_time_limit

from .conftest import make_spec

# Within every parser limit, yet sympy needs far longer than a second for it (about a minute).
SLOW = "Max(" + ", ".join(f"x**{i} - {i}*x" for i in range(1, 17)) + ")"


def test_slow_derivation_is_stopped():
    start = time.monotonic()
    with pytest.raises(DerivationError, match="took longer than 1 second and was stopped") as info:
        generate_op(make_spec("slow", SLOW), time_limit=1.0)
    assert time.monotonic() - start < 10
    assert info.value.where == "slow.toml: forward" and "simplify the expression" in info.value.hint


def test_cli_time_limit(tmp_path, capsys):
    argv = ["new", "op", "slow", "--forward", SLOW, "--tensor", "x", "-o", str(tmp_path / "out")]
    assert main([*argv, "--time-limit", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("scaffold: error: command-line flags: forward: deriving the op took longer than 1 second")
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_cli_rejects_a_bad_time_limit(capsys):
    with pytest.raises(SystemExit) as info:
        main(["new", "op", "m", "--forward", "x", "--tensor", "x", "--time-limit", "-3"])
    assert info.value.code == 2 and "'-3' is not a positive number of seconds" in capsys.readouterr().err


def test_errors_from_the_worker_are_the_same_as_in_process():
    spec = make_spec("mixed", "x * erfinv(alpha)", scalars={"alpha": {"default": 0.5}})
    with pytest.raises(DerivationError) as in_process:
        generate_op(spec, time_limit=None)
    with pytest.raises(DerivationError) as in_worker:
        generate_op(spec)
    assert str(in_worker.value) == str(in_process.value)
    assert (in_worker.value.where, in_worker.value.hint) == (in_process.value.where, in_process.value.hint)


def test_worker_gives_the_same_files():
    spec = make_spec("swish", "x / (1 + exp(-x))")
    assert generate_op(spec) == generate_op(spec, time_limit=None)


def _divide(a: float, b: float) -> float:
    return a / b


def test_a_crash_in_the_worker_is_not_a_user_error():
    assert run_with_time_limit(_divide, (1, 4), seconds=10, where="here", what="dividing") == 0.25
    with pytest.raises(RuntimeError, match="scaffold failed while dividing: ZeroDivisionError"):
        run_with_time_limit(_divide, (1, 0), seconds=10, where="here", what="dividing")
