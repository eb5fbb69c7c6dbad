"""The command line: flags in, library calls out, errors mapped to messages and exit codes here only."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from ._version import __version__
from .api import generate_op
from .changes import FileChange, Flags, new_op_changes, template_update_changes, update_changes
from .errors import ScaffoldError, ScaffoldWarning, SpecError, did_you_mean
from .limits import TIME_LIMIT
from .project import RECORDS, Project, find_project, new_project
from .spec import POLICIES, TARGETS, load_spec, spec_from_flags, spec_with_flags
from .write import apply_changes, write_files

EXIT_ERROR = 1
#: `scaffold check` on bad input (1 says a check failed).
EXIT_BAD_CHECK_INPUT = 2
#: `scaffold update` wrote conflict markers (or would have, with --dry-run).
EXIT_CONFLICT = 3


def _parser() -> argparse.ArgumentParser:
    """The whole command line: ``scaffold new op|project``, ``scaffold update [op|project]``, ``scaffold bench``."""
    parser = argparse.ArgumentParser(
        prog="scaffold",
        description="Generate custom torch.autograd.Functions, Modules and their tests from sympy math.",
    )
    parser.add_argument("--version", action="version", version=f"scaffold {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_new(commands)
    _add_update(commands)
    _add_bench(commands)
    _add_check(commands)
    return parser


def _add_new(commands: argparse._SubParsersAction) -> None:
    """``scaffold new``, which needs a kind: ``new op`` or ``new project``."""
    new = commands.add_parser("new", help="create something new")
    kinds = new.add_subparsers(dest="kind", metavar="KIND", required=True)
    _add_new_op(kinds)
    _add_new_project(kinds)


def _add_new_op(kinds: argparse._SubParsersAction) -> None:
    """``scaffold new op``: an op from flags or a spec file, into a project or a folder."""
    op = kinds.add_parser(
        "op",
        help="generate an op: its autograd.Function, Module and tests",
        description="Generate DIR/NAME.py (Function, functional, Module) and DIR/test_NAME.py.",
        epilog='example: scaffold new op swish --forward "x / (1 + exp(-beta * x))" --tensor x --learnable beta=1.0',
    )
    op.add_argument("name", nargs="?", help="op name, a Python identifier (e.g. leaky_relu)")
    op.add_argument("--spec", metavar="FILE", help="read the op from a TOML spec file instead of flags")
    op.add_argument(
        "--forward",
        metavar="EXPR",
        help='the forward as sympy math, e.g. "x * tanh(log(1 + exp(x)))", or in steps separated by ";", '
        'e.g. "h = x*w + b; h*sigmoid(h)"',
    )
    _argument_flags(
        op,
        tensor="a tensor argument, optionally with the example shape used by the tests (x=4,5 or beta=[]); "
        "an entry may be a size name (x=4,features)",
        learnable="a learnable tensor (an nn.Parameter of the Module), 0-dim unless --tensor gives a shape; "
        "INIT is a number or a scheme (ones, zeros, normal(mean,std), uniform(low,high), kaiming_uniform, "
        "xavier_uniform, linear)",
        scalar="a non-tensor argument with its default (alpha=0.5, n:int=3, flag=true)",
        size="a size name's example value (features=16): the Module's constructor takes the sizes of its "
        "learnable tensors",
    )
    _gradient_flag(op)
    op.add_argument("--doc", default="", help="one line describing the op, for its docstring")
    _plan_flags(op, fuse_help="run the op's math through torch.compile (fuse = true in a spec)")
    op.add_argument(
        "--output-dir", "-o", metavar="DIR",
        help="where to write NAME.py and test_NAME.py (default: inside a project, its specs/, ops/ and tests/; "
        "elsewhere the current folder)",
    )  # fmt: skip
    op.add_argument("--force", action="store_true", help="overwrite existing files")
    _time_limit(op)
    op.set_defaults(handler=_new_op)


def _add_new_project(kinds: argparse._SubParsersAction) -> None:
    """``scaffold new project``: a project from the copier template."""
    project = kinds.add_parser(
        "project",
        help="create a library of custom ops from scaffold's copier template",
        description="Create DEST from scaffold's project template (offline). Questions not answered with "
        "--data are asked, or take their defaults with --defaults.",
        epilog="example: scaffold new project my-ops --defaults (the package: my_ops)",
    )
    project.add_argument("dest", metavar="DEST", help="the new project's folder (new or empty)")
    project.add_argument("--defaults", action="store_true", help="use the default answer to every question not given")
    project.add_argument(
        "--data", "-d", metavar="KEY=VALUE", action="append", default=[],
        help="answer a question, e.g. --data project_name=myops (repeatable)",
    )  # fmt: skip
    _template_flag(project)
    project.set_defaults(handler=_new_project)


def _add_update(commands: argparse._SubParsersAction) -> None:
    """``scaffold update`` (every op), with its kinds ``update op`` and ``update project``."""
    update = commands.add_parser(
        "update",
        help="regenerate ops inside a project (or update it from its template), keeping your edits",
        description="Re-derive ops from specs/NAME.toml (`update project`: render the project template "
        "again) and merge three ways into your files: the last generation (in .scaffold/), your files "
        "now and the new generation. Edits that do not overlap what changed are kept; overlapping ones "
        f"are written with conflict markers and the command exits with {EXIT_CONFLICT}. Without KIND: "
        "every op.",
    )
    _dry_run(update)
    _time_limit(update)
    update.set_defaults(handler=_update)
    update_kinds = update.add_subparsers(dest="kind", metavar="KIND")
    _add_update_op(update_kinds)
    _add_update_project(update_kinds)


def _add_update_op(update_kinds: argparse._SubParsersAction) -> None:
    """``scaffold update op``: one op (or every op) from its spec, which flags change first."""
    update_op = update_kinds.add_parser(
        "op",
        help="update one op (or every op, without NAME)",
        description="Update the op NAME (every op without NAME) from its spec; flags change the spec first.",
        epilog='example: scaffold update op swish --forward "x * sigmoid(beta * x) * gamma" --learnable gamma=1.0',
    )
    update_op.add_argument("name", nargs="?", help="the op to update (default: every op in specs/)")
    update_op.add_argument("--forward", metavar="EXPR", help="a new forward, written into specs/NAME.toml")
    _argument_flags(
        update_op,
        tensor="add a tensor argument, or replace the argument of that name",
        learnable="add a learnable tensor, or replace the argument of that name",
        scalar="add a non-tensor argument, or replace the argument of that name",
        size="add a size name's example value, or replace it (features=16)",
    )
    _gradient_flag(update_op)
    update_op.add_argument("--doc", help="a new one-line description")
    _plan_flags(update_op, fuse_help="turn fused mode (torch.compile) on or off in the spec", optional=True)
    _dry_run(update_op, inner=True)
    _time_limit(update_op, inner=True)
    update_op.set_defaults(handler=_update)


def _add_update_project(update_kinds: argparse._SubParsersAction) -> None:
    """``scaffold update project``: the project from its template, merged into the user's files."""
    update_project = update_kinds.add_parser(
        "project",
        help="update the project from scaffold's project template, keeping your edits",
        description="Render the project template again with the answers in .copier-answers.yml and merge "
        "it three ways into your files: the template's last render (in .scaffold/project-template/), "
        "your files now and the new render. New template files are created; files the template no "
        "longer writes, and files you deleted, are left alone. The ops are not touched.",
        epilog="example: scaffold update project --dry-run",
    )
    update_project.add_argument(
        "--adopt", action="store_true",
        help="for a project without .scaffold/project-template/: record the template's render as the base "
        "and change nothing else",
    )  # fmt: skip
    _template_flag(update_project)
    _dry_run(update_project, inner=True)
    update_project.set_defaults(handler=_update_project)


