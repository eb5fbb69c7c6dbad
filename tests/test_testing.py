"""scaffold.testing, the generated tests' library, where its behaviour is its own (the checks themselves are
exercised by running generated tests, tests/test_broken.py breaking them)."""

from __future__ import annotations

import pytest
import torch

from scaffold import testing
from scaffold.testing import Input, OpTests


def _double(x):
    return 2 * x


def _op_tests(*inputs: Input) -> OpTests:
    return OpTests(torch.autograd.Function, _double, torch.nn.Identity, _double, inputs=list(inputs))


OP = _op_tests(Input("x", (3,)))


def test_a_backend_that_cannot_compile_skips_the_compile_check_saying_why(monkeypatch):
    # Inductor without a C++ compiler says nothing about the op: a skip with the reason, not a red test.
    monkeypatch.setattr(testing, "COMPILE_BACKEND", "no_such_backend")
    with pytest.raises(pytest.skip.Exception, match="no_such_backend backend does not work here .*Invalid"):
        OP.check_compile("cpu")


def test_a_working_backend_compiles_the_op():
    assert testing._backend_unavailable("aot_eager", "cpu") == ""
    OP.check_compile("cpu")


def test_extreme_columns_take_each_value_of_each_input():
    op = _op_tests(Input("x", (3,), extremes=(-1.0, 2.0)), Input("y", (), typical=0.5, extremes=(3.0,)))
    rows = {tuple(row) for row in torch.stack(op.extreme_columns()).T.tolist()}
    assert {(-1.0, 0.5), (2.0, 0.5), (1.0, 3.0)} <= rows
