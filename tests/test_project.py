"""Ops inside a project: the generate-then-edit loop, end to end, through the command line.

new project -> new op -> the project's tests pass -> edit the op -> change its math -> update -> the
edits are kept, the new math is computed, the tests pass -> an overlapping edit -> a conflict, marked,
reported, nothing lost.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from scaffold import cli
from scaffold.changes import update_changes
from scaffold.errors import SpecError, WriteError
from scaffold.formatting import ruff_binary
from scaffold.project import (
    EXPORTS_BEGIN,
    EXPORTS_END,
    find_project,
    project_template,
    read_template_record,
    with_exports,
)
from scaffold.write import apply_changes

from .forked_pytest import PytestRun

SWISH = ["new", "op", "swish", "--forward", "x / (1 + exp(-beta * x))", "--tensor", "x", "--learnable", "beta=1.0"]
BACKWARD_EDIT = "        grad_output = grad_output.contiguous()  # mine: my kernel wants contiguous gradients\n"
HELPER = '\n\ndef swish_flops(numel: int) -> int:\n    """Mine: a helper at the end."""\n    return 4 * numel\n'
USER_TEST = """

def test_my_own_check(device):
    import torch
    from demo_ops.ops.swish import swish_flops
    assert swish_flops(10) == 40
    x = torch.zeros(3, device=device)
    assert swish(x, torch.tensor(1.0, device=device)).abs().sum() == 0
"""


@pytest.fixture
def scaffold(monkeypatch, capsys):
    """``scaffold(*args, cwd=...)`` runs the command line in ``cwd``: (exit code, stdout, stderr)."""

    def run(*args: str, cwd: Path) -> tuple[int, str, str]:
        monkeypatch.chdir(cwd)
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def project_tests(root: Path) -> subprocess.CompletedProcess:
    """The project's own test command, in a fresh process (tests/forked_pytest.py) where scaffold cannot be
    imported (a folder first on PYTHONPATH whose scaffold package refuses to import): after the
    project's own set-up, its tests run without scaffold (they import the project's copy of the test library).
    Torch's deprecation notices do not reach the output."""
    blocker = root.parent / f"{root.name}-without-scaffold" / "scaffold"
    blocker.mkdir(parents=True, exist_ok=True)
    (blocker / "__init__.py").write_text("raise ImportError('scaffold is not installed where the project is tested')\n")
    env = {**os.environ, "PYTHONPATH": str(blocker.parent)}
    result = PytestRun(root, ["-q", "-p", "no:cacheprovider"], env).wait(timeout=600)
    assert "warning" not in result.stdout.lower(), result.stdout[-3000:]
    return result


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture
def project(tmp_path, scaffold) -> Path:
    """A new project, made with `scaffold new project`, holding the op swish."""
    code, out, err = scaffold(
        "new", "project", "demo", "--defaults", "--data", "project_name=demo-ops",
        cwd=tmp_path
    )  # fmt: skip
    assert code == 0, err
    root = tmp_path / "demo"
    # Anywhere inside the project: the project is found by walking up.
    code, out, err = scaffold(*SWISH, cwd=root / "src" / "demo_ops")
    assert code == 0, err
    for path in ("specs/swish.toml", "src/demo_ops/ops/swish.py", "tests/test_swish.py", ".scaffold/swish/record.toml"):
        assert path in out or path.startswith(".scaffold"), out
        assert (root / path).is_file(), path
    return root