def _add_bench(commands: argparse._SubParsersAction) -> None:
    """``scaffold bench``: time an op against plain PyTorch."""
    bench = commands.add_parser(
        "bench",
        help="time an op against the same math in plain PyTorch",
        description="Time the generated op (eager and fused) against its forward in plain PyTorch under "
        "autograd, that under torch.compile, and a native PyTorch op if you name one: forward and "
        "forward+backward times (median ± IQR) and the bytes kept for backward, as a markdown table. "
        "Progress goes to stderr.",
        epilog="example: scaffold bench --spec gelu.toml --native torch.nn.functional.gelu --numel 1048576",
    )
    bench.add_argument("name", nargs="?", help="an op of the current project (its specs/NAME.toml)")
    bench.add_argument("--spec", metavar="FILE", help="benchmark the op of this TOML spec file instead")
    bench.add_argument("--device", default="cpu", help="where to run it: cpu (default), cuda, cuda:1, ...")
    bench.add_argument("--dtype", default="float32", help="float32 (default), float64, bfloat16 or float16")
    bench.add_argument(
        "--numel", metavar="N", type=_count,
        help="elements of the largest input (default: 4194304 = 4 Mi); the spec's shapes are grown to it",
    )  # fmt: skip
    bench.add_argument(
        "--native", metavar="DOTTED.NAME",
        help="also time this PyTorch op, called like the op (tensors, then scalars), e.g. torch.nn.functional.gelu",
    )  # fmt: skip
    bench.add_argument(
        "--no-compile", action="store_true",
        help="skip what needs torch.compile (scaffold fused, plain torch.compile): compiling takes seconds",
    )  # fmt: skip
    bench.add_argument(
        "--min-time", metavar="SECONDS", type=_seconds,
        help="time each candidate for at least this long (default: 1)",
    )  # fmt: skip
    bench.add_argument(
        "--threads", metavar="N", type=_count,
        help="CPU threads torch may use (default: torch's setting); 1 gives steadier times on a busy machine",
    )  # fmt: skip
    _time_limit(bench)
    bench.set_defaults(handler=_bench)


