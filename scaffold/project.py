"""Projects: where an op's files live in a library of ops, and what scaffold generated there last.

A project is a directory whose ``pyproject.toml`` has a ``[tool.scaffold]`` table (the project template
writes one)::

    [tool.scaffold]
    package = "myops"      # the import package; under src/ unless `src = "."` says otherwise

For an op NAME it holds:

    specs/NAME.toml              the spec: the op's source of truth; edit it, then `scaffold update`
    src/<package>/ops/NAME.py    the op, yours to edit
    tests/test_NAME.py           its tests, yours to edit
    src/<package>/__init__.py    re-exports every op, between two marker lines scaffold rewrites
    src/<package>/ops/_scaffold_runtime.py
                                 the machinery every op imports, once (merged like the op's files)
    .scaffold/NAME/              the record of the last generation: what it wrote, byte for byte, the
                                 spec it used, scaffold's version and the version of the ruff that
                                 formatted it; the base of the next three-way update

and, for the project as a whole (made by ``scaffold new project``):

    .copier-answers.yml          the answers the project template was rendered with (copier writes it)
    .scaffold/project-template/  the template's last render, byte for byte, with scaffold's version: the
                                 base of the next ``scaffold update project``

This module knows the layout and reads and writes records; it never decides what to generate.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ._version import __version__
from .errors import SpecError, WriteError
from .formatting import ruff_version
from .spec import RUNTIME_FILE, STANDARD_MODULES, TEST_RUNTIME_PACKAGES, OpSpec, check_identifier, load_spec
from .tomlwriter import dumps
from .write import write_files

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

RECORDS = PurePosixPath(".scaffold")
RECORD_FILE = "record.toml"
RECORD_SPEC = "spec.toml"
#: Stored copies of generated files get this suffix, so that no tool takes them for code or tests.
BASE_SUFFIX = ".base"

#: The project's copy of scaffold's test library (scaffold/testing.py), which the generated tests import,
#: and the copy of it that scaffold wrote last, the base of the next merge.
TESTING_PATH = PurePosixPath("tests") / "scaffold_testing.py"
TESTING_MODULE = TESTING_PATH.stem
TESTING_BASE = RECORDS / f"{TESTING_PATH.name}{BASE_SUFFIX}"
#: The copy of the ops' runtime (in the ops package) that scaffold wrote last, the base of the next merge.
RUNTIME_BASE = RECORDS / f"{RUNTIME_FILE}{BASE_SUFFIX}"

EXPORTS_BEGIN = "# --- scaffold exports: begin ---"
EXPORTS_END = "# --- scaffold exports: end ---"
_EXPORTS_COMMENT = (
    "# Generated ops are exported here by `scaffold new op` and `scaffold update`; keep your own code outside\n"
    "# the marker lines.\n"
)

#: The project template's last render: written by `scaffold new project`, the base of `scaffold update project`.
#: Not a Python identifier, so that no op's record can have its name.
TEMPLATE_RECORD = RECORDS / "project-template"
#: The answers the project template was rendered with, as copier writes them (copier.yml's _answers_file).
ANSWERS_FILE = PurePosixPath(".copier-answers.yml")

RECORDS_README = """\
# .scaffold

What `scaffold` generated last for each op of this project, byte for byte, with the spec it used,
scaffold's version and the version of the ruff that formatted it (`NAME/record.toml`). `scaffold update`
merges three ways: this last generation (the base), your files now, and the new generation; that is how it
keeps your edits.

`project-template/` is the same for the project template: its last render, with the answers in
`.copier-answers.yml`, the base of `scaffold update project`.

