"""The last step of rendering: generated Python is formatted by ruff, pinned to one version.

Generated files are formatted (``ruff format``), then their imports sorted (``ruff check --fix --select
I,RUF022``: import order, and ``__all__`` sorted as ruff's default rules want it) before anyone sees them,
so that a user who runs ruff over their code does not turn every generated file into an "edit" that
``scaffold update`` then has to merge. Ruff runs as a subprocess, the source on its stdin and the result on
its stdout; ``--stdin-filename`` names the file for ruff's settings and messages. Each file costs two or
three ruff processes, about 15 ms on a shared 2-core machine.

Whose settings:

- Inside a project (``root`` given), the project's own: ruff runs in the project's root with the file's
  path relative to it, so it finds the project's ``pyproject.toml`` / ``ruff.toml`` as it does when the
  user runs it (line length, isort sections, exclusions).
- Standalone (``scaffold new op`` outside a project), scaffold's own fixed style: ``--isolated`` (no
  configuration file is read, wherever scaffold runs), ruff's defaults with a line length of 120, the
  module the generated test imports the op from a first-party import (it lies beside the test), and no
  other module first-party (``src = []``: what happens to be in the current folder does not matter).

The ruff version is pinned (:data:`RUFF_VERSION`, as in pyproject.toml): another version may format
differently, and the same spec must give the same bytes. Records of a project's last generation store it
(:func:`ruff_version`), so that an update after a ruff upgrade can re-format its base first.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath

from .errors import FormatError

#: The ruff release that formats generated code; pyproject.toml pins the same (``ruff==RUFF_VERSION``).
RUFF_VERSION = "0.17.6"
#: Scaffold's own style, for files generated outside a project.
LINE_LENGTH = 120
#: The fixes applied after formatting: import order, and ``__all__`` sorted as ruff's RUF022 wants it.
FIXES = ("I", "RUF022")

_INSTALL = f"install it with `python -m pip install ruff=={RUFF_VERSION}`"


def ruff_binary(where: str | None = None) -> str:
    """The path of the ruff executable that ruff's Python package installed (``where``: for messages)."""
    try:
        from ruff.__main__ import find_ruff_bin
    except ImportError:
        raise FormatError("ruff, which formats generated code, is not installed", where=where, hint=_INSTALL) from None
    try:
        return find_ruff_bin()
    except FileNotFoundError:  # ruff's RuffNotFound
        raise FormatError(
            "ruff, which formats generated code, is installed without its ruff executable",
            where=where,
            hint=f"reinstall it with `python -m pip install --force-reinstall ruff=={RUFF_VERSION}`",
        ) from None


def ruff_version() -> str:
    """The version of the ruff that formats generated code, checked against the pin."""
    return _checked_version(ruff_binary())


@functools.cache
def _checked_version(binary: str) -> str:
    try:
        result = subprocess.run([binary, "--version"], capture_output=True, text=True, encoding="utf-8", timeout=60)
    except OSError as exc:
        raise FormatError(f"cannot run ruff: {exc}", where=binary, hint=_INSTALL) from None
    version = result.stdout.strip().removeprefix("ruff ").split(" ")[0]
    if result.returncode != 0 or version != RUFF_VERSION:
        found = version or (result.stderr.strip() or "nothing").splitlines()[0]
        raise FormatError(
            f"scaffold formats generated code with ruff {RUFF_VERSION}, but this ruff is {found}",
            where=binary,
            hint=f"another version may format differently: {_INSTALL}",
        )
    return version


