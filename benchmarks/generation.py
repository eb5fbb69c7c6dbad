"""Generation time of `scaffold new op`, interpreter start included, and how it grows with the expression.

    python benchmarks/generation.py [--runs 5]

Times, as a fresh process each (what a user waits for): a dozen ordinary ops from the catalogue, then
the sum of n terms a_i*tanh(w_i*x + b_i) (3n + 1 tensors) for n = 16, 32, 64, 128. Prints medians and
the n = 128 / n = 16 ratio (the issue's bound: <= 16x; ordinary ops: <= 0.8 s median).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from catalogue import OPS  # noqa: E402

from scaffold.spec import spec_from_mapping, spec_to_toml  # noqa: E402

ORDINARY = ["swish", "gelu", "mish", "softplus", "elu", "leaky_relu", "huber", "mse", "bce_with_logits",
            "log_cosh", "affine", "hardswish"]  # fmt: skip


def tanh_sum(n: int) -> str:
    forward = " + ".join(f"a{i}*tanh(w{i}*x + b{i})" for i in range(n))
    tensors = ["x"] + [f"{p}{i}" for i in range(n) for p in "awb"]
    return f'name = "tanh_sum{n}"\nforward = "{forward}"\n' + "".join(f"\n[tensors.{t}]\n" for t in tensors)


def time_spec(spec_file: Path, out: Path, runs: int) -> float:
    command = [sys.executable, "-m", "scaffold", "new", "op", "--spec", str(spec_file), "-o", str(out), "--force"]
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        print("| op | median s |\n|---|---:|")
        medians = []
        for op in (o for o in OPS if o.name in ORDINARY):
            spec_file = root / f"{op.name}.toml"
            spec_file.write_text(spec_to_toml(spec_from_mapping(op.mapping(), source=op.name)))
            medians.append(time_spec(spec_file, root / "out", args.runs))
            print(f"| {op.name} | {medians[-1]:.3f} |", flush=True)
        print(f"\nmedian over {len(medians)} ordinary ops: {statistics.median(medians):.3f} s\n")
        family = {}
        print("| n | tensors | median s |\n|---:|---:|---:|")
        for n in (16, 32, 64, 128):
            spec_file = root / f"tanh_sum{n}.toml"
            spec_file.write_text(tanh_sum(n))
            family[n] = time_spec(spec_file, root / "out", max(1, args.runs // 2))
            print(f"| {n} | {3 * n + 1} | {family[n]:.3f} |", flush=True)
        print(f"\nn = 128 / n = 16: {family[128] / family[16]:.1f}x")


if __name__ == "__main__":
    main()
