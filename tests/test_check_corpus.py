"""``scaffold check`` on the corpus of hand-written Functions (tests/check_corpus): every check a case names as
failing fails, every warning is allowed, and every other check passes (or is skipped) — a right Function
passes with no false alarm, a wrong one is caught with a verdict that names its bug."""

from __future__ import annotations

import sys

import pytest

from scaffold.check import CHECKS, check_function
from scaffold.spec import spec_from_mapping

from .check_corpus.cases import CASES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _id(case) -> str:
    same = [c for c in CASES if c.name == case.name]
    return case.name if len(same) == 1 else f"{case.name}-{same.index(case)}"


@pytest.fixture(autouse=True)
def _eager_compile(monkeypatch):
    """aot_eager traces the graphs inductor would compile, without its code generation: the compile check's
    verdicts are the same (the corpus was checked with both), in a fraction of the time."""
    monkeypatch.setattr("scaffold.testing.COMPILE_BACKEND", "aot_eager")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_corpus_case(case):
    spec = spec_from_mapping(tomllib.loads(case.spec), source=case.name)
    report = check_function(spec, f"{case.path}:{case.target}", call=case.call)
    assert [v.check for v in report.verdicts] == list(CHECKS)
    wrong = []
    for v in report.verdicts:
        if v.check in case.unsure:
            continue
        if v.check in case.fails:
            ok = v.status == "fail" and v.message
        elif v.check in case.warns:
            ok = v.status != "fail"
        else:
            ok = v.status in ("pass", "skip")
        if not ok:
            wrong.append(f"{v.check}: {v.status}: {v.message}")
    assert not wrong, f"{case.name} ({case.why}):\n" + "\n".join(wrong)
    assert report.exit_code() == (1 if case.fails else 0)