Commit this folder with the code. Do not edit it: scaffold rewrites it on every `new op` and `update`.
"""


@dataclass(frozen=True)
class Project:
    """A project's root and package; every path it returns is relative to ``root``, in POSIX form."""

    root: Path
    package: str
    src: str = "src"

    @property
    def package_dir(self) -> PurePosixPath:
        return PurePosixPath(self.src) / self.package

    @property
    def init_path(self) -> PurePosixPath:
        return self.package_dir / "__init__.py"

    @property
    def ops_init_path(self) -> PurePosixPath:
        return self.package_dir / "ops" / "__init__.py"

    @property
    def runtime_path(self) -> PurePosixPath:
        """The runtime every op imports (scaffold's _scaffold_runtime.py), beside the ops."""
        return self.package_dir / "ops" / RUNTIME_FILE

    def spec_path(self, name: str) -> PurePosixPath:
        return PurePosixPath("specs") / f"{name}.toml"

    def module_path(self, name: str) -> PurePosixPath:
        return self.package_dir / "ops" / f"{name}.py"

    def test_path(self, name: str) -> PurePosixPath:
        return PurePosixPath("tests") / f"test_{name}.py"

    def module_import(self, name: str) -> str:
        return f"{self.package}.ops.{name}"

    def record_dir(self, name: str) -> PurePosixPath:
        return RECORDS / name

    def read(self, path: PurePosixPath) -> str | None:
        """The text of a project file, or None when there is none."""
        full = self.root / path
        try:
            return full.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise WriteError(f"cannot read {path}: {exc}", where=str(self.root)) from None

    def has_device_fixture(self) -> bool:
        """Whether tests/conftest.py defines the ``device`` fixture generated tests can share."""
        conftest = self.read(PurePosixPath("tests") / "conftest.py") or ""
        return re.search(r"^def device\(", conftest, re.MULTILINE) is not None

    def load_op_spec(self, name: str, *, missing_hint: str) -> OpSpec:
        """The spec of op ``name`` (specs/NAME.toml), which must name the op as its file does."""
        path = self.spec_path(name)
        if not (self.root / path).is_file():
            raise SpecError(f"{path} does not exist", where=str(self.root), hint=missing_hint)
        spec = load_spec(self.root / path, source=str(path))
        if spec.name != name:
            raise SpecError(
                f"the spec is named {spec.name!r} but its file is {path.name}",
                where=f"{path}: name",
                hint=f"rename the file to {spec.name}.toml or set name = {name!r}",
            )
        return spec

    def spec_names(self) -> list[str]:
        """The ops that have a spec, sorted."""
        specs = self.root / "specs"
        return sorted(p.stem for p in specs.glob("*.toml")) if specs.is_dir() else []

    def recorded_names(self) -> list[str]:
        """The ops scaffold has generated here, sorted."""
        records = self.root / RECORDS
        if not records.is_dir():
            return []
        return sorted(p.parent.name for p in records.glob(f"*/{RECORD_FILE}") if p.parent.name.isidentifier())


def find_project(start: str | Path = ".") -> Project | None:
    """The project containing ``start``: the nearest directory upwards with a ``[tool.scaffold]`` table."""
    here = Path(start).resolve()
    for directory in (here, *here.parents):
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file():
            project = _read_pyproject(pyproject)
            if project is not None:
                return project
    return None


def _read_pyproject(path: Path) -> Project | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "tool.scaffold" not in text and "[tool]" not in text:
        return None
    try:
        table = tomllib.loads(text).get("tool", {}).get("scaffold")
    except tomllib.TOMLDecodeError as exc:
        if "tool.scaffold" not in text:
            return None
        raise SpecError(f"invalid TOML: {exc}", where=str(path)) from None
    if table is None:
        return None
    where = f"{path}: [tool.scaffold]"
    if not isinstance(table, dict):
        raise SpecError("tool.scaffold must be a table", where=where, hint='write [tool.scaffold] package = "myops"')
    unknown = sorted(set(table) - {"package", "src"})
    if unknown:
        raise SpecError(f"unknown key {unknown[0]!r}", where=where, hint="the keys are package and src")
    if "package" not in table:
        raise SpecError("the table needs the project's package", where=where, hint='add package = "myops"')
    package = check_identifier(table["package"], what="package", where=f"{where}.package")
    src = table.get("src", "src")
    if not isinstance(src, str) or PurePosixPath(src).is_absolute() or ".." in PurePosixPath(src).parts:
        raise SpecError(f"src must be a folder inside the project, got {src!r}", where=f"{where}.src")
    project = Project(root=path.parent, package=package, src=src)
    if not (project.root / project.init_path).is_file():
        raise SpecError(
            f"the package's {project.init_path} is missing",
            where=where,
            hint="create it, or set package (and src) to where the package is",
        )
    return project


# --- records ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """What scaffold generated last for one op: ``files`` maps project paths to their generated text."""

    op: str
    version: str
    spec: str
    files: dict[PurePosixPath, str]
    #: The ruff that formatted ``files``; None in records from before scaffold formatted its output.
    ruff: str | None = None