def test_generate_edit_change_update_loop(project, scaffold):
    init = (project / "src/demo_ops/__init__.py").read_text()
    assert "from .ops.swish import Swish, SwishFunction, swish" in init
    result = project_tests(project)
    assert result.returncode == 0, result.stdout + result.stderr

    # The user edits the generated module (a line inside backward, a helper at the end) and the test.
    module = project / "src/demo_ops/ops/swish.py"
    text = module.read_text()
    anchor = "        x, beta = ctx.saved_tensors\n        # _backward, or _SwishBackward"
    assert anchor in text
    module.write_text(text.replace(anchor, anchor.replace("\n", "\n" + BACKWARD_EDIT, 1), 1) + HELPER)
    test_file = project / "tests/test_swish.py"
    test_file.write_text(test_file.read_text() + USER_TEST)

    # The math changes in the spec; update merges it into the edited files.
    spec = project / "specs/swish.toml"
    spec.write_text(spec.read_text().replace('"x / (1 + exp(-beta * x))"', '"x / (1 + exp(-beta * x)) + x / 8"'))
    code, out, err = scaffold("update", "op", "swish", cwd=project)
    assert code == 0, err
    assert "merged  src/demo_ops/ops/swish.py  (your edits kept)" in out
    assert "merged  tests/test_swish.py" in out
    merged = module.read_text()
    assert BACKWARD_EDIT in merged and merged.endswith(HELPER)
    assert "return (beta * x).sigmoid_().mul_(x).add_(x / 8)" in merged, "the new forward is not computed"
    assert "x / 8" in test_file.read_text() and USER_TEST in test_file.read_text()
    result = project_tests(project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_my_own_check" not in result.stdout  # passed: not listed among failures
    assert result.stdout.count(" passed") == 1

    # Updating again changes nothing.
    before = snapshot(project)
    code, out, err = scaffold("update", cwd=project)
    assert code == 0, err
    assert "merged" not in out and "updated" not in out, out
    assert snapshot(project) == before

    # An edit that overlaps what the next change touches: a conflict, marked and reported, nothing lost.
    text = module.read_text()
    line = next(ln for ln in text.splitlines(keepends=True) if ln.lstrip().startswith("return (beta * x).sigmoid_()"))
    mine = line.rstrip("\n") + "  # mine: checked against the paper\n"
    module.write_text(text.replace(line, mine))
    code, out, err = scaffold(
        "update", "op", "swish", "--forward", "x / (1 + exp(-beta * x)) + x / 4",
        cwd=project
    )  # fmt: skip
    assert code == cli.EXIT_CONFLICT, (out, err)
    assert "conflict  src/demo_ops/ops/swish.py  (1 conflict" in out
    assert "1 file has conflicts" in err
    conflicted = module.read_text()
    assert conflicted.count("<<<<<<< yours\n") == 1 and conflicted.count(">>>>>>> scaffold ") == 1
    assert "+ x / 4" in conflicted
    for kept in (BACKWARD_EDIT, HELPER, mine):
        assert kept in conflicted, f"the user's {kept!r} was lost"
    assert 'forward = "x / (1 + exp(-beta * x)) + x / 4"' in spec.read_text()

    # Until the conflict is resolved, update refuses to touch anything.
    before = snapshot(project)
    code, out, err = scaffold("update", cwd=project)
    assert code == cli.EXIT_ERROR
    assert "conflict markers from the last update are still there" in err and "Traceback" not in err
    assert snapshot(project) == before


def test_an_update_that_adds_a_learnable_tensor_keeps_the_helper_at_the_end(project, scaffold):
    # The new tensor changes the Module's forward, the file's last line, and the line that unpacks the saved
    # tensors: the helper appended after the one and the line inserted after the other are merged, not marked.
    module = project / "src/demo_ops/ops/swish.py"
    text = module.read_text()
    anchor = "        x, beta = ctx.saved_tensors\n        # _backward, or _SwishBackward"
    assert text.count(anchor) == 1 and text.endswith("        return _apply(x, self.beta)\n")
    module.write_text(text.replace(anchor, anchor.replace("\n", "\n" + BACKWARD_EDIT, 1)) + HELPER)
    code, out, err = scaffold(
        "update", "op", "swish", "--forward", "x*sigmoid(beta*x)*gamma", "--learnable", "gamma=1.0", cwd=project
    )  # fmt: skip
    assert code == 0, (out, err)
    assert "merged  src/demo_ops/ops/swish.py  (your edits kept)" in out
    merged = module.read_text()
    assert "<<<<<<<" not in merged and merged.endswith("        return _apply(x, self.beta, self.gamma)\n" + HELPER)
    unpacked = "        x, beta, gamma = ctx.saved_tensors\n"
    assert unpacked + BACKWARD_EDIT + "        # _backward, or _SwishBackward" in merged
    # Run as a module of the project's ops package, which holds the runtime it imports.
    namespace: dict = {"__name__": "demo_ops.ops._merged", "__package__": "demo_ops.ops"}
    sys.path.insert(0, str(project / "src"))
    try:
        exec(compile(merged, str(module), "exec"), namespace)
    finally:
        sys.path.remove(str(project / "src"))
        for name in [m for m in sys.modules if m == "demo_ops" or m.startswith("demo_ops.")]:
            del sys.modules[name]
    import torch

    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    swish = namespace["Swish"]().double()
    swish(x).sum().backward()
    beta = gamma = 1.0
    torch.testing.assert_close(swish(x), x * torch.sigmoid(beta * x) * gamma)
    assert namespace["swish_flops"](10) == 40 and x.grad is not None


def test_dry_run_shows_the_diff_and_writes_nothing(project, scaffold):
    before = snapshot(project)
    code, out, err = scaffold(
        "update", "op", "swish", "--forward", "x * tanh(beta * x)", "--dry-run",
        cwd=project
    )  # fmt: skip
    assert code == 0, err
    assert "--- a/specs/swish.toml" in out and '+forward = "x * tanh(beta * x)"' in out
    assert "+++ b/src/demo_ops/ops/swish.py" in out and "+        return (beta * x).tanh_().mul_(x)" in out
    assert "(dry run: nothing was written)" in out
    assert snapshot(project) == before


def test_update_every_op_after_upgrading_scaffold(project, scaffold, monkeypatch):
    code, out, err = scaffold(
        "new", "op", "softsign", "--forward", "x / (1 + Abs(x))", "--tensor", "x",
        cwd=project / "tests"
    )  # fmt: skip
    assert code == 0, err
    init = (project / "src/demo_ops/__init__.py").read_text()
    assert "from .ops.softsign import Softsign, SoftsignFunction, softsign" in init
    module = project / "src/demo_ops/ops/softsign.py"
    module.write_text(module.read_text() + HELPER)
    # A newer scaffold writes a different header; in-process so the patched version is seen.
    monkeypatch.setattr("scaffold.render.__version__", "9.9.9")
    changes = update_changes(find_project(project), time_limit=None)
    status = {str(c.path): c.status for c in changes}
    assert status["src/demo_ops/ops/softsign.py"] == "merged"
    assert status["src/demo_ops/ops/swish.py"] == "updated"
    assert status["tests/test_swish.py"] == "updated"
    apply_changes(project, changes)
    assert module.read_text().startswith("# Generated by scaffold 9.9.9") and module.read_text().endswith(HELPER)
    assert 'scaffold = "0.1.0"' in (project / ".scaffold/softsign/record.toml").read_text()
    result = project_tests(project)
    assert result.returncode == 0, result.stdout + result.stderr


def test_without_a_record_every_difference_is_a_conflict(project, scaffold):
    module = project / "src/demo_ops/ops/swish.py"
    module.write_text(
        module.read_text().replace("(beta * x).sigmoid_().mul_(x)\n", "(x * beta).sigmoid_().mul_(x)\n", 1)
    )
    for stored in (project / ".scaffold/swish").iterdir():
        stored.unlink()
    ours = module.read_text()
    code, out, err = scaffold("update", cwd=project)
    assert code == cli.EXIT_CONFLICT
    text = module.read_text()
    assert "(x * beta).sigmoid_()" in text and "<<<<<<< yours" in text
    assert all(line in text for line in ours.splitlines())


def test_new_op_refuses_an_existing_op(project, scaffold):
    before = snapshot(project)
    code, out, err = scaffold(*SWISH[:4], "x * tanh(x)", "--tensor", "x", cwd=project)
    assert code == cli.EXIT_ERROR
    assert "the op 'swish' already exists in this project" in err and "scaffold update op swish" in err
    assert snapshot(project) == before


def test_new_op_from_a_hand_written_spec(project, scaffold):
    spec = project / "specs/cube.toml"
    text = '# my comment\nname = "cube"\nforward = "x**3"\n\n[tensors.x]\nshape = [3]\n'
    spec.write_text(text)
    code, out, err = scaffold("new", "op", "--spec", "specs/cube.toml", cwd=project)
    assert code == 0, err
    assert spec.read_text() == text
    assert "from specs/cube.toml" in (project / "src/demo_ops/ops/cube.py").read_text().splitlines()[0]


def test_new_op_with_named_sizes_writes_them_into_its_spec(project, scaffold):
    flags = ["--tensor", "x=4,features", "--tensor", "weight=features", "--learnable", "weight=ones"]
    code, out, err = scaffold(
        "new", "op", "scale", "--forward", "x * weight", *flags, "--size", "features=8", cwd=project
    )
    assert code == 0, err
    spec = (project / "specs/scale.toml").read_text()
    assert "[sizes]\nfeatures = 8\n" in spec and 'shape = [4, "features"]' in spec and 'init = "ones"' in spec
    module = (project / "src/demo_ops/ops/scale.py").read_text()
    assert "def __init__(self, features: int = 8) -> None:" in module
    code, out, err = scaffold("update", "op", "scale", "--size", "features=12", cwd=project)
    assert code == 0, err
    assert "features = 12" in (project / "specs/scale.toml").read_text()
    assert "features: int = 12" in (project / "src/demo_ops/ops/scale.py").read_text()


def test_outside_a_project_update_says_so(tmp_path, scaffold):
    code, out, err = scaffold("update", cwd=tmp_path)
    assert code == cli.EXIT_ERROR
    assert "not inside a scaffold project" in err


def test_outside_a_project_new_op_writes_here(tmp_path, scaffold):
    code, out, err = scaffold(*SWISH, cwd=tmp_path)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_scaffold_runtime.py", "swish.py", "test_swish.py"]
    assert "device = device_fixture()" in (tmp_path / "test_swish.py").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("update", "op", "nope"), "specs/nope.toml does not exist"),
        (("update", "--forward", "x"), "unrecognized arguments"),
        (("update", "op", "swish", "--forward", "x * y"), "unknown name 'y'"),
    ],
)
def test_update_errors(project, monkeypatch, capsys, args, message):
    before = snapshot(project)
    monkeypatch.chdir(project)
    try:
        code = cli.main(list(args))
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code != 0
    assert message in err, err
    assert snapshot(project) == before


