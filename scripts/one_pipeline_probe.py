"""Generate elementwise ops through the structured path and run their generated tests: issue 33's probe.

    python scripts/one_pipeline_probe.py                        # the catalogue and the realistic corpus
    python scripts/one_pipeline_probe.py --groups catalogue --ops swish,bce
    python scripts/one_pipeline_probe.py --keep /tmp/probe       # keep the generated files there

Today api.compile_op sends a forward without reductions or products down the elementwise path
(derivation -> plan -> templates/op.py.j2) and the others down the structured one (rules -> dataflow ->
templates/program_op.py.j2). One pipeline means the second carries every op. This script measures how
far it is from that: in this process it makes every program structured (``Program.structured`` true, and
``structural.has_structural`` true, so that program.build_program lifts each output into a node), generates
the ops, and runs their generated CPU tests (``-k "not cuda"``) in a pytest process of their own. The exit
status is 1 when any op fails to generate or any test fails.

It found, on 2026-11-27, four bugs of structured ops as users write them (a flat tensor's None gradient, a
share added before summing, 0/0 in a hoisted power, a cancelling reference); CI does not run it (minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from scaffold import generate_op, program, spec_from_mapping, structural, write_files  # noqa: E402
from scaffold.errors import ScaffoldError  # noqa: E402
from tests.catalogue import OPS  # noqa: E402
from tests.realistic import FORMULAS, FOUND  # noqa: E402

GROUPS = {"catalogue": [op.mapping() for op in OPS], "realistic": [*FORMULAS, *FOUND]}


def add_selection(parser: argparse.ArgumentParser) -> None:
    """The options that choose the ops: --groups and --ops (scripts/keeping_inventory.py takes them too)."""
    parser.add_argument("--groups", default="catalogue,realistic", help="comma-separated: catalogue, realistic")
    parser.add_argument("--ops", default="", help="comma-separated op names (default: every op of the groups)")


def selected(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, list[dict]]:
    """The spec mappings of the ops that --groups and --ops choose, by group (an unknown group: an error)."""
    groups = [g for g in args.groups.split(",") if g]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
    wanted = {n for n in args.ops.split(",") if n}
    return {g: [m for m in GROUPS[g] if not wanted or m["name"] in wanted] for g in groups}


@contextlib.contextmanager
def structured_path() -> Iterator[None]:
    """Inside it every program is structured, and build_program lifts each output into a node."""
    saved = program.Program.structured, structural.has_structural
    program.Program.structured = property(lambda self: True)
    structural.has_structural = lambda expr: True
    try:
        yield
    finally:
        program.Program.structured, structural.has_structural = saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_selection(parser)
    parser.add_argument("--keep", type=Path, help="generate into this folder and keep it")
    args = parser.parse_args(argv)
    chosen = selected(parser, args)
    with structured_path(), tempfile.TemporaryDirectory() as temporary:
        folder = args.keep or Path(temporary)
        status = 0
        for group, mappings in chosen.items():
            status |= _probe(group, mappings, folder / group)
    return status


def _probe(group: str, mappings: list[dict], folder: Path) -> int:
    """Generate ``mappings`` into ``folder`` and run their generated tests; 1 where anything failed."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    refused = []
    for mapping in mappings:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                spec = spec_from_mapping(mapping, source=f"{mapping['name']}.toml")
                write_files(generate_op(spec, time_limit=None), folder, force=True)
        except ScaffoldError as exc:
            refused.append(f"{mapping['name']}: {exc.message}")
    print(f"{group}: {len(mappings) - len(refused)} of {len(mappings)} ops generated", flush=True)
    for line in refused:
        print(f"  refused {line}")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not cuda", str(folder)]
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    lines = result.stdout.strip().splitlines()
    for line in [line for line in lines if line.startswith("FAILED")] + lines[-1:]:
        print(f"  {line}")
    return int(bool(refused) or result.returncode != 0)


if __name__ == "__main__":
    sys.exit(main())