def _add_check(commands: argparse._SubParsersAction) -> None:
    """``scaffold check``: a hand-written Function against the math of a spec."""
    check = commands.add_parser(
        "check",
        help="check a hand-written autograd.Function against its math",
        description="Hold a hand-written torch.autograd.Function (or a function, or a Module) against the math of "
        "a spec: values, gradients, gradcheck and gradgradcheck, the ctx rules, needs_input_grad, a second "
        "backward, inputs left unchanged, a second shape, float32 at extreme inputs, torch.compile and "
        "torch.func. Exit code 0 when every check passes, 1 when one fails, 2 for bad input.",
        epilog='example: scaffold check my_ops.py:SwishFunction --forward "x * sigmoid(beta * x)" --tensor x '
        "--tensor beta=[]",
    )
    check.add_argument(
        "target", metavar="TARGET", help="FILE.py:CLASS or MODULE.NAME:CLASS (or a function, or a Module)"
    )
    check.add_argument("--spec", metavar="FILE", help="the op's math as a TOML spec file (instead of the flags)")
    check.add_argument("--forward", metavar="EXPR", help="the forward as sympy math (as for scaffold new op)")
    _argument_flags(
        check,
        tensor="a tensor argument, with its example shape (x=4,5)",
        learnable="a learnable tensor (as for scaffold new op)",
        scalar="a non-tensor argument with the value the checks pass (eps=1e-6)",
        size="a size name's example value (features=16)",
    )
    _gradient_flag(check)
    check.add_argument(
        "--call", metavar="TEXT",
        help='how to call it on the spec\'s arguments when not in order (tensors, then scalars), e.g. '
        '"SmoothL1.apply(input, target, beta)"; parsed, never run as Python',
    )  # fmt: skip
    check.add_argument("--strict", action="store_true", help="fail on warnings too (not twice differentiable, ...)")
    check.add_argument("--device", default="cpu", help="where to run the checks: cpu (default) or cuda")
    check.add_argument(
        "--only", metavar="CHECKS",
        help="run only these checks, comma-separated (forward,gradients,gradcheck,gradgradcheck,needs_input_grad,"
        "ctx,retain_graph,inputs_unchanged,second_shape,extreme_inputs,compile,torch_func)",
    )  # fmt: skip
    check.add_argument(
        "--write-tests", metavar="DIR",
        help="also write DIR/test_check_NAME.py: a pytest file that runs the same checks (CPU and CUDA)",
    )  # fmt: skip
    check.add_argument("--force", action="store_true", help="overwrite the test file --write-tests would write")
    _time_limit(check)
    check.set_defaults(handler=_check)


