"""A plain (non-editable) wheel carries the templates, and works from where it is installed."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("*.whl")
    return built


def test_wheel_ships_the_templates(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    templates = [p for p in (ROOT / "templates").rglob("*") if p.is_file()]
    assert any(p.name == "copier.yml" for p in templates)
    for template in templates:
        assert f"scaffold/templates/{template.relative_to(ROOT / 'templates').as_posix()}" in names
    assert "scaffold/cli.py" in names


def test_installed_wheel_makes_a_project_offline(wheel, tmp_path):
    """`scaffold new project` and `new op` from the installed package, not from this checkout."""
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = [sys.executable, "-c", "import sys, scaffold.cli; print(scaffold.cli.__file__, file=sys.stderr); "
           "sys.exit(scaffold.cli.main(sys.argv[1:]))"]  # fmt: skip
    made = subprocess.run(
        [*run, "new", "project", "lib", "--defaults"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    assert str(site) in made.stderr, "the checkout's scaffold ran, not the installed one"
    added = subprocess.run(
        [*run, "new", "op", "cube", "--forward", "x**3", "--tensor", "x"],
        cwd=tmp_path / "lib" / "tests",
        env=env,
        capture_output=True,
        text=True,
    )
    assert added.returncode == 0, added.stderr
    assert (tmp_path / "lib/src/lib/ops/cube.py").is_file()


def test_ruff_is_pinned_to_the_version_that_formats_generated_code():
    """Generated code is formatted by one ruff release: pyproject.toml pins the one scaffold checks for."""
    from scaffold.formatting import RUFF_VERSION, ruff_version

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"ruff=={RUFF_VERSION}",' in text.split("[project.optional-dependencies]")[0]
    assert ruff_version() == RUFF_VERSION
