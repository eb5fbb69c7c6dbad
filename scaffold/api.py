"""The library entry points: one call per pipeline run, for the CLI and for other tools.

spec = load_spec("swish.toml")           # or spec_from_flags(...)
files = generate_op(spec)                # {"swish.py": ..., "test_swish.py": ..., "_scaffold_runtime.py": ...}
write_files(files, "ops/")               # atomic, refuses to clobber without force=True
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath

from .dataflow import ProgramPlan, plan_program
from .domain import InputDomain, infer_program_domains
from .errors import ScaffoldError, ScaffoldWarning, SpecError
from .expression import ParsedExpression, parse_forward
from .limits import TIME_LIMIT, run_with_time_limit
from .program import Program, build_program
from .render import TESTING_MODULE, render_op, render_runtime
from .rows import row_kernels
from .rules import ProgramDerivation, derive_program
from .spec import RUNTIME_FILE, OpSpec, other_sizes, spec_from_mapping, spec_to_mapping


@dataclass(frozen=True)
class CompiledOp:
    """Every stage's result for one op, for tools that want more than the files."""

    spec: OpSpec
    parsed: ParsedExpression
    program: Program
    derivation: ProgramDerivation
    plan: ProgramPlan
    domains: tuple[InputDomain, ...]


def compile_op(spec: OpSpec) -> CompiledOp:
    """Run the pipeline up to (not including) rendering."""
    parsed = parse_forward(spec)
    program = build_program(parsed, spec)
    _check_other_sizes(spec)
    where = f"{spec.source}: forward"
    derivation = derive_program(program, where=where)
    plan = plan_program(
        derivation, where=where, fused=spec.fuse, policy=spec.policy, custom_op=spec.target == "custom_op"
    )
    if spec.fuse and spec.target != "custom_op":
        rows = row_kernels(derivation, {t.name: t.dtype for t in spec.tensors})
        refused = isinstance(rows, str)
        plan = dataclasses.replace(plan, rows=None if refused else rows, rows_reason=rows if refused else "")
    return CompiledOp(spec, parsed, program, derivation, plan, infer_program_domains(spec, derivation))


def _check_other_sizes(spec: OpSpec) -> None:
    """A structured op with size names holds at other sizes (each one more, all distinct, as the Module's
    tests try them): a dimension that must equal a named one (a product's inner dimension) is named too."""
    if not spec.sizes:
        return
    data = spec_to_mapping(spec)
    data["sizes"] = other_sizes(dict(spec.sizes))
    resized = spec_from_mapping(data, source=spec.source)
    try:
        build_program(parse_forward(resized), resized)
    except ScaffoldError as exc:
        tried = ", ".join(f"{name} = {value}" for name, value in data["sizes"].items())
        raise SpecError(
            f"the op's shapes do not hold at other sizes ({tried}): {exc.message}",
            where=f"{spec.source}: tensors",
            hint="a dimension that must equal a named size takes its name in every shape, "
            'e.g. x = [8, "in_features"] where weight is ["out_features", "in_features"]',
        ) from None


def generate_op(
    spec: OpSpec,
    *,
    module_import: str | None = None,
    shared_device_fixture: bool = False,
    testing_module: str = TESTING_MODULE,
    time_limit: float | None = TIME_LIMIT,
    project_root: str | Path | None = None,
    paths: Mapping[str, str | PurePath] | None = None,
    in_package: bool = False,
    in_place: bool = True,
) -> dict[str, str]:
    """The op's generated files, ``{"NAME.py": ..., "test_NAME.py": ..., "_scaffold_runtime.py": ...}``;
    nothing is written. The runtime module (the machinery every op shares, the same text for every op) is
    left out ``in_package``: a project keeps one copy in its ops package, which the module imports.

    ``module_import`` is the module the generated test imports the op from (default: the op's name,
    for a test file next to the module); with ``shared_device_fixture`` the test takes its ``device``
    fixture from a conftest.py (as in a project) instead of defining its own; ``testing_module`` is the
    test library it imports (scaffold.testing, or a project's copy of it). The symbolic work runs in
    a worker process that is stopped after ``time_limit`` seconds (None: in this process, no limit).
    ``in_place=False`` leaves every temporary out of place (stage 6b skipped): the benchmark's baseline for
    what computing in place gains.

    The files are formatted by the pinned ruff (:mod:`scaffold.formatting`): with the settings of the
    project at ``project_root``, where ``paths`` maps each file's name to its path relative to the root,
    or, without a project, in scaffold's own style.
    """
    args = (spec, module_import, shared_device_fixture, testing_module, project_root, paths, in_package, in_place)
    where = f"{spec.source}: forward"
    if time_limit is None:
        files, notes = _generate(*args)
    else:
        files, notes = run_with_time_limit(_generate, args, seconds=time_limit, where=where, what="deriving the op")
    for note in notes:  # raised here, not in the worker process, so that callers see them
        warnings.warn(ScaffoldWarning(f"{where}: {note}"), stacklevel=2)
    if not in_package:  # the same text for every op: rendered once in this process
        files[RUNTIME_FILE] = render_runtime(project_root=project_root)
    return files


def _generate(
    spec: OpSpec,
    module_import: str | None,
    shared_device_fixture: bool,
    testing_module: str,
    project_root: str | Path | None,
    paths: Mapping[str, str | PurePath] | None,
    in_package: bool,
    in_place: bool,
) -> tuple[dict[str, str], tuple[str, ...]]:
    op = compile_op(spec)
    files = render_op(
        spec,
        op.derivation,
        op.plan,
        op.domains,
        module_import=module_import,
        shared_device_fixture=shared_device_fixture,
        testing_module=testing_module,
        project_root=project_root,
        paths=paths,
        in_package=in_package,
        in_place=in_place,
    )
    return files, op.derivation.warnings