def _plan_flags(command: argparse.ArgumentParser, *, fuse_help: str, optional: bool = False) -> None:
    """--fuse and --policy: how the op is planned (``optional``: --fuse/--no-fuse, unset by default)."""
    action = argparse.BooleanOptionalAction if optional else "store_true"
    command.add_argument("--fuse", action=action, default=None, help=fuse_help)
    command.add_argument(
        "--policy", choices=POLICIES, default=None,
        help="what backward's plan favours: memory (default; fewest bytes saved) or time (fewest operations)",
    )  # fmt: skip
    command.add_argument(
        "--target", choices=TARGETS, default=None,
        help="function (default): a torch.autograd.Function; custom_op: a torch.library custom op built on it",
    )  # fmt: skip
    command.add_argument(
        "--namespace", default=None,
        help="the custom op's namespace (default: the project's package, or scaffold outside a project)",
    )  # fmt: skip


def _gradient_flag(command: argparse.ArgumentParser) -> None:
    """--gradient T=EXPR and --output NAME (repeatable): a custom gradient, an output."""
    command.add_argument(
        "--gradient", metavar="T=EXPR", action="append", default=[],
        help='a custom gradient: what backward returns for tensor T, over the forward\'s names and grad '
        '(the upstream gradient; grad_NAME for each of several outputs), e.g. x="grad" for a straight-through '
        "estimator (repeatable)",
    )  # fmt: skip
    command.add_argument(
        "--output", metavar="NAME", action="append", default=[],
        help="a value of the forward (written in steps) that the op returns; repeat it for several outputs, "
        "returned as a tuple in that order (default: the forward's last line)",
    )  # fmt: skip


def _argument_flags(command: argparse.ArgumentParser, *, tensor: str, learnable: str, scalar: str, size: str) -> None:
    """--tensor, --learnable, --scalar and --size (repeatable), with the command's own help for each."""
    for flag, metavar, help_text in (
        ("--tensor", "T[=SHAPE]", tensor),
        ("--learnable", "T[=INIT]", learnable),
        ("--scalar", "S[:TYPE]=DEFAULT", scalar),
        ("--size", "NAME=VALUE", size),
        (
            "--domain",
            "T=LOW,HIGH",
            "where tensor T's test inputs are drawn, both ends included (x=0.1,10 for log(x)): "
            "the spec's domain = [LOW, HIGH]",
        ),
    ):
        command.add_argument(flag, metavar=metavar, action="append", default=[], help=help_text)


def _template_flag(command: argparse.ArgumentParser) -> None:
    """--template: a copier template in place of the shipped one."""
    command.add_argument(
        "--template", metavar="DIR",
        help="a copier template to use instead of the project template shipped with scaffold (e.g. your copy of it)",
    )  # fmt: skip


def _dry_run(command: argparse.ArgumentParser, *, inner: bool = False) -> None:
    """--dry-run, which every level of ``scaffold update`` takes (``update --dry-run op`` and ``update op
    --dry-run`` alike). An ``inner`` level has no default: it must not reset what the outer level was given."""
    command.add_argument(
        "--dry-run", action="store_true", default=argparse.SUPPRESS if inner else False,
        help="show the diff of what would change; write nothing",
    )  # fmt: skip