def test_flags_that_touch_edited_spec_lines_are_refused(project, scaffold):
    spec = project / "specs/swish.toml"
    spec.write_text(spec.read_text().replace("forward = ", "forward =  ", 1))
    before = snapshot(project)
    code, out, err = scaffold(
        "update", "op", "swish", "--forward", "x * tanh(x)", "--tensor", "x",
        cwd=project
    )  # fmt: skip
    assert code == cli.EXIT_ERROR
    assert "specs/swish.toml: the flags change lines of the spec that you have edited" in err
    assert snapshot(project) == before


def test_new_project_refuses_a_folder_with_files(tmp_path, scaffold):
    (tmp_path / "mine.txt").write_text("keep me")
    code, out, err = scaffold("new", "project", ".", "--defaults", cwd=tmp_path)
    assert code == cli.EXIT_ERROR
    assert "the folder already exists and is not empty" in err
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--data", "package_name=1abc"), "the template refused the answers"),
        (("--data", "nonsense"), "cannot read --data 'nonsense'"),
        ((), "there is no terminal to ask the template's questions on"),
    ],
)
def test_new_project_errors(tmp_path, scaffold, args, message):
    extra = () if not args else ("--defaults",)
    code, out, err = scaffold("new", "project", "p", *extra, *args, cwd=tmp_path)
    assert code == cli.EXIT_ERROR
    assert message in err, err
    assert not (tmp_path / "p").exists()


