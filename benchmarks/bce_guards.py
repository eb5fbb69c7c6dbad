"""What binary cross-entropy's guards cost: the generated op against plain autograd of the same formula and the
same Function without its guards (nan where a prediction of 0 meets a target of 0), fwd+bwd, on the CPU.

    python benchmarks/bce_guards.py                 # 4 Mi float32 elements, one thread
    python benchmarks/bce_guards.py --numel 1048576 --min-time 0.5

Prints one line per candidate: the median time (torch.utils.benchmark) and its ratio to plain autograd.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile

import torch
from torch.utils.benchmark import Timer

from scaffold.api import generate_op
from scaffold.spec import spec_from_flags
from scaffold.write import write_files

FORWARD = "-(y*log(p) + (1 - y)*log(1 - p))"


class Unguarded(torch.autograd.Function):
    """The formula and its derivatives as written: no guards (nan at p = 0, y = 0 and at p = 1, y = 1)."""

    @staticmethod
    def forward(ctx, p, y):
        ctx.save_for_backward(p, y)
        return ((y - 1) * torch.log1p(-p)).sub_(y * torch.log(p))

    @staticmethod
    def backward(ctx, grad):
        p, y = ctx.saved_tensors
        return ((1 - y) / (1 - p)).sub_(y / p).mul_(grad), torch.logit(p).neg_().mul_(grad)


def plain(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--min-time", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = tempfile.mkdtemp(prefix="bce-guards-")
    write_files(generate_op(spec_from_flags("bce", FORWARD, ["p", "y"])), folder)
    sys.path.insert(0, folder)
    generated = importlib.import_module("bce").bce
    p = torch.rand(args.numel).clamp_(1e-4, 1 - 1e-4).requires_grad_()
    y = torch.rand(args.numel).requires_grad_()
    grad = torch.randn(args.numel)
    times = {}
    for name, op in [("plain autograd", plain), ("scaffold (guards)", generated), ("no guards", Unguarded.apply)]:
        timer = Timer(
            "torch.autograd.grad(op(p, y), (p, y), grad)",
            globals={"torch": torch, "op": op, "p": p, "y": y, "grad": grad},
        )
        times[name] = timer.blocked_autorange(min_run_time=args.min_time).median * 1e3
        print(f"{name:>18}: {times[name]:7.2f} ms  {times[name] / times['plain autograd']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