def format_source(
    source: str,
    path: str | PurePath,
    *,
    root: str | Path | None = None,
    modules: Mapping[str, str | PurePath] | None = None,
    fixes: Sequence[str] = FIXES,
) -> str:
    """``source``, the generated file ``path``, formatted and with its imports sorted.

    ``root`` is the project's root, whose ruff settings apply (``path`` is then relative to it); without
    it, scaffold's own style applies. ``modules`` are the modules generated with this file (import name:
    path, relative to ``root`` in a project): imports of them are sorted as they will be once the files are
    written: a first-party import standalone (the module lies beside the file); in a project, as the
    project's settings sort it once the module exists (ruff looks for a first-party module's file).
    ``fixes`` are the rules whose fixes apply after formatting (:data:`FIXES`).
    Raises :class:`FormatError` if ruff is missing, is not the pinned version or fails.
    """
    path = PurePath(path)
    binary = ruff_binary(where=str(path))
    _checked_version(binary)
    modules = {name: file for name, file in (modules or {}).items() if name in source}
    with tempfile.TemporaryDirectory(prefix="scaffold-ruff-") as shadow:
        if root is None:
            first_party = sorted({name.split(".")[0] for name in modules})
            settings = [
                "--isolated",
                "--line-length",
                str(LINE_LENGTH),
                "--config",
                "src = []",
                "--config",
                f"lint.isort.known-first-party = {json.dumps(first_party)}",
            ]
            cwd = None
        else:
            # --force-exclude: a file the project excludes from ruff is left as it is, as ruff would leave it.
            cwd = Path(root)
            settings = ["--force-exclude", *_future_modules(binary, cwd, path, modules, Path(shadow))]
        fmt = [binary, "format", "--no-cache", *settings, "--stdin-filename", str(path), "-"]
        sort = [binary, "check", "--no-cache", *settings, "--fix", "--exit-zero", "--select", ",".join(fixes)]
        sort += ["--stdin-filename", str(path), "-"]
        text = _run(fmt, source, path, root, cwd, "format")
        sorted_text = _run(sort, text, path, root, cwd, "sort the imports of")
        if sorted_text != text:  # sorting can wrap lines: the formatter has the last word
            sorted_text = _run(fmt, sorted_text, path, root, cwd, "format")
    return sorted_text


def _future_modules(
    binary: str, root: Path, path: PurePath, modules: dict[str, str | PurePath], shadow: Path
) -> list[str]:
    """Settings that make ruff see the project's generated modules that are not written yet.

    Ruff sorts an import as first-party when the module's file is in one of the project's source roots
    (``src``); a module generated now is not there yet, but will be once it is written. For each such
    module, an empty stand-in at the same place under a temporary root is added to the project's ``src``.
    """
    missing = {name: root / file for name, file in modules.items() if not (root / file).exists()}
    if not missing:
        return []
    sources = _source_roots(binary, root, path)
    added = []
    for index, source in enumerate(sources):
        for name, file in missing.items():
            relative = PurePath(*name.split(".")).with_suffix(".py")
            if Path(source).resolve() / relative == file.resolve():
                stand_in = shadow / str(index) / relative
                stand_in.parent.mkdir(parents=True, exist_ok=True)
                stand_in.touch()
                added.append(str(shadow / str(index)))
    if not added:  # once written, ruff will not find them either
        return []
    return ["--config", f"src = {json.dumps(sources + sorted(set(added)))}"]


def _source_roots(binary: str, root: Path, path: PurePath) -> list[str]:
    """The source roots (``src``) of the project's ruff settings for ``path``, absolute."""
    folder = root / path.parent
    while not folder.is_dir() and folder != root:
        folder = folder.parent
    command = [binary, "check", "--no-cache", "--force-exclude", "--show-settings", str(folder)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, encoding="utf-8", cwd=root, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = re.search(r"^linter\.src = \[\n(.*?)^\]", result.stdout, re.MULTILINE | re.DOTALL)
    if result.returncode != 0 or found is None:  # no Python file to resolve settings for, a broken config
        return []
    return [json.loads(line.strip().rstrip(",")) for line in found.group(1).splitlines() if line.strip()]


def _run(command: list[str], source: str, path: PurePath, root: str | Path | None, cwd: Path | None, what: str) -> str:
    try:
        result = subprocess.run(
            command, input=source, capture_output=True, text=True, encoding="utf-8", cwd=cwd, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FormatError(f"cannot run ruff to {what} the generated {path}: {exc}", where=command[0]) from None
    if result.returncode == 0:
        return result.stdout
    message = _ruff_message(result.stderr) or f"exit status {result.returncode}"
    if root is None:
        raise FormatError(
            f"ruff could not {what} the generated {path}: {message}",
            where=str(path),
            hint="this is a bug in scaffold: please report this, with the spec",
        )
    raise FormatError(
        f"ruff could not {what} the generated {path} with the project's ruff settings: {message}",
        where=str(Path(root) / path),
        hint="check the project's ruff settings (pyproject.toml [tool.ruff], ruff.toml): `ruff format` should "
        "run in the project; if it does, this is a bug in scaffold: please report this",
    )


def _ruff_message(stderr: str) -> str:
    """Ruff's error output on one line: its causes and its last word, without the code frames."""
    lines = [line.strip() for line in stderr.splitlines()]
    kept = [line.removeprefix("Cause: ") for line in lines if line and line != "ruff failed"]
    kept = [line for line in kept if not re.match(r"^(\d+ )?\s*\|", line)]
    return "; ".join(kept[:6])