def test_a_fresh_project_with_its_ops_is_clean_under_its_own_ruff_settings(project, scaffold):
    # ruff's default rules flagged a noqa for E731 in the vendored tests/scaffold_testing.py (RUF100, E731 not
    # selected), the fused ops' blind excepts (BLE001) and jvp's unused values in a structured op (F841).
    ops = [
        ["softmax", "--forward", "exp(x) / sum(exp(x), dim=-1, keepdim=True)", "--tensor", "x=3,4"],
        ["gelu_fused", "--forward", "x * ndtr(x)", "--tensor", "x", "--fuse"],
        ["rms_rows", "--forward", "x / sqrt(mean(x**2, dim=-1, keepdim=True) + 1e-6)", "--tensor", "x=3,4", "--fuse"],
        ["mish_op", "--forward", "x * tanh(softplus(x))", "--tensor", "x", "--target", "custom_op"],
        ["ste", "--forward", "Abs(x)", "--tensor", "x", "--gradient", "x=grad"],
        [
            "linear_relu",
            "--forward",
            "Max(x @ transpose(w, 0, 1) + b, 0)",
            "--tensor",
            "x=2,3",
            "--tensor",
            "w=4,3",
            "--tensor",
            "b=4",
        ],
    ]
    for args in ops:
        code, out, err = scaffold("new", "op", *args, cwd=project)
        assert code == 0, err
    assert (project / "tests/scaffold_testing.py").is_file()
    ruff = ruff_binary()
    for command in (["check", "."], ["format", "--check", "--diff", "."]):
        result = subprocess.run([ruff, *command], cwd=project, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"ruff {' '.join(command)}:\n{result.stdout}{result.stderr}"


def test_new_project_names_the_package_after_the_folder(tmp_path, scaffold):
    code, out, err = scaffold("new", "project", "foo-bar", "--defaults", cwd=tmp_path)
    assert code == 0, err
    project = find_project(tmp_path / "foo-bar")
    assert project is not None and project.package == "foo_bar"
    assert 'name = "foo-bar"' in (tmp_path / "foo-bar" / "pyproject.toml").read_text()
    (tmp_path / "Mine.Ops").mkdir()
    code, out, err = scaffold("new", "project", ".", "--defaults", cwd=tmp_path / "Mine.Ops")
    assert code == 0, err
    assert find_project(tmp_path / "Mine.Ops").package == "mine_ops"


@pytest.mark.parametrize(
    ("folder", "args", "message", "hint"),
    [
        ("2024-ops", (), "Validation error for question 'project_name'", "named after its folder, '2024-ops'"),
        ("torch", (), "'torch' is reserved", "named after its folder, 'torch'"),
        ("json", (), "the package name 'json' is also the name of Python's standard module json", "folder, 'json'"),
        ("ops", ("--data", "package_name=copy"), "the package name 'copy' is also", "choose another with --data"),
    ],
)
def test_new_project_refuses_a_package_it_cannot_name(tmp_path, scaffold, folder, args, message, hint):
    code, out, err = scaffold("new", "project", folder, "--defaults", *args, cwd=tmp_path)
    assert code == cli.EXIT_ERROR and message in err and hint in err, err
    assert "Traceback" not in err and not (tmp_path / folder).exists()


def test_exports_block():
    block = "from .ops.a import A, AFunction, a\n"
    text = '"""Mine."""\n\nMY_CONSTANT = 1\n'
    added = with_exports(text, block, where="x")
    assert added.startswith(text) and f"{EXPORTS_BEGIN}\n{block}{EXPORTS_END}\n" in added
    assert with_exports(added, "__all__: list[str] = []\n", where="x").count("MY_CONSTANT") == 1
    with pytest.raises(SpecError, match="the export markers are broken"):
        with_exports(added + EXPORTS_BEGIN + "\n", block, where="x")


def test_project_table_is_checked(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.scaffold]\npackage = "my-ops"\n')
    with pytest.raises(SpecError, match="package 'my-ops' is not a valid name"):
        find_project(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.scaffold]\npackage = "myops"\n')
    with pytest.raises(SpecError, match="src/myops/__init__.py is missing"):
        find_project(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n')
    assert find_project(tmp_path) is None or find_project(tmp_path).root != tmp_path


def test_an_existing_project_adopts_scaffold(tmp_path, scaffold):
    """A hand-made project: a [tool.scaffold] table, no export markers, no conftest.py."""
    root = tmp_path / "handmade"
    (root / "lib" / "mine").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "mine"\nversion = "1.0"\n\n[tool.pytest.ini_options]\npythonpath = ["lib"]\n\n'
        '[tool.scaffold]\npackage = "mine"\nsrc = "lib"\n'
    )
    init = root / "lib" / "mine" / "__init__.py"
    init.write_text('"""Mine."""\n\nVALUE = 1\n')
    code, out, err = scaffold("new", "op", "cube", "--forward", "x**3", "--tensor", "x", cwd=root)
    assert code == 0, err
    assert "created  lib/mine/ops/__init__.py" in out and "created  tests/test_cube.py" in out
    text = init.read_text()
    assert text.startswith('"""Mine."""\n\nVALUE = 1\n\n') and "from .ops.cube import Cube, CubeFunction, cube" in text
    assert "device = device_fixture()" in (root / "tests" / "test_cube.py").read_text(), "no shared fixture to rely on"
    result = project_tests(root)
    assert result.returncode == 0, result.stdout + result.stderr


# --- updating the project from its template ----------------------------------------------------------

TEMPLATE_RECORD = ".scaffold/project-template"
NEW_GPU_LINE = "are skipped on a machine without a GPU (see tests/conftest.py)."
OP_FILES = (
    "specs/swish.toml",
    "src/demo_ops/ops/swish.py",
    "tests/test_swish.py",
    "tests/scaffold_testing.py",
    "src/demo_ops/ops/_scaffold_runtime.py",
    ".scaffold/swish/",
)


@pytest.fixture
def template(tmp_path) -> Path:
    """A copy of the shipped project template, for a test to change as a newer scaffold would."""
    copy = tmp_path / "template"
    shutil.copytree(project_template(), copy)
    return copy


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def change_template(template: Path) -> None:
    """A newer template: a new file, a changed README line, a changed .gitignore, a changed package
    ``__init__.py`` (also between the export markers, which are scaffold's), a file no longer written."""
    (template / "CHANGELOG.md.jinja").write_text("# Changes to {{ project_name }}\n")
    replace_once(template / "README.md.jinja", "are skipped on a machine without a GPU.", NEW_GPU_LINE)
    replace_once(template / ".gitignore.jinja", "# Tools\n", "# Tools\n.ipynb_checkpoints/\n")
    init = template / "src" / "{{ package_name }}" / "__init__.py.jinja"
    replace_once(init, "`scaffold update`; keep", "`scaffold update op`; keep")
    replace_once(init, "__all__: list[str] = []\n", "__all__: list[str] = []  # filled in by scaffold\n")
    (template / "specs" / "README.md.jinja").unlink()


def op_files(root: Path) -> dict[str, str]:
    return {path: digest for path, digest in snapshot(root).items() if path.startswith(OP_FILES)}


def test_new_project_records_the_template_render(project):
    record = tomllib.loads((project / TEMPLATE_RECORD / "record.toml").read_text())
    assert record["scaffold"] == "0.1.0"
    assert ".copier-answers.yml" in record["files"] and "src/demo_ops/__init__.py" in record["files"]
    for path in record["files"]:
        base = (project / TEMPLATE_RECORD / f"{path}.base").read_text()
        if path == "src/demo_ops/__init__.py":  # new op has exported swish since
            assert "__all__: list[str] = []\n" in base and "swish" not in base
        else:
            assert base == (project / path).read_text(), path
    assert sorted(record["files"]) == sorted(
        path for path in snapshot(project) if not path.startswith(".scaffold") and not path.startswith(OP_FILES)
    )


def test_update_project_merges_template_changes_and_keeps_edits(project, template, scaffold):
    change_template(template)
    readme, init = project / "README.md", project / "src/demo_ops/__init__.py"
    replace_once(readme, 'pip install -e ".[test]"\n', 'pip install -e ".[test]"  # mine: or uv pip install\n')
    replace_once(init, '__version__ = "0.1.0"\n', '__version__ = "0.1.0"\nMY_CONSTANT = 42  # mine\n')
    (project / ".github/workflows/tests.yml").unlink()
    ops_before = op_files(project)

    code, out, err = scaffold("update", "project", "--template", str(template), cwd=project / "tests")
    assert code == 0, err
    for line in (
        "created  CHANGELOG.md\n",
        "updated  .gitignore\n",
        "updated  .copier-answers.yml\n",  # _src_path names the other template
        "merged  README.md  (your edits kept)\n",
        "merged  src/demo_ops/__init__.py  (your edits kept)\n",
        "unchanged  pyproject.toml\n",
        "kept  specs/README.md  (the template no longer writes it: left as it is",
        "absent  .github/workflows/tests.yml  (you deleted it: not re-created)\n",
        f"recorded  {TEMPLATE_RECORD}/\n",
    ):
        assert line in out, (line, out)
    assert (project / "CHANGELOG.md").read_text() == "# Changes to demo-ops\n"
    assert ".ipynb_checkpoints/" in (project / ".gitignore").read_text()
    text = readme.read_text()
    assert NEW_GPU_LINE in text and "# mine: or uv pip install" in text
    text = init.read_text()
    assert "MY_CONSTANT = 42  # mine" in text and "`scaffold update op`; keep" in text
    assert "from .ops.swish import Swish, SwishFunction, swish" in text and "filled in by scaffold" not in text
    assert (project / "specs/README.md").is_file() and not (project / ".github/workflows/tests.yml").exists()
    assert op_files(project) == ops_before, "the template update touched an op's files or records"
    record = tomllib.loads((project / TEMPLATE_RECORD / "record.toml").read_text())
    assert "CHANGELOG.md" in record["files"] and "specs/README.md" not in record["files"]
    assert (project / TEMPLATE_RECORD / "README.md.base").read_text().count(NEW_GPU_LINE) == 1

    # Again: nothing to do.
    before = snapshot(project)
    code, out, err = scaffold("update", "project", "--template", str(template), cwd=project)
    assert code == 0, err
    assert {line.split()[0] for line in out.splitlines()} == {"unchanged", "absent"}, out
    assert snapshot(project) == before

    # The ops' update still rewrites the export block of the merged __init__.py, and nothing else of it.
    code, out, err = scaffold("update", cwd=project)
    assert code == 0, err
    assert "unchanged  src/demo_ops/__init__.py" in out and snapshot(project) == before


def test_update_project_conflict_is_marked_and_reported(project, template, scaffold):
    change_template(template)
    readme = project / "README.md"
    replace_once(readme, "are skipped on a machine without a GPU.", "are skipped where there is no GPU (mine).")
    code, out, err = scaffold("update", "project", "--template", str(template), cwd=project)
    assert code == cli.EXIT_CONFLICT, (out, err)
    assert "conflict  README.md  (1 conflict between <<<<<<< and >>>>>>>" in out
    assert "1 file has conflicts: your edits overlap what the project template changed" in err
    text = readme.read_text()
    assert "<<<<<<< yours\nare skipped where there is no GPU (mine).\n=======\n" in text
    assert f"{NEW_GPU_LINE}\n>>>>>>> scaffold 0.1.0 (project template)\n" in text
    assert (project / "CHANGELOG.md").is_file(), "the files without conflicts are updated too"

    # Until the markers are gone, the next update refuses to write anything.
    before = snapshot(project)
    code, out, err = scaffold("update", "project", "--template", str(template), cwd=project)
    assert code == cli.EXIT_ERROR and "conflict markers from the last update are still there" in err
    assert snapshot(project) == before


def test_update_project_dry_run_writes_nothing(project, template, scaffold):
    change_template(template)
    before = snapshot(project)
    code, out, err = scaffold("update", "project", "--template", str(template), "--dry-run", cwd=project)
    assert code == 0, err
    assert "--- /dev/null\n+++ b/CHANGELOG.md\n" in out and f"+{NEW_GPU_LINE}\n" in out
    assert "created  CHANGELOG.md" in out and "(dry run: nothing was written)" in out
    assert ".scaffold" not in out.split("(dry run")[0].replace(f"recorded  {TEMPLATE_RECORD}/", "")
    assert snapshot(project) == before


def test_update_project_without_a_record(project, template, scaffold):
    shutil.rmtree(project / TEMPLATE_RECORD)
    before = snapshot(project)
    code, out, err = scaffold("update", "project", cwd=project)
    assert code == cli.EXIT_ERROR
    assert f"{TEMPLATE_RECORD}/record.toml: there is no record of the template render" in err
    assert "scaffold update project --adopt" in err and "Traceback" not in err
    assert snapshot(project) == before

    # Copied by copier from a git-tracked template: copier updates it.
    answers = project / ".copier-answers.yml"
    answers.write_text(answers.read_text() + "_commit: v1\n")
    code, out, err = scaffold("update", "project", cwd=project)
    assert code == cli.EXIT_ERROR
    assert "copied with copier from a git-tracked template" in err and "`copier update`" in err
    answers.write_text(answers.read_text().replace("_commit: v1\n", ""))

    # --adopt records the render as the base and changes nothing else; later changes are merged.
    readme = project / "README.md"
    readme.write_text(readme.read_text() + "\nMine.\n")
    before = snapshot(project)
    code, out, err = scaffold("update", "project", "--adopt", cwd=project)
    assert code == 0, err
    assert "kept  README.md  (differs from the template: kept as it is (--adopt))" in out
    assert "kept  src/demo_ops/__init__.py" in out and f"recorded  {TEMPLATE_RECORD}/" in out
    after = snapshot(project)
    assert {p: d for p, d in after.items() if not p.startswith(TEMPLATE_RECORD)} == before
    change_template(template)
    code, out, err = scaffold("update", "project", "--template", str(template), cwd=project)
    assert code == 0, err
    assert "merged  README.md" in out and readme.read_text().endswith("\nMine.\n")
    assert NEW_GPU_LINE in readme.read_text()


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/hostname", "src/../../x", ".scaffold/swish/record.toml", ""])
def test_a_damaged_template_record_is_refused(project, scaffold, path):
    manifest = project / TEMPLATE_RECORD / "record.toml"
    text = manifest.read_text()
    damaged = text.replace('"README.md"', json.dumps(path))
    assert damaged != text
    manifest.write_text(damaged)
    before = snapshot(project)
    with pytest.raises(WriteError, match="the record of the template's last render is damaged"):
        read_template_record(find_project(project))
    code, out, err = scaffold("update", "project", cwd=project)
    assert code == cli.EXIT_ERROR and "scaffold update project --adopt" in err
    assert snapshot(project) == before


# --- formatting ----------------------------------------------------------------------------------------


def ruff(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Ruff as the project's user runs it: in the project, with the project's settings."""
    return subprocess.run([sys.executable, "-m", "ruff", *args, "--no-cache"], cwd=cwd, capture_output=True, text=True)


def test_generated_project_files_pass_ruff_with_the_projects_settings(project, scaffold):
    # The project's own settings: shorter lines than scaffold's style, and an import every file needs
    # (which must not land inside the export block). Regenerated with them, swish is merely updated.
    pyproject = project / "pyproject.toml"
    settings = '\n[tool.ruff.lint.isort]\nrequired-imports = ["from __future__ import annotations"]\n'
    pyproject.write_text(pyproject.read_text().replace("line-length = 120", "line-length = 100") + settings)
    code, out, err = scaffold("update", cwd=project)
    assert code == 0, err
    assert "updated  src/demo_ops/ops/swish.py" in out, out
    # A long name (wrapped imports), names that sort differently as text and naturally (op2, op10).
    for name in ("a_rather_long_operation_name_for_wrapping_lines", "op10", "op2"):
        code, out, err = scaffold("new", "op", name, "--forward", "x**3", "--tensor", "x", cwd=project)
        assert code == 0, err
    # What scaffold wrote (the template's conftest.py is the template's, at its own line length).
    generated = ["src", *(str(p.relative_to(project)) for p in (project / "tests").glob("test_*.py"))]
    assert len(generated) == 5
    formatted = ruff("format", "--check", *generated, cwd=project)
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr
    checked = ruff("check", "--extend-select", "W,I", *generated, cwd=project)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    init = (project / "src/demo_ops/__init__.py").read_text()
    assert "from .ops.a_rather_long_operation_name_for_wrapping_lines import (\n" in init


def test_update_after_ruff_over_the_whole_project_is_clean(project, scaffold):
    """Issue 12: the user runs ruff over the project, the spec changes, `scaffold update` merges cleanly."""
    assert ruff("format", ".", cwd=project).returncode == 0
    assert ruff("check", "--fix", ".", cwd=project).returncode == 0
    spec = project / "specs/swish.toml"
    spec.write_text(spec.read_text().replace('"x / (1 + exp(-beta * x))"', '"x / (1 + exp(-beta * x)) + x / 8"'))
    code, out, err = scaffold("update", cwd=project)
    assert code == 0, (out, err)
    assert "updated  src/demo_ops/ops/swish.py" in out and "updated  tests/test_swish.py" in out, out
    assert "merged" not in out and "conflict" not in out, out
    for path in project.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            lines = path.read_text(errors="replace").splitlines()
            assert not any(line.startswith(("<<<<<<< ", ">>>>>>> ")) for line in lines), f"conflict markers in {path}"
    assert "return (beta * x).sigmoid_().mul_(x).add_(x / 8)" in (project / "src/demo_ops/ops/swish.py").read_text()


# A line as today's ruff formats it, and as an older ruff (or none) is made to have left it: one the spec
# change below rewrites, and one it leaves alone.
OLD_STYLES = {
    "changed line": ("return (beta * x).sigmoid_().mul_(x)\n", "return (beta*x).sigmoid_().mul_(x)\n"),
    "unchanged line": ("x, beta = inputs\n", "x,beta = inputs\n"),
}


@pytest.mark.parametrize("line", OLD_STYLES)
@pytest.mark.parametrize("recorded", ['ruff = "0.0.1"\n', None], ids=["older ruff", "record without ruff"])
@pytest.mark.parametrize("users_file", ["formatted by today's ruff", "as the older ruff left it"])
def test_a_base_formatted_by_another_ruff_is_reformatted_before_the_merge(
    project, scaffold, recorded, users_file, line
):
    module = project / "src/demo_ops/ops/swish.py"
    record = project / ".scaffold/swish/record.toml"
    base = project / ".scaffold/swish/swish.py.base"
    formatted, old_style = OLD_STYLES[line]
    assert module.read_text().count(formatted) == 1 and base.read_text() == module.read_text()
    assert 'ruff = "0.17.6"\n' in record.read_text()
    base.write_text(base.read_text().replace(formatted, old_style))
    record.write_text(record.read_text().replace('ruff = "0.17.6"\n', recorded or ""))
    if users_file == "as the older ruff left it":
        module.write_text(base.read_text() + HELPER)
    else:
        module.write_text(module.read_text() + HELPER)
    spec = project / "specs/swish.toml"
    spec.write_text(spec.read_text().replace('"x / (1 + exp(-beta * x))"', '"x / (1 + exp(-beta * x)) + x / 8"'))
    code, out, err = scaffold("update", cwd=project)
    assert code == 0, (out, err)
    assert "merged  src/demo_ops/ops/swish.py" in out, out
    text = module.read_text()
    assert "<<<<<<<" not in text and text.endswith(HELPER)
    assert "x / 8\n" in text
    # Either way the result is the new generation with the user's edit; the new record names today's ruff.
    assert text == base.read_text() + HELPER
    assert 'ruff = "0.17.6"\n' in record.read_text()


def test_a_structured_op_in_a_project_passes_its_tests(project, scaffold):
    """An op that reduces and multiplies matrices, added to a project: its module, test and record are
    written as for any op, and the project's own tests (without scaffold installed) pass."""
    args = ["new", "op", "row_softmax_linear", "--forward", "softmax(x @ transpose(w, 0, 1), dim=-1)"]
    code, out, err = scaffold(*args, "--tensor", "x=4,8", "--tensor", "w=6,8", cwd=project)
    assert code == 0, err
    module = (project / "src/demo_ops/ops/row_softmax_linear.py").read_text()
    assert "torch.softmax(" in module and "ctx.save_for_backward(x, w, out)" in module
    assert (project / ".scaffold/row_softmax_linear/record.toml").is_file()
    result = project_tests(project)
    assert result.returncode == 0, result.stdout[-3000:]


def test_a_fused_row_op_in_a_project_runs_its_triton_kernels_in_its_tests(project, scaffold):
    """A fused norm in a project (whose package imports every op): the project's conftest turns Triton's
    interpreter on before that, so the op's test_row_kernels runs its kernels on the CPU, not skipped."""
    args = ["new", "op", "rms_rows", "--forward", "x / sqrt(mean(x**2, dim=-1, keepdim=True) + 1e-6)"]
    code, out, err = scaffold(*args, "--tensor", "x=4,8", "--fuse", cwd=project)
    assert code == 0, err
    assert "def _backward_kernel(" in (project / "src/demo_ops/ops/rms_rows.py").read_text()
    result = project_tests(project)
    assert result.returncode == 0, result.stdout[-3000:]
    skips = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]  # -ra lists every skip
    assert skips and all(line.endswith("CUDA is not available") for line in skips), result.stdout[-3000:]


def test_a_project_keeps_one_runtime_in_its_ops_package_and_merges_edits_into_it(project, scaffold):
    runtime = project / "src/demo_ops/ops" / "_scaffold_runtime.py"
    module = (project / "src/demo_ops/ops/swish.py").read_text()
    assert runtime.is_file() and not (project / "tests" / "_scaffold_runtime.py").exists()
    assert "from . import _scaffold_runtime as _runtime\n" in module and "except ImportError" not in module
    assert (project / ".scaffold" / "_scaffold_runtime.py.base").read_text() == runtime.read_text()
    # The user's edit to the runtime survives the next op and an update.
    edited = runtime.read_text().replace("import torch\n", "import torch  # mine\n", 1)
    runtime.write_text(edited)
    code, out, err = scaffold("new", "op", "cube", "--forward", "x**3", "--tensor", "x", cwd=project)
    assert code == 0, err
    code, out, err = scaffold("update", cwd=project)
    assert code == 0, err
    assert runtime.read_text() == edited
    assert "_scaffold_runtime" not in (project / "src/demo_ops/__init__.py").read_text()
