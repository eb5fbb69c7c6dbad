"""The command line: flags in, library calls out, errors mapped to messages and exit codes here only."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._version import __version__
from .api import generate_op
from .errors import ScaffoldError, SpecError
from .limits import TIME_LIMIT
from .spec import load_spec, spec_from_flags
from .write import write_files

EXIT_ERROR = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scaffold",
        description="Generate custom torch.autograd.Functions, Modules and their tests from sympy math.",
    )
    parser.add_argument("--version", action="version", version=f"scaffold {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    new = commands.add_parser("new", help="create something new")
    kinds = new.add_subparsers(dest="kind", metavar="KIND", required=True)
    op = kinds.add_parser(
        "op",
        help="generate an op: its autograd.Function, Module and tests",
        description="Generate DIR/NAME.py (Function, functional, Module) and DIR/test_NAME.py.",
        epilog='example: scaffold new op swish --forward "x / (1 + exp(-beta * x))" --tensor x --learnable beta=1.0',
    )
    op.add_argument("name", nargs="?", help="op name, a Python identifier (e.g. leaky_relu)")
    op.add_argument("--spec", metavar="FILE", help="read the op from a TOML spec file instead of flags")
    op.add_argument("--forward", metavar="EXPR", help='the forward as sympy math, e.g. "x * tanh(softplus)"')
    op.add_argument(
        "--tensor", metavar="T[=SHAPE]", action="append", default=[],
        help="a tensor argument, optionally with the example shape used by the tests (x=4,5 or beta=[])",
    )  # fmt: skip
    op.add_argument(
        "--learnable", metavar="T[=INIT]", action="append", default=[],
        help="a learnable tensor (an nn.Parameter of the Module), 0-dim unless --tensor gives a shape",
    )  # fmt: skip
    op.add_argument(
        "--scalar", metavar="S[:TYPE]=DEFAULT", action="append", default=[],
        help="a non-tensor argument with its default (alpha=0.5, n:int=3, flag=true)",
    )  # fmt: skip
    op.add_argument("--doc", default="", help="one line describing the op, for its docstring")
    op.add_argument("--output-dir", "-o", metavar="DIR", default=".", help="where to write (default: .)")
    op.add_argument("--force", action="store_true", help="overwrite existing files")
    op.add_argument(
        "--time-limit", metavar="SECONDS", type=_seconds, default=TIME_LIMIT,
        help=f"stop deriving after this many seconds (default: {TIME_LIMIT:g})",
    )  # fmt: skip
    op.set_defaults(handler=_new_op)
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _new_op(args: argparse.Namespace) -> int:
    if args.spec:
        given = [f for f, v in (("NAME", args.name), ("--forward", args.forward), ("--tensor", args.tensor),
                                ("--scalar", args.scalar), ("--learnable", args.learnable)) if v]  # fmt: skip
        if given:
            raise SpecError(
                f"--spec cannot be combined with {', '.join(given)}",
                hint="put everything in the spec file, or use flags alone",
            )
        spec = load_spec(args.spec)
    else:
        missing = [f for f, v in (("NAME", args.name), ("--forward", args.forward)) if v is None]
        if not args.tensor and not args.learnable:
            missing.append("--tensor")
        if missing:
            raise SpecError(
                f"missing {', '.join(missing)}",
                hint='e.g. scaffold new op swish --forward "x / (1 + exp(-x))" --tensor x, '
                "or scaffold new op --spec swish.toml",
            )
        spec = spec_from_flags(
            args.name, args.forward, args.tensor, args.scalar, learnable=args.learnable, doc=args.doc
        )
    files = generate_op(spec, time_limit=args.time_limit)
    for written in write_files(files, args.output_dir, force=args.force):
        print(f"{written.status:>11}  {written.path}")
    return 0


#: Options whose value may start with "-" (a forward of -x * y), which argparse would take for an option.
_DASHED_VALUES = ("--forward", "--doc")


def _attach_dashed_values(argv: Sequence[str]) -> list[str]:
    """``--forward -x*y`` -> ``--forward=-x*y``."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in _DASHED_VALUES:
            value = next(args, None)
            out.append(arg if value is None else f"{arg}={value}")
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(_attach_dashed_values(sys.argv[1:] if argv is None else argv))
    try:
        return args.handler(args)
    except ScaffoldError as exc:
        print(f"scaffold: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