def _time_limit(command: argparse.ArgumentParser, *, inner: bool = False) -> None:
    """--time-limit on deriving an op (``inner``: no default, as for :func:`_dry_run`)."""
    command.add_argument(
        "--time-limit", metavar="SECONDS", type=_seconds, default=argparse.SUPPRESS if inner else TIME_LIMIT,
        help=f"stop deriving an op after this many seconds (default: {TIME_LIMIT:g})",
    )  # fmt: skip


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _count(text: str) -> int:
    """An argparse type: a positive whole number; underscores are ignored (1_048_576)."""
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _new_op(args: argparse.Namespace) -> int:
    if args.spec:
        given = [f for f, v in (("NAME", args.name), ("--forward", args.forward), ("--tensor", args.tensor),
                                ("--scalar", args.scalar), ("--learnable", args.learnable), ("--size", args.size),
                                ("--gradient", args.gradient), ("--output", args.output),
                                ("--domain", args.domain)) if v]  # fmt: skip
        if given:
            raise SpecError(
                f"--spec cannot be combined with {', '.join(given)}",
                hint="put everything in the spec file, or use flags alone",
            )
        spec = load_spec(args.spec)
        if _plan_flags_given(args):  # flags over the file's keys
            spec = spec_with_flags(
                spec, fuse=args.fuse, policy=args.policy, target=args.target, namespace=args.namespace
            )
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
            args.name,
            args.forward,
            args.tensor,
            args.scalar,
            learnable=args.learnable,
            doc=args.doc,
            fuse=bool(args.fuse),
            policy=args.policy or "memory",
            gradients=args.gradient,
            outputs=args.output,
            target=args.target or "function",
            namespace=args.namespace or "",
            sizes=args.size,
            domains=args.domain,
        )
    project = None if args.output_dir is not None else find_project()
    if project is None:
        files = generate_op(spec, time_limit=args.time_limit)
        for written in write_files(files, args.output_dir or ".", force=args.force):
            print(f"{written.status:>11}  {written.path}")
        return 0
    # A spec file is copied into the project as written, unless flags changed it.
    as_written = args.spec and not _plan_flags_given(args)
    spec_text = Path(args.spec).read_text(encoding="utf-8") if as_written else None
    changes = new_op_changes(project, spec, spec_text=spec_text, force=args.force, time_limit=args.time_limit)
    apply_changes(project.root, changes)
    _report(changes)
    return 0


def _plan_flags_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, flag) is not None for flag in ("fuse", "policy", "target", "namespace"))


def _new_project(args: argparse.Namespace) -> int:
    data = {}
    for item in args.data:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"cannot read --data {item!r}", hint="write key=value, e.g. --data project_name=myops")
        data[key.strip()] = value
    dest = new_project(
        args.dest, data=data, defaults=args.defaults, interactive=sys.stdin.isatty(), template=args.template
    )
    print(f"{'created':>11}  {dest}{os.sep}")
    print(f"\nNext: cd {dest} and add an op, e.g.\n")
    print('    scaffold new op swish --forward "x / (1 + exp(-beta * x))" --tensor x --learnable beta=1.0')
    print("    python -m pytest")
    return 0


def _find_project() -> Project:
    project = find_project()
    if project is None:
        raise SpecError(
            "not inside a scaffold project: no pyproject.toml with a [tool.scaffold] table here or above",
            where=os.getcwd(),
            hint='run it inside a project made by `scaffold new project`, or add [tool.scaffold] package = "..."',
        )
    return project


def _update(args: argparse.Namespace) -> int:
    project = _find_project()
    name = getattr(args, "name", None)
    flags = Flags(
        forward=getattr(args, "forward", None),
        doc=getattr(args, "doc", None),
        tensors=getattr(args, "tensor", ()),
        scalars=getattr(args, "scalar", ()),
        learnable=getattr(args, "learnable", ()),
        sizes=getattr(args, "size", ()),
        domains=getattr(args, "domain", ()),
        fuse=getattr(args, "fuse", None),
        policy=getattr(args, "policy", None),
        gradients=getattr(args, "gradient", ()),
        outputs=getattr(args, "output", ()),
        target=getattr(args, "target", None),
        namespace=getattr(args, "namespace", None),
    )
    changes = update_changes(project, None if name is None else [name], flags=flags, time_limit=args.time_limit)
    return _apply_update(project.root, changes, dry_run=args.dry_run, source="the new generation")


