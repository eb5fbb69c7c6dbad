"""Run the generated tests of a representative set of ops under another torch release.

    python scripts/compat.py --torch 2.9.1                  # builds (or reuses) a venv with torch 2.9.1
    python scripts/compat.py --venv /path/to/venv           # a venv that has torch already
    python scripts/compat.py --torch 2.11.0 --venv /path/to/venv --ops swish layer_norm
    python scripts/compat.py --list                         # the ops, and nothing else

The venv gets scaffold (this checkout, editable) and pytest. The ops are generated here, by this checkout,
into a temporary folder; each op's generated tests then run there, in a pytest process of their own under
the venv's torch, the torch.compile checks included (inductor unless ``--backend`` says otherwise; CUDA
tests run where the venv's torch sees a GPU, else they are skipped). A table says, op by op, how many
tests passed, failed and were skipped; the exit status is 1 when any failed.

CI does not run this script (it builds a venv of several GB); tests/test_compat.py checks its arguments and
that every op in it generates.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scaffold import generate_op, spec_from_mapping, write_files  # noqa: E402 - after the checkout's path

#: One op of each kind that generated code takes a different path for: (name, kind, spec mapping).
OPS: list[tuple[str, str, dict]] = [
    (
        "swish",
        "elementwise, learnable, in place",
        {
            "forward": "x / (1 + exp(-beta * x))",
            "tensors": {"x": {"shape": [4, 5]}, "beta": {"shape": [], "learnable": True, "init": 1.0}},
        },
    ),
    ("softplus", "elementwise, stable rewrite", {"forward": "log(1 + exp(x))", "tensors": {"x": {"shape": [4, 5]}}}),
    (
        "smooth_l1",
        "masked (Piecewise), scalar",
        {
            "forward": "Piecewise((0.5 * (input - target)**2 / beta, Abs(input - target) < beta), "
            "(Abs(input - target) - 0.5 * beta, True))",
            "tensors": {"input": {"shape": [4, 5]}, "target": {"shape": [4, 5]}},
            "scalars": {"beta": {"type": "float", "default": 1.0}},
        },
    ),
    (
        "elu_steps",
        "steps, two outputs",
        {
            "forward": "pos = Max(x, 0)\nneg = Min(x, 0)\nout = pos + alpha * expm1(neg)",
            "tensors": {"x": {"shape": [4, 5]}},
            "scalars": {"alpha": {"type": "float", "default": 1.0}},
            "outputs": ["out", "neg"],
        },
    ),
    (
        "layer_norm",
        "structured (reductions), a named size",
        {
            "forward": "mu = mean(x, dim=-1, keepdim=True)\nxc = x - mu\nvar = mean(xc**2, dim=-1, keepdim=True)\n"
            "xc / sqrt(var + eps) * weight + bias",
            "sizes": {"features": 16},
            "tensors": {
                "x": {"shape": [8, "features"]},
                "weight": {"shape": ["features"], "learnable": True, "init": "ones"},
                "bias": {"shape": ["features"], "learnable": True, "init": "zeros"},
            },
            "scalars": {"eps": {"default": 1e-5}},
        },
    ),
    (
        "linear_relu",
        "structured (matmul), sizes, nn.Linear's init",
        {
            "forward": "Max(0, x @ transpose(weight, 0, 1) + bias)",
            "sizes": {"in_features": 16, "out_features": 32},
            "tensors": {
                "x": {"shape": [8, "in_features"]},
                "weight": {"shape": ["out_features", "in_features"], "learnable": True, "init": "linear"},
                "bias": {"shape": ["out_features"], "learnable": True, "init": "linear"},
            },
        },
    ),
    (
        "clip_ste",
        "custom gradient",
        {"forward": "sign(x)", "tensors": {"x": {"shape": [4, 5]}}, "gradients": {"x": "grad*Heaviside(1 - Abs(x))"}},
    ),
    (
        "swish_custom_op",
        "torch.library custom op",
        {
            "forward": "x / (1 + exp(-beta * x))",
            "tensors": {"x": {"shape": [4, 5]}, "beta": {"shape": [], "learnable": True, "init": 1.0}},
            "target": "custom_op",
        },
    ),
    (
        "gelu_fused",
        "fused (torch.compile inside)",
        {"forward": "x * (1 + erf(x / sqrt(2))) / 2", "tensors": {"x": {"shape": [4, 5]}}, "fuse": True},
    ),
    (
        "softmax_fused",
        "fused, structured",
        {"forward": "exp(x) / sum(exp(x), dim=-1, keepdim=True)", "tensors": {"x": {"shape": [8, 16]}}, "fuse": True},
    ),
]
OP_NAMES = [name for name, _, _ in OPS]
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


@dataclass
class Result:
    """One op's generated tests under the venv's torch."""

    name: str
    kind: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)  # test id: first line of the message


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="compat.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--torch", metavar="VERSION", help="the torch release to test, e.g. 2.9.1")
    parser.add_argument(
        "--venv",
        metavar="PATH",
        type=Path,
        help="the venv to use: reused where it exists (its torch must be --torch's), else built with --torch "
        "(default: scaffold-compat-torchVERSION in the temporary folder, reused on the next run)",
    )
    parser.add_argument("--ops", nargs="+", metavar="NAME", choices=OP_NAMES, default=OP_NAMES, help="ops to test")
    parser.add_argument(
        "--backend", default="inductor", help="torch.compile backend of the compile checks (default: inductor)"
    )
    parser.add_argument("--keep", metavar="DIR", type=Path, help="generate into DIR and keep it (default: a temp dir)")
    parser.add_argument("--list", action="store_true", help="print the ops and their kinds, and exit")
    args = parser.parse_args(argv)
    if args.list:
        return args
    if args.torch is None and args.venv is None:
        parser.error("give --torch VERSION (a venv is built with it) or --venv PATH (a venv with torch)")
    if args.torch is not None and not _VERSION.match(args.torch):
        parser.error(f"--torch {args.torch!r}: give a release number such as 2.9.1")
    if args.venv is None:
        args.venv = Path(tempfile.gettempdir()) / f"scaffold-compat-torch{args.torch}"
    return args


def generate(names: Sequence[str], folder: Path) -> list[Path]:
    """Generate the ops named into ``folder``, each in a folder of its own; return those folders."""
    kinds = {name: mapping for name, _, mapping in OPS}
    folders = []
    for name in names:
        spec = spec_from_mapping({"name": name, **kinds[name]}, source=f"scripts/compat.py ({name})")
        write_files(generate_op(spec), folder / name)
        folders.append(folder / name)
    return folders


def _python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("$", " ".join(str(part) for part in command), flush=True)
    return subprocess.run(command, check=True, **kwargs)


def torch_version(venv: Path) -> str | None:
    """The venv's torch (``2.9.1+cu128``), or None where it has none."""
    found = subprocess.run(
        [_python(venv), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    return found.stdout.strip() if found.returncode == 0 else None


def prepare_venv(venv: Path, torch: str | None) -> str:
    """Build ``venv`` with ``torch`` where it does not exist; install scaffold (editable) and pytest there.
    Returns the venv's torch version."""
    if not _python(venv).exists():
        if torch is None:
            sys.exit(f"compat.py: {venv} is no venv; give --torch VERSION to build one there")
        _run([sys.executable, "-m", "venv", str(venv)])
        _run([str(_python(venv)), "-m", "pip", "install", "--quiet", f"torch=={torch}"])
    version = torch_version(venv)
    if version is None:
        if torch is None:
            sys.exit(f"compat.py: {venv} has no torch; give --torch VERSION to install one")
        _run([str(_python(venv)), "-m", "pip", "install", "--quiet", f"torch=={torch}"])
        version = torch_version(venv)
    if torch is not None and version.split("+")[0] != torch:
        sys.exit(f"compat.py: {venv} has torch {version}, not {torch}; give another --venv, or leave it out")
    _run([str(_python(venv)), "-m", "pip", "install", "--quiet", "-e", str(REPO), "pytest"])
    return version


def run_tests(venv: Path, folder: Path, name: str, kind: str, backend: str) -> Result:
    """Run one op's generated tests in ``folder`` under the venv's torch; read pytest's JUnit report."""
    report = folder / "report.xml"
    command = [str(_python(venv)), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=folder, capture_output=True, text=True, env={**os.environ, "SCAFFOLD_COMPILE_BACKEND": backend}
    )
    result = Result(name, kind, seconds=time.perf_counter() - started)
    if not report.exists():  # pytest could not start (an import error in conftest, ...)
        result.failed = 1
        result.failures.append(f"pytest exited {done.returncode}: {(done.stdout + done.stderr).strip()[-500:]}")
        return result
    return read_report(report.read_text(), result)


def read_report(xml: str, result: Result) -> Result:
    """``result`` with the counts and failures of a pytest JUnit report."""
    for case in ElementTree.fromstring(xml).iter("testcase"):
        test = f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            result.failed += 1
            result.failures.append(f"{test}: {(problem.get('message') or '').splitlines()[0][:200]}")
        elif case.find("skipped") is not None:
            result.skipped += 1
        else:
            result.passed += 1
    return result


def table(results: Sequence[Result]) -> str:
    """The summary: one row per op, then the totals and every failure."""
    rows = [("op", "kind", "passed", "failed", "skipped", "seconds")]
    for r in results:
        rows.append((r.name, r.kind, str(r.passed), str(r.failed), str(r.skipped), f"{r.seconds:.0f}"))
    totals = [sum(getattr(r, what) for r in results) for what in ("passed", "failed", "skipped", "seconds")]
    rows.append(("total", f"{len(results)} ops", *(str(round(t)) for t in totals)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    lines += [f"FAILED {r.name}/{failure}" for r in results for failure in r.failures]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, kind, _ in OPS:
            print(f"{name:<18}{kind}")
        return 0
    version = prepare_venv(args.venv, args.torch)
    with tempfile.TemporaryDirectory(prefix="scaffold-compat-") as temporary:
        folder = args.keep or Path(temporary)
        kinds = {name: kind for name, kind, _ in OPS}
        results = []
        for op_folder in generate(args.ops, folder):
            print(f"testing {op_folder.name} ...", flush=True)
            results.append(run_tests(args.venv, op_folder, op_folder.name, kinds[op_folder.name], args.backend))
    python = subprocess.run([_python(args.venv), "--version"], capture_output=True, text=True).stdout.strip()
    print(f"\ntorch {version} ({python}, {args.venv}), torch.compile backend {args.backend}\n")
    print(table(results))
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
