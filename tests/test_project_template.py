"""The copier project template (templates/project): what it asks, what it writes, and that the result works.

Everything runs without ``--trust`` (``unsafe=False``): the template has no tasks, migrations or extensions.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import copier
import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "project"

LAYOUT = [
    ".copier-answers.yml",
    ".gitignore",
    ".github/workflows/tests.yml",
    "LICENSE",
    "README.md",
    "pyproject.toml",
    "specs/README.md",
    "src/{package}/__init__.py",
    "src/{package}/ops/__init__.py",
    "tests/conftest.py",
]

EXPORT_MARKERS = "# --- scaffold exports: begin ---\n__all__: list[str] = []\n# --- scaffold exports: end ---\n"

HAND_WRITTEN_TEST = """
import torch

import demo


def test_ones_sum_on_each_device(device):
    assert torch.ones(2, device=device).sum().item() == 2


def test_package_imports_from_src():
    assert demo.__version__ == "0.1.0" and demo.__all__ == []
"""

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def render(dest: Path, **data) -> Path:
    """Render the template into ``dest`` with the defaults for every question not in ``data``."""
    copier.run_copy(str(TEMPLATE), dest, data=data, defaults=True, unsafe=False, quiet=True)
    return dest


def answers(project: Path) -> dict:
    return yaml.safe_load((project / ".copier-answers.yml").read_text())


def run(args: list[str], cwd: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture
def git_env(monkeypatch) -> None:
    """Let git run without any user configuration: a fixed identity, no global or system config.

    Set on os.environ (for the test's duration), since copier runs git in this process during ``run_update``.
    """
    settings = {
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
    }
    for key, value in settings.items():
        monkeypatch.setenv(key, value)


def git(cwd: Path, *args: str) -> str:
    return run(["git", *args], cwd=cwd).stdout


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


# --- copying ---------------------------------------------------------------------------------------------


def test_defaults_give_the_layout_and_record_the_answers(tmp_path):
    project = render(tmp_path / "foo-bar")
    for path in LAYOUT:
        assert (project / path.format(package="foo_bar")).is_file(), f"{path} was not rendered"
    recorded = answers(project)
    expected = {
        "project_name": "foo-bar",  # the folder's name, and the package that made an identifier
        "package_name": "foo_bar",
        "license": "MIT",
        "python_min": "3.10",
        "torch_min": "2.9",
        "author_name": "Your Name",
        "author_email": "you@example.com",
    }
    assert {key: recorded.get(key) for key in expected} == expected
    assert recorded["_src_path"] == str(TEMPLATE)
    header = (project / ".copier-answers.yml").read_text().splitlines()[0]
    assert header == "# Changes here will be overwritten by Copier; NEVER EDIT MANUALLY"
    assert not any(p.suffix == ".jinja" for p in project.rglob("*")), "a .jinja suffix survived rendering"
    assert f"Copyright (c) {recorded['copyright_year']} Your Name" in (project / "LICENSE").read_text()


def test_pyproject_package_and_conftest(tmp_path):
    project = render(tmp_path / "p", project_name="demo")
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "demo" and pyproject["project"]["version"] == "0.1.0"
    assert pyproject["project"]["requires-python"] == ">=3.10"
    assert pyproject["project"]["dependencies"] == ["torch>=2.9"]
    # no triton: a CUDA build of torch pins its own; without one, fused ops' kernel tests skip, saying why
    assert pyproject["project"]["optional-dependencies"]["test"] == ["pytest>=7"]
    assert pyproject["tool"]["scaffold"] == {"package": "demo"}
    assert pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["src/demo"]
    assert pyproject["tool"]["pytest"]["ini_options"]["pythonpath"] == ["src"]
    text = (project / "pyproject.toml").read_text()
    assert "[tool.scaffold]\n# Where `scaffold new op` and `scaffold update` put generated ops:" in text
    init = (project / "src" / "demo" / "__init__.py").read_text()
    assert EXPORT_MARKERS in init, "the export markers scaffold rewrites between are missing or changed"
    assert "from __future__ import annotations" in init and '__version__ = "0.1.0"' in init
    conftest = (project / "tests" / "conftest.py").read_text()
    assert "def device(" in conftest and "torch.cuda.is_available()" in conftest
    # before any op imports Triton: its interpreter runs fused ops' kernels on the CPU
    assert 'os.environ.setdefault("TRITON_INTERPRET", "1")' in conftest
    ignored = [line.strip() for line in (project / ".gitignore").read_text().splitlines()]
    assert not [p for p in ignored if p.startswith(".scaffold")], ".scaffold/ must be committed, not ignored"
    workflow = yaml.safe_load((project / ".github" / "workflows" / "tests.yml").read_text())
    job = workflow["jobs"]["test"]
    assert job["strategy"]["matrix"]["python-version"] == ["3.10", "3.12"]
    assert job["steps"][1]["with"]["python-version"] == "${{ matrix.python-version }}"


@pytest.mark.parametrize("license_", ["MIT", "Apache-2.0", "BSD-3-Clause", "Proprietary"])
def test_every_license_gives_valid_pyproject(tmp_path, license_):
    project = render(tmp_path / "p", license=license_, python_min="3.9", description='Ops for "fast" \\ maths')
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["description"] == 'Ops for "fast" \\ maths'
    assert pyproject["project"]["requires-python"] == ">=3.9"
    if license_ == "Proprietary":
        assert not (project / "LICENSE").exists(), "Proprietary must not write a LICENSE"
        assert "copyright_year" not in answers(project)
    else:
        assert pyproject["project"]["license"] == license_
        assert "Your Name" in (project / "LICENSE").read_text()
    compile((project / "src" / "p" / "__init__.py").read_text(), "__init__.py", "exec")


def test_package_name_is_derived_from_the_project_name(tmp_path):
    project = render(tmp_path / "p", project_name="My-Ops.Lib")
    assert answers(project)["package_name"] == "my_ops_lib"
    assert (project / "src" / "my_ops_lib" / "__init__.py").is_file()
    # Without a project name, the folder's: "." is the folder's own name, not ".".
    folder = tmp_path / "Other.Ops"
    folder.mkdir()
    cwd = os.getcwd()
    try:
        os.chdir(folder)
        render(Path("."))
    finally:
        os.chdir(cwd)
    assert (answers(folder)["project_name"], answers(folder)["package_name"]) == ("Other.Ops", "other_ops")


@pytest.mark.parametrize(
    "data",
    [
        {"package_name": "1abc"},
        {"package_name": "My-Pkg"},
        {"package_name": "torch"},
        {"package_name": "class"},
        {"project_name": "1ops"},
        {"project_name": ""},
        {"torch_min": "2.0"},
        {"torch_min": "2.2"},
        {"torch_min": "2.8"},
        {"torch_min": "1.13"},
        {"python_min": "3.8"},
        {"license": "GPL-3.0"},
    ],
)
def test_bad_answers_are_refused(tmp_path, data):
    with pytest.raises(ValueError):
        render(tmp_path / "p", **data)


def test_plain_copier_cli_without_trust(tmp_path):
    dest = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "copier", "copy", "--defaults", "--data", "project_name=demo", str(TEMPLATE), str(dest)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (dest / "src" / "demo" / "__init__.py").is_file()
    assert answers(dest)["project_name"] == "demo"


# --- the rendered project works ----------------------------------------------------------------------


def test_rendered_project_tests_run_and_it_builds_a_wheel(tmp_path):
    """The slow one (a pytest run importing torch and a wheel build, a few seconds each)."""
    pytest.importorskip("hatchling")
    project = render(tmp_path / "demo", project_name="demo")
    (project / "tests" / "test_hand_written.py").write_text(HAND_WRITTEN_TEST)

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    import torch

    if torch.cuda.is_available():
        assert "3 passed" in result.stdout, result.stdout
    else:
        assert "2 passed, 1 skipped" in result.stdout, result.stdout
        assert "CUDA is not available" in result.stdout, "the skipped CUDA run should say why"

    out = tmp_path / "wheels"
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-build-isolation"]
        + ["--no-deps", "-w", str(out), str(project)]
    )
    (wheel,) = out.glob("demo-0.1.0-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "demo/__init__.py" in names and "demo/ops/__init__.py" in names, names


# --- updating from a newer template ------------------------------------------------------------------


@needs_git
def test_copier_update_brings_template_changes_and_keeps_edits(tmp_path, git_env):
    template = tmp_path / "tpl"
    shutil.copytree(TEMPLATE, template)
    git(template, "init", "-q", "-b", "main")
    commit_all(template, "v1")
    git(template, "tag", "v1")
    readme = template / "README.md.jinja"
    readme.write_text(readme.read_text() + "\nA line added in v2.\n")
    (template / "CHANGELOG.md.jinja").write_text("# Changes to {{ project_name }}\n")
    commit_all(template, "v2")
    git(template, "tag", "v2")

    project = tmp_path / "proj"
    copier.run_copy(str(template), project, vcs_ref="v1", defaults=True, unsafe=False, quiet=True)
    assert answers(project)["_commit"] == "v1"
    assert not (project / "CHANGELOG.md").exists()
    git(project, "init", "-q", "-b", "main")
    commit_all(project, "from template v1")
    init = project / "src" / "proj" / "__init__.py"
    init.write_text(init.read_text() + "\nMY_CONSTANT = 42  # a user edit\n")
    commit_all(project, "user edit")

    copier.run_update(dst_path=project, defaults=True, unsafe=False, overwrite=True, quiet=True)

    assert answers(project)["_commit"] == "v2"
    assert (project / "README.md").read_text().endswith("\nA line added in v2.\n")
    assert (project / "CHANGELOG.md").read_text() == "# Changes to proj\n"
    assert "MY_CONSTANT = 42  # a user edit" in init.read_text(), "the update lost the user's edit"
    assert EXPORT_MARKERS in init.read_text()
    leftovers = [p.name for p in project.rglob("*") if p.suffix in (".rej", ".orig")]
    assert not leftovers, leftovers
