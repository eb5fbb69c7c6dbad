"""Benchmarks: the inputs they build, the rows and bytes they report, the table and the command line.

These check what a benchmark measures and reports, never how fast anything is: timings are tiny
(``min_time`` of a hundredth of a second on a thousand elements) and only checked for being there.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scaffold import bench, generate_op
from scaffold.cli import main
from scaffold.domain import InputDomain
from scaffold.spec import load_spec

from .conftest import SPECS, make_spec

FAST = {"numel": 1000, "min_time": 0.01, "rounds": 2, "compile": False, "time_limit": None}
TANH = 'name = "tanh_op"\nforward = "tanh(x)"\n\n[tensors.x]\n'


@pytest.fixture(scope="module")
def tanh_spec(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "tanh_op.toml"
    path.write_text(TANH)
    return path


@pytest.fixture(scope="module")
def tanh_report(tanh_spec) -> tuple[bench.BenchReport, list[str]]:
    """One benchmark of tanh against torch.tanh, and its progress messages."""
    messages: list[str] = []
    report = bench.bench_op(load_spec(tanh_spec), native="torch.tanh", progress=messages.append, **FAST)
    return report, messages


# --- inputs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shapes, learnable, numel, expected",
    [
        ([(4, 5), (5,), ()], [False, False, True], 1000, [(200, 5), (5,), ()]),
        ([(4, 5), (4, 1)], None, 1000, [(200, 5), (200, 1)]),
        ([(4, 1), (1, 5)], None, 1000, [(200, 1), (1, 5)]),  # the leading dim of B is only x's
        ([(5,), (4, 5), ()], [False, False, False], 1000, [(5,), (200, 5), ()]),  # a 0-dim input stays 0-dim
        ([(2, 3, 4), (3, 1)], None, 120, [(10, 3, 4), (3, 1)]),
        ([(4, 5000)], None, 1000, [(1, 5000)]),  # never fewer than one row
        ([(7,)], None, 1000, [(1000,)]),
        ([(), ()], [False, False], 1000, [(1000,), (1000,)]),  # all 0-dim: the inputs grow, ...
        ([(), ()], [False, True], 1000, [(1000,), ()]),  # ... parameters do not
    ],
)
def test_scaled_shapes(shapes, learnable, numel, expected):
    assert bench.scaled_shapes(shapes, numel, learnable) == expected


def test_scaled_shapes_need_a_positive_numel_and_shapes_that_broadcast():
    with pytest.raises(bench.BenchError, match="numel must be positive"):
        bench.scaled_shapes([(4, 5)], 0)
    with pytest.raises(bench.BenchError, match=r"shapes \[4, 5\], \[3\] do not broadcast"):
        bench.scaled_shapes([(4, 5), (3,)], 1000)


def test_inputs_are_seeded_in_their_domains_and_away_from_kinks():
    spec = make_spec("mixed", "x*y + b", {"x": {}, "y": {"shape": [5]}, "b": {"shape": [], "learnable": True}})
    domains = [
        InputDomain("x", -1.0, 1.0, (0.0,), "test"),
        InputDomain("y", 2.0, 3.0, (), "test"),
        InputDomain("b", 0.5, 0.6, (), "test"),
    ]
    options = {"numel": 1000, "device": torch.device("cpu"), "dtype": torch.float32}
    x, y, b = bench.make_inputs(spec, domains, **options)
    assert [tuple(t.shape) for t in (x, y, b)] == [(200, 5), (5,), ()]
    assert all(t.requires_grad and t.dtype == torch.float32 for t in (x, y, b))
    assert x.min() >= -1.1 and x.max() <= 1.1 and (x.abs() >= bench.AVOID_MARGIN - 1e-6).all()
    assert 2.0 <= y.min() and y.max() <= 3.0 and 0.5 <= b <= 0.6
    again = bench.make_inputs(spec, domains, **options)
    assert all(torch.equal(a, b) for a, b in zip((x, y, b), again))


# --- what is measured --------------------------------------------------------------------------------


def test_minimal_traffic_reads_the_inputs_three_times_and_the_outputs_twice():
    # RMSNorm in rows: x (4096, 16) and its weight (16,) in, a (4096, 16) out; a row loss (4096,) out
    norm = make_spec("norm", "x*weight/sqrt(mean(x**2, dim=-1, keepdim=True) + 1e-6)", {
        "x": {"shape": [8, 16]}, "weight": {"shape": [16], "learnable": True}})  # fmt: skip
    assert bench.minimal_traffic(norm, 65536, torch.float32) == (3 * (65536 + 16) + 2 * 65536) * 4
    loss = make_spec("row_lse", "logsumexp(x, dim=-1)", {"x": {"shape": [8, 16]}})
    assert bench.minimal_traffic(loss, 65536, torch.bfloat16) == (3 * 65536 + 2 * 4096) * 2
    elementwise = make_spec("square", "x**2")
    assert bench.minimal_traffic(elementwise, 1000, torch.float64) == 5 * 1000 * 8


def test_copy_bandwidth_is_a_positive_rate():
    assert 1e8 < bench.copy_bandwidth(torch.device("cpu"), numel=2**16) < 1e15


def test_saved_bytes_counts_each_storage_once():
    x = torch.rand(100, requires_grad=True)
    assert bench.saved_bytes(lambda t: t * t, [x]) == 400  # x saved twice, one storage
    assert bench.saved_bytes(lambda t: t + 1, [x]) == 0
    assert bench.saved_bytes(lambda t: torch.tanh(t), [x]) == 400  # the output


def test_tanh_rows_and_saved_bytes(tanh_report):
    report, messages = tanh_report
    assert [r.name for r in report.rows] == [bench.EAGER, bench.PLAIN, "native torch.tanh"]
    assert report.shapes == {"x": (200, 5)} and report.numel == 1000 and report.dtype == "float32"
    for row in report.rows:
        assert row.note == "", row
        assert row.forward.median > 0 and row.fwd_bwd.median > 0 and row.forward.runs >= report.rounds == 2
    # The generated tanh saves only its output (1 - tanh(x)**2 reads it): one float32 tensor of x's size.
    # jvp's save_for_forward keeps x as well, but not for backward: the hooks do not see it.
    assert report.row(bench.EAGER).saved_bytes == 1000 * 4
    assert report.baseline.saved_bytes == 1000 * 4
    assert any("timing forward" in m for m in messages) and messages[0].startswith("deriving tanh_op")


def test_broadcasting_op_with_a_parameter_on_one_thread():
    threads = torch.get_num_threads()
    report = bench.bench_op(load_spec(SPECS / "swish.toml"), dtype="float64", threads=1, **FAST)
    assert report.shapes == {"x": (200, 5), "beta": ()}
    assert report.dtype == "float64" and report.threads == 1 and "1 thread" in report.machine
    assert torch.get_num_threads() == threads
    eager, plain = report.row(bench.EAGER), report.baseline
    assert 0 < eager.saved_bytes <= plain.saved_bytes


def test_native_that_differs_or_fails_gets_a_note(tanh_spec):
    spec = load_spec(tanh_spec)
    report = bench.bench_op(spec, native=torch.sigmoid, **FAST)
    assert report.rows[-1].name == "native torch.sigmoid"
    assert "output differs from plain autograd" in report.rows[-1].note
    assert report.rows[-1].fwd_bwd is not None

    def broken(x):
        raise RuntimeError("no kernel for this")

    report = bench.bench_op(spec, native=broken, native_name="broken", **FAST)
    row = report.row("native broken")
    assert row.note == "not available: RuntimeError: no kernel for this"
    assert row.forward is None and row.saved_bytes is None


def test_compiled_rows_and_a_compile_failure(tanh_spec, monkeypatch):
    # torch.compile itself takes seconds: here it hands back a function that fails when called.
    def compile_that_fails(fn, *args, **kwargs):
        def compiled(*a, **k):
            raise RuntimeError("inductor is unavailable")

        return compiled

    monkeypatch.setattr(torch, "compile", compile_that_fails)
    report = bench.bench_op(load_spec(tanh_spec), **{**FAST, "compile": True})
    assert [r.name for r in report.rows] == [bench.EAGER, bench.FUSED, bench.PLAIN, bench.COMPILED]
    assert report.row(bench.COMPILED).note == "not available: RuntimeError: inductor is unavailable"
    fused = report.row(bench.FUSED)  # runs eagerly where compiling fails, and warns: a note says so
    assert fused.fwd_bwd is not None and (not fused.note or "inductor is unavailable" in fused.note)
    assert report.row(bench.EAGER).fwd_bwd is not None


def test_format_table(tanh_report):
    report, _ = tanh_report
    table = bench.format_table(report)
    header, _, rows = table.partition("\n\n")
    assert "tanh_op: cpu, float32, 1,000 elements" in header
    assert torch.__version__ in header and f"{torch.get_num_threads()} thread" in header  # "1 thread", "2 threads"
    assert "x (200, 5)" in header
    for name in (bench.EAGER, bench.PLAIN, "native torch.tanh"):
        assert f"| {name} |" in rows
    assert "| plain autograd |" in rows and "1.00x" in rows
    assert rows.count("\n") == 4  # header, separator, three rows


def test_formatting():
    timing = bench.Timing(median=0.0123456, iqr=0.00042, runs=7)
    assert bench.format_timing(timing) == "12.3 ± 0.4"
    assert bench.format_timing(bench.Timing(0.000123, 0.0, 3)) == "0.123 ± 0.000"
    assert bench.format_timing(None) == "n/a"
    assert bench.format_bytes(16 * 1024 * 1024) == "16.0 MiB" and bench.format_bytes(4000) == "3.9 KiB"
    assert bench.ratio(2.0, 4.0) == 0.5 and bench.ratio(1, 0) is None and bench.ratio(None, 1) is None


def test_time_ratio_pairs_the_rounds():
    # Round 2 ran while the machine was busy: both candidates took 5x longer there. The ratio within each
    # round is 1.1; the ratio of the merged medians would depend on how the busy round's blocks fall.
    op = bench.Timing(median=0.011, iqr=0.0, runs=3, rounds=(0.011, 0.055, 0.011))
    plain = bench.Timing(median=0.050, iqr=0.0, runs=3, rounds=(0.010, 0.050, 0.010))
    assert bench.time_ratio(op, plain) == pytest.approx(1.1)
    unpaired = bench.Timing(median=0.022, iqr=0.0, runs=1, rounds=(0.022,))
    assert bench.time_ratio(unpaired, plain) == pytest.approx(0.022 / 0.050)
    assert bench.time_ratio(None, plain) is None and bench.time_ratio(op, None) is None


def test_each_round_starts_with_the_next_candidate(monkeypatch):
    order = []

    class Timer:
        def __init__(self, stmt, globals, num_threads):
            self.name = globals["name"]

        def blocked_autorange(self, min_run_time):
            order.append(self.name)

    monkeypatch.setattr(bench.benchmark, "Timer", Timer)
    ready = [bench._Ready(n, None, {"name": n}, []) for n in "abc"]
    bench._time_interleaved(ready, min_time=0.1, rounds=3, say=lambda m: None)
    forward = order[:9]
    assert forward == ["a", "b", "c", "b", "c", "a", "c", "a", "b"] and order[9:] == forward


def test_rounds_are_recorded(tanh_report):
    report, _ = tanh_report
    for row in report.rows:
        assert len(row.fwd_bwd.rounds) == report.rounds and all(t > 0 for t in row.fwd_bwd.rounds)


# --- what is refused ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dotted, message",
    [
        ("gelu", "cannot read the native op 'gelu'"),
        ("torch.nn.functional.nope", "torch.nn.functional has no attribute 'nope'"),
        ("nope_module.gelu", "no module 'nope_module'"),
        ("torch.nn", "torch.nn is not callable"),
        ("torch.tanh()", "cannot read the native op"),
    ],
)
def test_unknown_native(dotted, message):
    with pytest.raises(bench.BenchError, match=message.replace("(", r"\(")):
        bench.resolve_native(dotted)


def test_native_resolves_through_modules_and_attributes():
    assert bench.resolve_native("torch.nn.functional.gelu") is torch.nn.functional.gelu
    assert bench.resolve_native("torch.special.erf") is torch.special.erf
    assert bench.resolve_native("torch.Tensor.tanh") is torch.Tensor.tanh


@pytest.mark.parametrize(
    "options, message",
    [
        ({"min_time": 0.0}, "min_time must be a positive number"),
        ({"rounds": 0}, "rounds and threads must be at least 1"),
        ({"threads": 0}, "rounds and threads must be at least 1"),
        ({"numel": 0}, "numel must be positive"),
    ],
)
def test_bench_options_are_checked(tanh_spec, options, message):
    with pytest.raises(bench.BenchError, match=message):
        bench.bench_op(load_spec(tanh_spec), **{**FAST, **options})


def test_dtypes_and_devices():
    assert bench.resolve_dtype("bfloat16") is torch.bfloat16 and bench.resolve_dtype(torch.float64) is torch.float64
    with pytest.raises(bench.BenchError, match="unknown dtype 'int8'"):
        bench.resolve_dtype("int8")
    with pytest.raises(bench.BenchError, match="unknown device 'gpu0'"):
        bench.resolve_device("gpu0")


def test_cuda_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(bench.BenchError, match="CUDA is not available"):
        bench.resolve_device("cuda")


# --- the command line --------------------------------------------------------------------------------

CLI_FAST = ["--numel", "1000", "--min-time", "0.01", "--no-compile"]


def test_cli_prints_the_table(tanh_spec, capsys):
    assert main(["bench", "--spec", str(tanh_spec), *CLI_FAST, "--native", "torch.tanh"]) == 0
    out, err = capsys.readouterr()
    assert "| scaffold eager |" in out and "| plain autograd |" in out and "| native torch.tanh |" in out
    assert "scaffold: [1/3] scaffold eager: warming up" in err  # progress on stderr, not in the table
    assert f"scaffold: timing forward + backward, round {bench.ROUNDS}/{bench.ROUNDS}" in err
    assert "timing" not in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--native", "torch.nope"], "torch has no attribute 'nope'"),
        (["--dtype", "int8"], "unknown dtype 'int8'"),
        (["--device", "cuda"], "CUDA is not available"),
    ],
)
def test_cli_errors(tanh_spec, capsys, monkeypatch, args, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--spec", str(tanh_spec), *CLI_FAST, *args]) == 1
    err = capsys.readouterr().err
    assert f"scaffold: error: {message}" in err and "Traceback" not in err


def test_cli_name_outside_a_project(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "swish", *CLI_FAST]) == 1
    err = capsys.readouterr().err
    assert "not inside a scaffold project" in err and "--spec swish.toml" in err and "Traceback" not in err


def test_cli_needs_name_or_spec_not_both(tanh_spec, capsys):
    assert main(["bench", *CLI_FAST]) == 1
    assert "missing NAME or --spec" in capsys.readouterr().err
    assert main(["bench", "tanh_op", "--spec", str(tanh_spec), *CLI_FAST]) == 1
    assert "NAME and --spec cannot be combined" in capsys.readouterr().err


def test_cli_name_inside_a_project(tmp_path, monkeypatch, capsys):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\n\n[tool.scaffold]\npackage = "demo"\n')
    (tmp_path / "src" / "demo").mkdir(parents=True)
    (tmp_path / "src" / "demo" / "__init__.py").write_text("")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "tanh_op.toml").write_text(TANH)
    monkeypatch.chdir(tmp_path / "src")
    assert main(["bench", "tanh_op", *CLI_FAST]) == 0
    assert "scaffold bench tanh_op" in capsys.readouterr().out
    assert main(["bench", "gelu", *CLI_FAST]) == 1
    err = capsys.readouterr().err
    assert "specs/gelu.toml does not exist" in err and "the project's ops: tanh_op" in err


def test_cli_help_states_the_library_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"default: {bench.DEFAULT_NUMEL}" in out and f"default: {bench.DEFAULT_MIN_TIME:g})" in out


def test_the_cli_imports_torch_only_for_bench():
    code = "import sys, scaffold.cli; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr


def test_a_structured_op_grows_its_batch_dimension_and_is_timed_against_its_native_op():
    spec = make_spec("rownorm", "x / sqrt(sum(x**2, dim=-1, keepdim=True))", {"x": {"shape": [8, 16]}})
    assert bench.scaled_program_shapes(spec, 4096) == [(256, 16)]
    gram = make_spec("gram", "x @ transpose(x, -1, -2)", {"x": {"shape": [8, 16]}})
    assert bench.scaled_program_shapes(gram, 4096) == [(64, 16)]  # its 64 x 64 result is the largest value
    report = bench.bench_op(
        spec, native=lambda x: torch.nn.functional.normalize(x, dim=-1), native_name="torch", **FAST
    )
    rows = {row.name: row for row in report.rows}
    assert rows[bench.EAGER].fwd_bwd is not None and rows[bench.PLAIN].fwd_bwd is not None
    assert not rows["native torch"].note, rows["native torch"].note
    assert rows[bench.EAGER].saved_bytes <= rows[bench.PLAIN].saved_bytes


def test_out_of_place_times_the_op_without_its_in_place_temporaries():
    # What computing in place gains is measured against the same op with every temporary out of place.
    spec = make_spec("mish", "x*tanh(log(1 + exp(x)))")
    rewritten = generate_op(spec, time_limit=None)["mish.py"]
    unrewritten = generate_op(spec, time_limit=None, in_place=False)["mish.py"]
    in_place = re.compile(r"\.(?!sum_to_size)[a-z]\w*[a-z]_\(")  # mul_(, div_(, ...; not __init__(
    assert in_place.search(rewritten)
    assert not in_place.search(unrewritten)
    report = bench.bench_op(spec, out_of_place=True, **FAST)
    assert [r.name for r in report.rows] == [bench.EAGER, bench.OUT_OF_PLACE, bench.PLAIN]
    assert all(r.fwd_bwd is not None and not r.note for r in report.rows)
    assert bench.OUT_OF_PLACE not in [r.name for r in bench.bench_op(spec, **FAST).rows]
