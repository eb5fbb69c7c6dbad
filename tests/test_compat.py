"""scripts/compat.py, without building a venv: its arguments, its ops (each generates), its report and table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "compat.py"


@pytest.fixture(scope="module")
def compat():
    spec = importlib.util.spec_from_file_location("compat", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["compat"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["compat"]


def test_a_torch_version_builds_a_venv_of_its_own(compat):
    args = compat.parse_args(["--torch", "2.9.1"])
    assert args.torch == "2.9.1" and args.venv.name == "scaffold-compat-torch2.9.1"
    assert args.ops == compat.OP_NAMES and args.backend == "inductor"


def test_a_venv_is_reused_and_ops_can_be_chosen(compat):
    args = compat.parse_args(["--venv", "/tmp/v", "--ops", "swish", "layer_norm", "--backend", "aot_eager"])
    assert args.torch is None and args.venv == Path("/tmp/v")
    assert args.ops == ["swish", "layer_norm"] and args.backend == "aot_eager"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give --torch VERSION"),
        (["--torch", "latest"], "--torch 'latest': give a release number such as 2.9.1"),
        (["--torch", "2.9.1", "--ops", "nope"], "invalid choice: 'nope'"),
    ],
)
def test_bad_arguments_are_refused(compat, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        compat.parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_ops_cover_every_kind_of_generated_code_and_generate(compat, tmp_path):
    kinds = " ".join(kind for _, kind, _ in compat.OPS)
    for kind in ("elementwise", "masked", "steps", "structured (reductions)", "matmul", "custom gradient", "custom op"):
        assert kind in kinds, kind
    assert "fused" in kinds
    folders = compat.generate(compat.OP_NAMES, tmp_path)
    for name, folder in zip(compat.OP_NAMES, folders):
        assert (folder / f"{name}.py").is_file() and (folder / f"test_{name}.py").is_file()
    text = {name: (tmp_path / name / f"{name}.py").read_text() for name in compat.OP_NAMES}
    assert "torch.library.custom_op" in text["swish_custom_op"]
    assert "_fused_forward" in text["gelu_fused"] and "_fused_forward" in text["softmax_fused"]
    assert "_apply = _runtime.dispatcher(SwishFunction, compile_forward=_forward)" in text["swish"]


def test_the_list_prints_the_ops(compat, capsys):
    assert compat.main(["--list"]) == 0
    assert capsys.readouterr().out.split()[0] == "swish"


REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="test_swish" name="test_gradcheck[cpu]" time="0.1"/>
<testcase classname="test_swish" name="test_compile[cpu]" time="3">
<failure message="AssertionError: gradient of x&#10;second line">trace</failure></testcase>
<testcase classname="test_swish" name="test_gradcheck[cuda]" time="0"><skipped message="no CUDA"/></testcase>
<testcase classname="test_swish" name="test_module[cpu]" time="0">
<error message="fixture broke">trace</error></testcase>
</testsuite></testsuites>"""


def test_a_report_is_counted_and_tabled(compat):
    result = compat.read_report(REPORT, compat.Result("swish", "elementwise"))
    assert (result.passed, result.failed, result.skipped) == (1, 2, 1)
    assert result.failures == [
        "test_swish::test_compile[cpu]: AssertionError: gradient of x",
        "test_swish::test_module[cpu]: fixture broke",
    ]
    lines = compat.table([result, compat.Result("softplus", "elementwise", passed=3, seconds=2.4)]).splitlines()
    assert lines[0].split() == ["op", "kind", "passed", "failed", "skipped", "seconds"]
    assert lines[2].split() == ["swish", "elementwise", "1", "2", "1", "0"]
    assert lines[5].split() == ["total", "2", "ops", "4", "2", "1", "2"]
    assert lines[6] == "FAILED swish/test_swish::test_compile[cpu]: AssertionError: gradient of x"