def _update_project(args: argparse.Namespace) -> int:
    project = _find_project()
    changes = template_update_changes(project, template=args.template, adopt=args.adopt)
    return _apply_update(project.root, changes, dry_run=args.dry_run, source="the project template")


def _apply_update(root: Path, changes: list[FileChange], *, dry_run: bool, source: str) -> int:
    if dry_run:
        for change in changes:
            if change.changed and not change.record:
                sys.stdout.writelines(_diff(change))
    else:
        apply_changes(root, changes)
    _report(changes, dry_run=dry_run, source=source)
    conflicts = sum(c.conflicts for c in changes)
    return EXIT_CONFLICT if conflicts else 0


def _bench(args: argparse.Namespace) -> int:
    if bool(args.spec) == bool(args.name):
        raise SpecError(
            "NAME and --spec cannot be combined" if args.spec else "missing NAME or --spec",
            hint="give an op's name inside a project (scaffold bench swish), or its spec file (--spec swish.toml)",
        )
    from . import bench  # imports torch, which no other command needs

    spec = load_spec(args.spec) if args.spec else bench.load_project_spec(args.name)
    options = {"numel": args.numel, "min_time": args.min_time, "threads": args.threads}
    try:
        report = bench.bench_op(
            spec,
            device=args.device,
            dtype=args.dtype,
            native=args.native,
            compile=not args.no_compile,
            progress=lambda message: print(f"scaffold: {message}", file=sys.stderr, flush=True),
            time_limit=args.time_limit,
            **{key: value for key, value in options.items() if value is not None},
        )
    except KeyboardInterrupt:
        raise bench.BenchError("interrupted; nothing was measured to the end") from None
    print(bench.format_table(report))
    return 0


def _check(args: argparse.Namespace) -> int:
    from . import check  # imports torch, which no other command needs

    spec = _check_spec(args)
    only = [c.strip() for c in args.only.split(",") if c.strip()] if args.only else None
    if args.write_tests:
        written = write_files(
            check.check_test_files(spec, args.target, args.write_tests, call=args.call, strict=args.strict),
            args.write_tests,
            force=args.force,
        )
        for file in written:
            print(f"{file.status:>11}  {file.path}")
    report = check.check_function(
        spec,
        args.target,
        call=args.call,
        strict=args.strict,
        device=args.device,
        checks=only,
        progress=lambda name: print(f"scaffold: checking {name}", file=sys.stderr, flush=True),
        time_limit=args.time_limit,
    )
    print(check.format_report(report))
    return report.exit_code()


def _check_spec(args: argparse.Namespace):
    """The spec ``scaffold check`` holds the target against: the file, or the flags (named after the target)."""
    flags = [f for f, v in (("--forward", args.forward), ("--tensor", args.tensor), ("--scalar", args.scalar),
                            ("--learnable", args.learnable), ("--size", args.size), ("--gradient", args.gradient),
                            ("--output", args.output), ("--domain", args.domain)) if v]  # fmt: skip
    if args.spec:
        if flags:
            raise SpecError(f"--spec cannot be combined with {', '.join(flags)}", hint="use the spec file or flags")
        return load_spec(args.spec)
    if args.forward is None or not (args.tensor or args.learnable):
        raise SpecError(
            "missing --spec, or --forward and --tensor",
            hint='e.g. scaffold check ops.py:Swish --forward "x * sigmoid(x)" --tensor x, or --spec swish.toml',
        )
    name = re.sub(r"\W+", "_", args.target.rpartition(":")[2].rpartition(".")[2]).lower().strip("_") or "op"
    name = name if name.isidentifier() and not name[0].isdigit() else f"op_{name}"
    return spec_from_flags(
        name,
        args.forward,
        args.tensor,
        args.scalar,
        learnable=args.learnable,
        gradients=args.gradient,
        outputs=args.output,
        sizes=args.size,
        domains=args.domain,
    )


