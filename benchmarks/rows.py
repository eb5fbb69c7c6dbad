"""Row-wise norms, softmaxes and losses against PyTorch's native ops: time and share of the copy bandwidth.

    python benchmarks/rows.py --device cuda                         # issue 36's table: rows of 1024 and 8192
    python benchmarks/rows.py --ops rms_norm --widths 1024 --dtypes float32 --min-time 0.05

For each op of tests/structured_catalogue.py, each row width and each dtype: :func:`scaffold.bench.bench_op`
(scaffold eager and fused, plain autograd, plain torch.compile, the native op) on NUMEL elements in rows of the
width, forward + backward. Each candidate's row gives its time, its ratio to the native op and to torch.compile,
and the share of the measured copy bandwidth that the op's minimal traffic reaches
(:func:`scaffold.bench.minimal_traffic` over :func:`scaffold.bench.copy_bandwidth`). The table goes to stdout
row by row, progress to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OPS = ("rms_norm", "layer_norm", "softmax_textbook", "log_softmax_textbook", "soft_cross_entropy", "logsumexp_textbook")
NUMEL = 16 * 2**20


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(OPS), help=f"structured catalogue ops (default: {','.join(OPS)})")
    parser.add_argument("--widths", default="1024,8192", help="row widths (default: 1024,8192)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="dtypes (default: float32,bfloat16)")
    parser.add_argument("--numel", type=int, default=NUMEL, help=f"elements per input (default: {NUMEL})")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds each timing runs for (default: 0.2)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    return parser


def _in_rows(op, width: int):
    """The op's spec with its row tensors (2-d) of the width, and its vectors (a weight) of it."""
    from scaffold.spec import spec_from_mapping

    mapping = op.mapping()
    tensors = {}
    for name, tensor in mapping["tensors"].items():
        rank = len(tensor.get("shape", []))
        tensors[name] = {**tensor, "shape": [16, width] if rank == 2 else [width] if rank == 1 else []}
    return spec_from_mapping({**mapping, "tensors": tensors}, source=f"tests/structured_catalogue.py: {op.name}")


def _fused_paths(ops, device: str) -> str:
    """Which code "scaffold fused" times for each op: its Triton row kernels (on CUDA), or its math through
    torch.compile (on the CPU, where the kernels run only in Triton's interpreter, for correctness; and for an
    op that does not work row by row, with the reason)."""
    import dataclasses

    from scaffold import compile_op

    lines = ["scaffold fused runs:"]
    for op in ops:
        plan = compile_op(dataclasses.replace(_in_rows(op, 1024), fuse=True)).plan
        if plan.rows is None:
            lines.append(f"- {op.name}: torch.compile ({plan.rows_reason})")
        elif str(device).startswith("cuda"):
            lines.append(f"- {op.name}: its Triton row kernels")
        else:
            lines.append(f"- {op.name}: torch.compile (its Triton row kernels run on CUDA; on the CPU only in Triton's "
                         "interpreter, a correctness check, not a speed)")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # scaffold without installing it; the catalogue
    import structured_catalogue

    from scaffold import bench

    catalogue = {op.name: op for op in structured_catalogue.STRUCTURED}
    names = [n.strip() for n in args.ops.split(",") if n.strip()]
    unknown = [n for n in names if n not in catalogue]
    if unknown:
        print(f"rows.py: error: not in tests/structured_catalogue.py: {', '.join(unknown)}", file=sys.stderr)
        return 1
    device = bench.resolve_device(args.device)
    bandwidth = bench.copy_bandwidth(device)
    print(f"{bench.machine_description(device)}; copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + written)\n")
    print(_fused_paths([catalogue[n] for n in names], device), flush=True)
    print("| op | width | dtype | candidate | fwd+bwd µs | vs native | vs torch.compile | share of copy bandwidth |")
    print("|---|---:|---|---|---:|---:|---:|---:|", flush=True)
    for dtype in (d.strip() for d in args.dtypes.split(",")):
        for width in (int(w) for w in args.widths.split(",")):
            for name in names:
                spec = _in_rows(catalogue[name], width)
                print(f"{name}, rows of {width}, {dtype}...", file=sys.stderr, flush=True)
                report = bench.bench_op(
                    spec, device=device, dtype=dtype, numel=args.numel, native=catalogue[name].native,
                    native_name="torch", min_time=args.min_time,
                )  # fmt: skip
                traffic = bench.minimal_traffic(spec, args.numel, bench.resolve_dtype(dtype))
                native = next((r for r in report.rows if r.name.startswith(bench.NATIVE_PREFIX)), None)
                compiled = report.row(bench.COMPILED)
                for row in report.rows:
                    if row.fwd_bwd is None:
                        print(f"| {name} | {width} | {dtype} | {row.name} | — | | | {row.note} |", flush=True)
                        continue
                    vs_native = bench.time_ratio(row.fwd_bwd, native.fwd_bwd if native else None)
                    vs_compiled = bench.time_ratio(row.fwd_bwd, compiled.fwd_bwd if compiled else None)
                    share = traffic / row.fwd_bwd.median / bandwidth
                    print(
                        f"| {name} | {width} | {dtype} | {row.name} | {row.fwd_bwd.median * 1e6:.0f} | "
                        f"{bench.format_ratio(vs_native)} | {bench.format_ratio(vs_compiled)} | {share:.0%} |",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
