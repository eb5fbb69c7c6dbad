"""Benchmark scaffold's generated ops against plain PyTorch and PyTorch's own ops; print a markdown table.

    python benchmarks/run.py                                  # the default ops, float32, 4 Mi elements
    python benchmarks/run.py --ops gelu,mish --no-compile --min-time 0.2
    python benchmarks/run.py --structured                     # norms, softmax losses, attention, ...

For every op (from tests/catalogue.py or tests/structured_catalogue.py, with PyTorch's own implementation as
the native op):
:func:`scaffold.bench.bench_op`, then one table row of ratios of forward+backward time and of bytes
saved for backward. The table goes to stdout, progress to stderr; nothing is written to disk.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Activations, losses and broadcasting ops with a native PyTorch equivalent (log_cosh has none).
DEFAULT_OPS = (
    "swish", "silu", "gelu", "gelu_tanh", "mish", "softplus", "elu", "leaky_relu", "logsigmoid", "hardswish",
    "sigmoid", "tanh_op", "mse", "huber", "bce_with_logits", "log_cosh", "affine", "lerp", "mul",
)  # fmt: skip

#: Ops that reduce, normalize or multiply matrices, with a native PyTorch equivalent.
STRUCTURED_OPS = (
    "logsumexp_textbook", "softmax_textbook", "log_softmax_textbook", "soft_cross_entropy", "mse_mean", "rms_norm",
    "layer_norm", "linear_relu", "attention", "cosine_similarity", "l2_normalize", "softmax_entropy", "amax_rows",
    "gram", "logistic_nll", "sum_of_squares", "mean_variance", "log_softmax_and_logsumexp", "bilinear_form",
)  # fmt: skip
#: A structured op's example dimensions (all but the batch one) are this many times wider in the benchmark:
#: rows of 1024 features, as in a model, not the catalogue's 16.
WIDTH = 64

COLUMNS = (
    ("eager vs plain", "eager fwd+bwd"),
    ("eager saved vs plain", "eager saved"),
    ("eager vs native", "eager vs native"),
    ("fused vs plain", "fused fwd+bwd"),
    ("fused vs native", "fused vs native"),
    ("fused vs torch.compile", "fused vs compiled"),
    ("in place vs out of place", "in place"),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help=f"comma-separated catalogue ops (default: {','.join(DEFAULT_OPS)})")
    parser.add_argument("--structured", action="store_true", help=f"the structured ops: {','.join(STRUCTURED_OPS)}")
    parser.add_argument("--numel", type=int, default=None, help="elements per input (default: 4194304)")
    parser.add_argument("--min-time", type=float, default=None, help="seconds each timing runs for (default: 1)")
    parser.add_argument("--no-compile", action="store_true", help="skip scaffold fused and plain torch.compile")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--dtype", default="float32", help="float32 (default), float64, bfloat16 or float16")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument(
        "--out-of-place",
        action="store_true",
        help="also time the eager op with no in-place temporaries: the column 'in place vs out of place'",
    )
    return parser


def _catalogue() -> dict:
    ops = [*importlib.import_module("catalogue").OPS, *importlib.import_module("structured_catalogue").STRUCTURED]
    return {op.name: op for op in ops}


def _selected(text: str | None, catalogue: dict, structured: bool = False) -> list:
    default = STRUCTURED_OPS if structured else DEFAULT_OPS
    names = [n.strip() for n in text.split(",") if n.strip()] if text else list(default)
    unknown = [n for n in names if n not in catalogue]
    if not names or unknown:
        raise SystemExit(f"run.py: error: not in tests/catalogue.py: {', '.join(unknown) or 'no ops given'}")
    return [catalogue[n] for n in names]


def _ratios(report) -> dict[str, float | None]:
    from scaffold import bench

    def fwd_bwd(name: str | None) -> bench.Timing | None:
        row = report.row(name) if name else None
        return row.fwd_bwd if row is not None else None

    def saved(name: str) -> int | None:
        row = report.row(name)
        return row.saved_bytes if row is not None else None

    native = next((r.name for r in report.rows if r.name.startswith(bench.NATIVE_PREFIX)), None)
    plain = fwd_bwd(bench.PLAIN)
    return {
        "plain ms": plain.median if plain is not None else None,
        "eager fwd+bwd": bench.time_ratio(fwd_bwd(bench.EAGER), fwd_bwd(bench.PLAIN)),
        "eager saved": bench.ratio(saved(bench.EAGER), saved(bench.PLAIN)),
        "eager vs native": bench.time_ratio(fwd_bwd(bench.EAGER), fwd_bwd(native)),
        "fused fwd+bwd": bench.time_ratio(fwd_bwd(bench.FUSED), fwd_bwd(bench.PLAIN)),
        "fused vs native": bench.time_ratio(fwd_bwd(bench.FUSED), fwd_bwd(native)),
        "fused vs compiled": bench.time_ratio(fwd_bwd(bench.FUSED), fwd_bwd(bench.COMPILED)),
        "in place": bench.time_ratio(fwd_bwd(bench.EAGER), fwd_bwd(bench.OUT_OF_PLACE)),
    }


def _notes(report) -> str:
    return "; ".join(f"{row.name}: {row.note}" for row in report.rows if row.note).replace("|", "\\|")


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _table(results: list[tuple[str, dict[str, float | None], str]], *, compiled: bool, out_of_place: bool) -> list[str]:
    columns = [
        (title, key)
        for title, key in COLUMNS
        if (compiled or not key.startswith("fused")) and (out_of_place or key != "in place")
    ]
    lines = [
        "| op | plain autograd fwd+bwd (ms) | " + " | ".join(title for title, _ in columns) + " | note |",
        "|---|---:|" + "---:|" * len(columns) + "---|",
    ]
    for name, ratios, note in results:
        plain = ratios["plain ms"]
        cells = [name, "—" if plain is None else f"{plain * 1e3:.2f}", *(_cell(ratios[key]) for _, key in columns)]
        lines.append("| " + " | ".join([*cells, note]) + " |")
    medians = {key: _median([r[key] for _, r, _ in results]) for _, key in columns}
    cells = [f"**median of {len(results)} ops**", "", *(_cell(medians[key]) for _, key in columns), ""]
    lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    summary = ", ".join(f"{title} {_cell(medians[key])}" for title, key in columns if medians[key] is not None)
    lines.append(f"Medians over {len(results)} ops: {summary}.")
    return lines


def _widened(spec):
    """A structured op's spec with every dimension above 1 but the first tensor's first made WIDTH times wider."""
    import dataclasses

    batch = spec.tensors[0].shape[0] if spec.tensors[0].shape else None

    def wider(t, index):
        return tuple(n if n == 1 or (d == 0 and n == batch) else n * WIDTH for d, n in enumerate(t.shape))

    tensors = tuple(dataclasses.replace(t, shape=wider(t, i)) for i, t in enumerate(spec.tensors))
    return dataclasses.replace(spec, tensors=tensors)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # scaffold without installing it; the catalogue
    from scaffold import bench
    from scaffold.errors import ScaffoldError
    from scaffold.spec import spec_from_mapping

    ops = _selected(args.ops, _catalogue(), args.structured)
    try:  # settings wrong for every op are reported once
        bench.resolve_dtype(args.dtype), bench.resolve_device(args.device)
    except ScaffoldError as exc:
        print(f"run.py: error: {exc}", file=sys.stderr)
        return 1
    given = (("numel", args.numel), ("min_time", args.min_time), ("threads", args.threads))
    options = {key: value for key, value in given if value is not None}
    results = []
    report = None
    failed = False
    for index, op in enumerate(ops, start=1):

        def progress(message: str, prefix: str = f"[{index}/{len(ops)}] {op.name}: ") -> None:
            print(prefix + message, file=sys.stderr, flush=True)

        try:
            spec = spec_from_mapping(op.mapping(), source=f"tests/catalogue.py: {op.name}")
            report = bench.bench_op(
                _widened(spec) if spec.structured else spec,
                device=args.device,
                dtype=args.dtype,
                native=op.native,
                native_name="torch",
                compile=not args.no_compile,
                progress=progress,
                out_of_place=args.out_of_place,
                **options,
            )
        except ScaffoldError as exc:  # one op that cannot be benchmarked does not stop the others
            print(f"run.py: error: {exc}", file=sys.stderr)
            results.append(
                (
                    op.name,
                    dict.fromkeys(["plain ms", *(key for _, key in COLUMNS)]),
                    f"failed: {str(exc).splitlines()[0]}",
                )
            )
            failed = True
            continue
        results.append((op.name, _ratios(report), _notes(report)))
    if report is None:
        return 1
    compiled = "without torch.compile (--no-compile)" if args.no_compile else "with torch.compile"
    print(f"Machine: {report.machine}.")
    print(
        f"{report.device}, {report.dtype}, {report.numel:,} elements per input, each timing at least "
        f"{report.min_time:g} s (median of torch.utils.benchmark blocks), {compiled}."
    )
    print(
        "Ratios of forward+backward time (`torch.autograd.grad` of the output) and of bytes saved for backward; "
        "lower is better. plain = the forward as written in plain torch under autograd; native = PyTorch's own op."
    )
    print()
    print("\n".join(_table(results, compiled=not args.no_compile, out_of_place=args.out_of_place)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