def _diff(change: FileChange) -> list[str]:
    lines = difflib.unified_diff(
        (change.old or "").splitlines(keepends=True),
        (change.new or "").splitlines(keepends=True),
        fromfile=f"a/{change.path}" if change.old is not None else "/dev/null",
        tofile=f"b/{change.path}",
    )
    return [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines]


def _files(count: int) -> str:
    return f"{count} file{'s' if count != 1 else ''}"


def _report(changes: list[FileChange], *, dry_run: bool = False, source: str = "the new generation") -> None:
    """One line per file the user cares about; scaffold's records in one line per op."""
    for change in changes:
        if change.record:
            continue
        note = f"  ({change.note})" if change.note else ""
        if change.status == "merged":
            note = "  (your edits kept)"
        elif change.status == "conflict":
            regions = f"{change.conflicts} conflict{'s' if change.conflicts > 1 else ''}"
            note = f"  ({regions} between <<<<<<< and >>>>>>>; every line of yours is kept)"
        print(f"{change.status:>11}  {change.path}{note}")
    # One line per record folder (.scaffold/NAME/, .scaffold/project-template/), not per folder inside it.
    recorded = sorted(
        {_record_folder(c.path) for c in changes if c.record and c.changed and c.path.name != "README.md"}
    )
    for folder in recorded:
        print(f"{'recorded':>11}  {folder}/")
    conflicts = [c for c in changes if c.conflicts]
    if dry_run:
        print("(dry run: nothing was written)")
    if conflicts:
        what = "would have" if dry_run else "has" if len(conflicts) == 1 else "have"
        print(
            f"scaffold: {_files(len(conflicts))} {what} conflicts: your edits overlap "
            f"what {source} changed. Resolve them (keep the lines you want, delete the marker lines), "
            "then run the tests.",
            file=sys.stderr,
        )


def _record_folder(path: PurePosixPath) -> PurePosixPath:
    """The folder of .scaffold/ that ``path`` is recorded in: .scaffold/NAME for .scaffold/NAME/..."""
    if len(path.parts) > 2 and path.parts[0] == RECORDS.name:
        return RECORDS / path.parts[1]
    return path.parent


#: Options whose value may start with "-" (a forward of -x * y), which argparse would take for an option.
_DASHED_VALUES = ("--forward", "--doc", "--gradient", "--call")


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


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line; an unknown flag is refused as argparse refuses it (its usage, exit code 2),
    with the command's nearest flag suggested (--forwad: --forward). Abbreviations work as in argparse."""
    parser = _parser()
    args, unknown = parser.parse_known_args(_attach_dashed_values(argv))
    if unknown:
        command = _command_parser(parser, args)
        flags = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
        near = {f: did_you_mean(f.partition("=")[0], flags) for f in unknown if f.startswith("--")}
        meant = [f"{m} for {f.partition('=')[0]}" if len(near) > 1 else m for f, m in near.items() if m]
        hint = f"\n  hint: did you mean {', '.join(meant)}? (see {command.prog} --help)" if meant else ""
        command.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return args


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` chose: ``scaffold new op``'s for ``scaffold new op ...``."""
    while True:
        commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, commands[0].dest, None) if commands else None
        if chosen not in (commands[0].choices if commands else {}):
            return parser
        parser = commands[0].choices[chosen]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        warnings.simplefilter("always", ScaffoldWarning)
        warnings.showwarning = _show_warning
        try:
            return args.handler(args)
        except ScaffoldError as exc:
            print(f"scaffold: error: {exc}", file=sys.stderr)
            return EXIT_BAD_CHECK_INPUT if args.command == "check" else EXIT_ERROR


_python_showwarning = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """scaffold's own warnings as one line on stderr, like its errors; any other warning as Python shows it."""
    if issubclass(category, ScaffoldWarning):
        print(f"scaffold: warning: {message}", file=sys.stderr)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)
