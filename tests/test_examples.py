"""examples/ (issue 37): one spec per op, the reference documents' ops and a few common ones. Each spec loads,
has a doc line and a line in examples/README.md's table, generates, and passes its own generated tests as
generated, and is what it says it is (tests/examples_against_torch.py, run beside them). A new file in examples/
is picked up by every test here."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from scaffold import generate_op, load_spec, write_files

from .conftest import GeneratedRun, background_run

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = sorted(path.stem for path in EXAMPLES.glob("*.toml"))
AGAINST_TORCH = Path(__file__).with_name("examples_against_torch.py")
#: The examples whose generated tests run their torch.compile checks too (the others' leave them out): a
#: structured op with a product, a mask and a sized Module, and an elementwise op with a custom gradient.
COMPILED = ("linear_relu", "clip_gradient")
#: A line of examples/README.md's table: | `FILE` | what it is | `COMMAND` |
TABLE_ROW = re.compile(r"^\| `(?P<file>[^`]+)` \| (?P<what>[^|]+) \| `(?P<command>[^`]+)` \|$")


def _table() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in (EXAMPLES / "README.md").read_text(encoding="utf-8").splitlines():
        match = TABLE_ROW.match(line)
        if match:
            assert match["file"] not in rows, f"examples/README.md lists {match['file']} twice"
            rows[match["file"]] = (match["what"].strip(), match["command"])
    return rows


def test_the_folder_holds_the_reference_ops_and_the_common_ones():
    assert len(NAMES) >= 17, NAMES
    assert set(COMPILED) <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_each_example_has_a_doc_line_and_its_name(name):
    spec = load_spec(EXAMPLES / f"{name}.toml")
    assert spec.name == name, f"examples/{name}.toml names its op {spec.name!r}: name it after its file"
    assert spec.doc.strip(), f"examples/{name}.toml has no doc line: say what the op is and where it comes from"


def test_the_readme_table_lists_every_example_with_its_command():
    rows = _table()
    assert sorted(rows) == [f"{name}.toml" for name in NAMES], "examples/README.md's table and examples/ differ"
    for file, (what, command) in rows.items():
        assert what, f"examples/README.md: {file} says nothing of what it is"
        assert command == f"scaffold new op --spec examples/{file} -o ops/", (file, command)


def test_each_example_is_checked_against_what_it_says():
    checked = set(re.findall(r"^import (\w+)$", AGAINST_TORCH.read_text(encoding="utf-8"), re.MULTILINE))
    missing = sorted(set(NAMES) - checked)
    assert not missing, f"tests/examples_against_torch.py does not check {missing}: compare each with torch's op"


def _generated(folder: Path) -> GeneratedRun:
    # Every example in one folder, their tests in one run: one interpreter and one collection for all.
    for name in NAMES:
        write_files(generate_op(load_spec(EXAMPLES / f"{name}.toml")), folder)
    # and, beside them, the check that each is what it says it is (torch's own op, the documents' numbers)
    shutil.copyfile(AGAINST_TORCH, folder / "test_examples_against_torch.py")
    compiled = " or ".join(f"test_{name}.py" for name in COMPILED)
    return GeneratedRun(folder, ("-k", f"not compile or {compiled}"))


@background_run(_generated)
def test_each_example_passes_its_generated_tests(background_results):
    result = background_results
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout, result.stdout[-2000:]