def read_record(project: Project, name: str) -> Record | None:
    folder = project.record_dir(name)
    text = project.read(folder / RECORD_FILE)
    if text is None:
        return None
    where = str(folder / RECORD_FILE)
    try:
        data = tomllib.loads(text)
        version = data["scaffold"]
        ruff = data.get("ruff")
        if ruff is not None and not isinstance(ruff, str):
            raise TypeError(f"ruff must be a version string, not {ruff!r}")
        stored = {PurePosixPath(path): folder / base for path, base in data["files"].items()}
        spec_text = project.read(folder / data["spec"])
    except (tomllib.TOMLDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise WriteError(
            f"the record of the last generation is damaged ({exc})",
            where=where,
            hint=f"restore it from version control, or delete {folder} to merge without a base",
        ) from None
    files = {}
    for path, base in stored.items():
        base_text = project.read(base)
        if base_text is None:
            raise WriteError(
                f"{base} is missing",
                where=where,
                hint=f"restore it from version control, or delete {folder} to merge without a base",
            )
        files[path] = base_text
    return Record(op=name, version=version, spec=spec_text or "", files=files, ruff=ruff)


def record_files(project: Project, record: Record) -> dict[PurePosixPath, str]:
    """The files that store ``record``: ``{project path: text}``."""
    folder = project.record_dir(record.op)
    document = {"op": record.op, "scaffold": record.version}
    if record.ruff is not None:
        document["ruff"] = record.ruff
    document["spec"] = RECORD_SPEC
    document["files"] = {str(path): f"{path.name}{BASE_SUFFIX}" for path in record.files}
    manifest = dumps(
        document,
        comments=[
            "What scaffold generated last for this op: the base of the next `scaffold update`.",
            "Written by scaffold; commit it with the code, do not edit it.",
        ],
    )
    out = {folder / RECORD_FILE: manifest, folder / RECORD_SPEC: record.spec}
    out.update({folder / f"{path.name}{BASE_SUFFIX}": text for path, text in record.files.items()})
    out[RECORDS / "README.md"] = RECORDS_README
    return out


def testing_library() -> str:
    """The text of the project's copy of scaffold's test library."""
    source = (Path(__file__).parent / "testing.py").read_text(encoding="utf-8")
    header = (
        f"# Copied by scaffold {__version__} from scaffold/testing.py for the generated tests of this project.\n"
        "# `scaffold update` brings it up to date, keeping your edits.\n"
    )
    return header + source


def new_record(name: str, spec_text: str, files: dict[PurePosixPath, str]) -> Record:
    """The record of files generated now: formatted by today's ruff."""
    return Record(op=name, version=__version__, spec=spec_text, files=dict(files), ruff=ruff_version())


# --- the package's exports -------------------------------------------------------------------------


def exports_block(names: list[str], camel: dict[str, str]) -> str:
    """The lines between the export markers, for the ops ``names``."""
    imports = [f"from .ops.{n} import {camel[n]}, {camel[n]}Function, {n}" for n in sorted(names)]
    exported = sorted(name for n in names for name in (camel[n], f"{camel[n]}Function", n))
    if not exported:
        return "__all__: list[str] = []\n"
    listed = ", ".join(f'"{e}"' for e in exported)
    all_line = f"__all__ = [{listed}]"
    if len(all_line) > 100:
        all_line = "__all__ = [\n" + "".join(f'    "{e}",\n' for e in exported) + "]"
    return "\n".join(imports) + "\n\n" + all_line + "\n"


def with_exports(text: str, block: str, *, where: str) -> str:
    """``text`` (a package ``__init__.py``) with ``block`` between the export markers.

    Everything outside the markers is kept as it is; without markers, they are appended at the end.
    """
    lines = text.splitlines(keepends=True)
    starts, ends = _export_markers(lines)
    if not starts and not ends:
        separator = "" if not text or text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n"
        return f"{text}{separator}{_EXPORTS_COMMENT}{EXPORTS_BEGIN}\n{block}{EXPORTS_END}\n"
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise SpecError(
            "the export markers are broken: scaffold needs exactly one begin line before one end line",
            where=where,
            hint=f"keep one {EXPORTS_BEGIN!r} and one {EXPORTS_END!r} line, or remove both",
        )
    start, end = starts[0], ends[0]
    return "".join(lines[: start + 1]) + block + "".join(lines[end:])


def exports_of(text: str) -> str | None:
    """The lines between the export markers of ``text``; None without one begin line before one end line."""
    lines = text.splitlines(keepends=True)
    starts, ends = _export_markers(lines)
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        return None
    return "".join(lines[starts[0] + 1 : ends[0]])


def _export_markers(lines: list[str]) -> tuple[list[int], list[int]]:
    starts = [i for i, line in enumerate(lines) if line.strip() == EXPORTS_BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == EXPORTS_END]
    return starts, ends


# --- new projects and their template ----------------------------------------------------------------


def project_template() -> Path:
    """The copier project template shipped with scaffold."""
    from .render import templates_dir

    return templates_dir() / "project"


def new_project(
    dest: str | Path,
    *,
    data: dict[str, str] | None = None,
    defaults: bool = False,
    interactive: bool = True,
    template: str | Path | None = None,
) -> Path:
    """Create a project at ``dest`` from the copier project template, offline; return its root.

    ``data`` answers questions (``{"project_name": "myops"}``; the project is named after ``dest`` unless it
    says otherwise, and its package after the project: ``foo-bar`` gives ``foo_bar``); ``defaults`` takes the
    default answer to the rest, otherwise they are asked (which needs a terminal: ``interactive``). ``dest``
    must be new or empty, so nothing of the user's is overwritten. ``template`` is a copier template folder to
    use instead of the one shipped with scaffold (a modified copy of it).

    The render is recorded in ``.scaffold/project-template/``: the base of ``scaffold update project``.
    """
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise WriteError(
            "the folder already exists and is not empty; nothing was written",
            where=str(dest),
            hint="choose a new folder; to update a project from a newer template, run `scaffold update project` in it "
            "(`copier update` if copier copied it from a git-tracked template)",
        )
    if not defaults and not interactive:
        raise SpecError(
            "there is no terminal to ask the template's questions on",
            where=str(dest),
            hint="pass --defaults (and --data key=value for the answers you want), e.g. --data project_name=myops",
        )
    import copier  # imported here: it is slow to import and only the project commands need it

    existed = dest.exists()
    given = set(data or {})
    try:
        copier.run_copy(
            str(template or project_template()), str(dest), data=data or {}, defaults=defaults, unsafe=False, quiet=True
        )
        _check_package(dest, named_after_folder=not {"project_name", "package_name"} & given)
        # dest was empty: everything in it is the render.
        record = template_record_files(TemplateRecord(__version__, rendered_files(dest)))
        write_files({str(path): text for path, text in record.items()}, dest)
    except (copier.errors.CopierError, ValueError) as exc:
        _undo(dest, existed)
        message = _first_line(exc)
        hint = None
        refused = {name for name in ("project_name", "package_name") if f"'{name}'" in message}
        if "project_name" not in given and refused - given:  # a name that came from the folder's
            hint = (
                f"the project is named after its folder, {dest.resolve().name!r}, and its package after the "
                "project: choose them with --data project_name=NAME (and --data package_name=NAME)"
            )
        raise SpecError(f"the template refused the answers: {message}", where=str(dest), hint=hint) from None
    except KeyboardInterrupt:
        _undo(dest, existed)
        raise SpecError("interrupted; nothing was written", where=str(dest)) from None
    except (WriteError, SpecError):
        _undo(dest, existed)
        raise
    return dest


def _check_package(dest: Path, *, named_after_folder: bool) -> None:
    """Refuse a package named like a module the project's tests import: src/ is on their sys.path, where the
    package would shadow it (a project in the folder json has the package json, which copier accepts)."""
    import yaml  # copier's dependency

    path = dest / ANSWERS_FILE
    answers = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    package = answers.get("package_name") if isinstance(answers, dict) else None
    if package not in STANDARD_MODULES and package not in TEST_RUNTIME_PACKAGES:
        return
    module = "Python's standard module" if package in STANDARD_MODULES else "the package"
    named = f"the project is named after its folder, {dest.resolve().name!r}, and its package after it: "
    raise SpecError(
        f"the package name {package!r} is also the name of {module} {package}, which the project's tests import: "
        "with src/ on their path, the package would shadow it",
        where=str(dest),
        hint=f"{named if named_after_folder else ''}choose another with --data package_name=NAME",
    )


def _undo(dest: Path, existed: bool) -> None:
    """Remove what a failed copy wrote into ``dest``, which was empty or did not exist."""
    if not dest.is_dir():
        return
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    if not existed:
        dest.rmdir()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def rendered_files(folder: Path) -> dict[PurePosixPath, str]:
    """Every file under ``folder`` (a render of the template), ``{path relative to folder: text}``, sorted."""
    files = {}
    for full in sorted(folder.rglob("*")):
        if not full.is_file():
            continue
        path = PurePosixPath(full.relative_to(folder).as_posix())
        try:
            files[path] = full.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise WriteError(
                "the project template renders a file that is not UTF-8 text, which scaffold cannot merge",
                where=str(path),
            ) from None
    return files


def render_template(answers: dict[str, object], *, template: str | Path | None = None) -> dict[PurePosixPath, str]:
    """The project template (default: the one shipped with scaffold) rendered with ``answers`` in a temporary
    folder, and the default answer to every question they do not answer: ``{project path: text}``."""
    import copier

    with tempfile.TemporaryDirectory(prefix="scaffold-template-") as tmp:
        dest = Path(tmp) / "render"
        try:
            copier.run_copy(
                str(template or project_template()), str(dest), data=answers, defaults=True, unsafe=False, quiet=True
            )
        except (copier.errors.CopierError, ValueError) as exc:
            raise SpecError(
                f"the project template refuses the recorded answers: {_first_line(exc)}",
                where=str(ANSWERS_FILE),
                hint="fix the answer it names in .copier-answers.yml, then update again",
            ) from None
        return rendered_files(dest)


def read_answers(project: Project) -> dict[str, object]:
    """The answers of ``.copier-answers.yml``, copier's own keys (``_src_path``, ``_commit``) included."""
    text = project.read(ANSWERS_FILE)
    if text is None:
        raise SpecError(
            f"{ANSWERS_FILE} is missing: the answers the project template was rendered with are unknown",
            where=str(project.root),
            hint="`scaffold update project` updates projects made by `scaffold new project`; restore the file from "
            "version control if it was deleted",
        )
    import yaml  # copier's dependency

    try:
        answers = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML: {_first_line(exc)}", where=str(project.root / ANSWERS_FILE)) from None
    if not isinstance(answers, dict) or not all(isinstance(key, str) for key in answers):
        raise SpecError("the answers must be a mapping of names to values", where=str(project.root / ANSWERS_FILE))
    return answers


@dataclass(frozen=True)
class TemplateRecord:
    """The project template's last render, ``files`` (``{project path: text}``), and the scaffold that made it."""

    version: str
    files: dict[PurePosixPath, str]


def read_template_record(project: Project) -> TemplateRecord | None:
    """The recorded render of the project template; None when there is no record."""
    where = str(TEMPLATE_RECORD / RECORD_FILE)
    text = project.read(TEMPLATE_RECORD / RECORD_FILE)
    if text is None:
        return None
    hint = (
        f"restore {TEMPLATE_RECORD} from version control, or re-create it with `scaffold update project --adopt` "
        "(which takes the current template's render as the base)"
    )
    try:
        data = tomllib.loads(text)
        version, listed = data["scaffold"], data["files"]
        if not isinstance(version, str) or not isinstance(listed, list):
            raise TypeError("scaffold must be a string and files a list")
        paths = [_safe_path(path) for path in listed]
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise WriteError(
            f"the record of the template's last render is damaged ({exc})", where=where, hint=hint
        ) from None
    files = {}
    for path in paths:
        base = project.read(_template_base(path))
        if base is None:
            raise WriteError(f"{_template_base(path)} is missing", where=where, hint=hint)
        files[path] = base
    return TemplateRecord(version=version, files=files)


def template_record_files(record: TemplateRecord) -> dict[PurePosixPath, str]:
    """The files that store ``record``: ``{project path: text}``; each rendered file as PATH.base."""
    manifest = dumps(
        {"scaffold": record.version, "files": [str(path) for path in record.files]},
        comments=[
            "The project template's last render (each file as PATH.base here), with the answers in",
            ".copier-answers.yml: the base of the next `scaffold update project`.",
            "Written by scaffold; commit it with the code, do not edit it.",
        ],
    )
    out = {TEMPLATE_RECORD / RECORD_FILE: manifest}
    out.update({_template_base(path): text for path, text in record.files.items()})
    out[RECORDS / "README.md"] = RECORDS_README
    return out


def _template_base(path: PurePosixPath) -> PurePosixPath:
    return TEMPLATE_RECORD / f"{path}{BASE_SUFFIX}"


def _safe_path(text: object) -> PurePosixPath:
    """A recorded path, which must stay inside the project and outside .scaffold/."""
    if not isinstance(text, str) or not text or "\\" in text:
        raise ValueError(f"{text!r} is not a relative path")
    path = PurePosixPath(text)
    if path.is_absolute() or any(part in ("", ".", "..") for part in text.split("/")) or path.parts[0] == RECORDS.name:
        raise ValueError(f"{text!r} is not a path inside the project")
    return path
