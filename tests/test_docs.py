"""The README and the docs site: the generated language reference names every function the parser takes and
is up to date, the README stays short and keeps its set-up commands, and every page and link is reachable."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from scaffold.expression import FUNCTION_NAMES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference" / "functions.md"
README = ROOT / "README.md"
INSTALL = 'python -m pip install torch==2.13.0 -e ".[dev]"'


@pytest.fixture(scope="module")
def reference():
    """scripts/reference.py, the generator of docs/reference/functions.md, as a module."""
    spec = importlib.util.spec_from_file_location("reference", ROOT / "scripts" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["reference"]


def test_the_reference_names_every_function_the_parser_takes():
    text = REFERENCE.read_text(encoding="utf-8")
    missing = [name for name in sorted(FUNCTION_NAMES) if not re.search(rf"`{re.escape(name)}[`(]", text)]
    assert not missing, f"docs/reference/functions.md leaves out {missing}: run python scripts/reference.py"


def test_the_reference_is_up_to_date(reference):
    """The page is what scripts/reference.py writes today: each function's row, from the registry and from
    what scaffold makes of its example (about 8 s: every example is compiled)."""
    assert REFERENCE.read_text(encoding="utf-8") == reference.render(), "run python scripts/reference.py"


def test_the_generator_refuses_a_function_it_has_no_example_for(reference, monkeypatch):
    monkeypatch.setattr(reference, "STRUCTURAL", {k: v for k, v in reference.STRUCTURAL.items() if k != "gather"})
    with pytest.raises(SystemExit, match="no example for gather: add each to STRUCTURAL or CALLS"):
        reference.render()


def test_the_generator_refuses_a_spec_key_it_does_not_describe(reference, monkeypatch):
    keys = {**reference.KEYS, "scalars.NAME": {"type": "float, int or bool"}}
    monkeypatch.setattr(reference, "KEYS", keys)
    with pytest.raises(SystemExit, match=r"KEYS\['scalars.NAME'\] must describe exactly \['default', 'type'\]"):
        reference.render()


def test_the_readme_is_short_and_keeps_the_set_up_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    assert f"```sh\n{INSTALL}\npython -m pytest\n```" in "\n".join(lines)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert f"\n{INSTALL}\n" in ci.replace(" --quiet", "") and "\npython -m pytest\n" in ci


def test_ci_builds_the_docs_strictly_before_the_tests():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.index("ruff format --check") < ci.index("mkdocs build --strict") < ci.index("python -m pytest\n")


def _nav_pages() -> set[str]:
    return set(re.findall(r"^\s+- [^:]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M))


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == _nav_pages()


def test_every_link_of_the_readme_and_the_docs_to_a_page_resolves():
    for page in [README, *DOCS.rglob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).is_file(), f"{page.relative_to(ROOT)} links to {target}, which is missing"


def test_no_page_writes_an_if_else_the_parser_refuses():
    """The parser refuses `x if flag else -x` (its hint: Piecewise or where); no page may show it as a forward."""
    for page in [README, *DOCS.rglob("*.md")]:
        assert "if flag else" not in page.read_text(encoding="utf-8"), page.relative_to(ROOT)
