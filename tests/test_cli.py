"""The command line: what it writes, prints and refuses."""

from __future__ import annotations

import subprocess
import sys

from scaffold.cli import main

from .conftest import SPECS

SWISH = ["new", "op", "swish", "--forward", "x / (1 + exp(-beta * x))", "--tensor", "x", "--learnable", "beta=1.0"]


def test_new_op_writes_and_reports(tmp_path, capsys):
    assert main([*SWISH, "--output-dir", str(tmp_path / "ops")]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "ops").iterdir()) == ["_scaffold_runtime.py", "swish.py", "test_swish.py"]
    assert f"created  {tmp_path / 'ops' / 'swish.py'}" in out
    module = (tmp_path / "ops" / "swish.py").read_text()
    for name in ("class SwishFunction(torch.autograd.Function)", "def swish(", "class Swish(nn.Module)"):
        assert name in module


def test_flags_and_spec_file_give_the_same_files(tmp_path):
    main([*SWISH, "--output-dir", str(tmp_path / "flags")])
    spec = tmp_path / "swish.toml"
    spec.write_text(
        'name = "swish"\nforward = "x / (1 + exp(-beta * x))"\n[tensors.x]\n'
        "[tensors.beta]\nlearnable = true\ninit = 1.0\n"
    )
    main(["new", "op", "--spec", str(spec), "--output-dir", str(tmp_path / "spec")])
    for name in ("swish.py", "test_swish.py"):
        flags = (tmp_path / "flags" / name).read_text().split("\n", 1)[1]  # the header names the source
        assert flags == (tmp_path / "spec" / name).read_text().split("\n", 1)[1]


def test_never_overwrites_without_force(tmp_path, capsys):
    assert main([*SWISH, "-o", str(tmp_path)]) == 0
    edited = (tmp_path / "swish.py").read_text() + "\n# my edit\n"
    (tmp_path / "swish.py").write_text(edited)
    capsys.readouterr()
    assert main([*SWISH, "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "refusing to overwrite" in err and "--force" in err and "Traceback" not in err
    assert (tmp_path / "swish.py").read_text() == edited
    assert main([*SWISH, "-o", str(tmp_path), "--force"]) == 0
    assert "# my edit" not in (tmp_path / "swish.py").read_text()


def test_regenerating_identical_files_needs_no_force(tmp_path, capsys):
    assert main([*SWISH, "-o", str(tmp_path)]) == 0
    assert main([*SWISH, "-o", str(tmp_path)]) == 0
    assert "unchanged" in capsys.readouterr().out


def test_output_dir_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("mine")
    assert main([*SWISH, "-o", str(target)]) == 1
    assert "is not a directory" in capsys.readouterr().err
    assert target.read_text() == "mine"


def test_python_dash_m(tmp_path):
    result = subprocess.run([sys.executable, "-m", "scaffold", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("scaffold ")
    result = subprocess.run(
        [sys.executable, "-m", "scaffold", "new", "op", "--spec", str(SPECS / "swish.toml"), "-o", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "test_swish.py").exists()


def test_a_gradient_that_is_zero_everywhere_is_a_warning_not_an_error(tmp_path, capsys):
    """sign(x) generates (its gradient is 0 away from 0, as torch.sign's), and the user is told so."""
    code = main(["new", "op", "step_mix", "--forward", "sign(x) * y", "--tensor", "x", "--tensor", "y",
                 "--output-dir", str(tmp_path)])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    assert err.count("scaffold: warning:") == 1, err
    assert "gradient with respect to 'x' is zero everywhere: it enters only through sign(x)" in err
    assert 'hint: give it a straight-through gradient, [gradients] x = "grad" (--gradient x=grad)' in err
    assert (tmp_path / "step_mix.py").is_file()


def test_library_reports_a_zero_gradient_as_a_scaffold_warning():
    import warnings

    from scaffold import generate_op
    from scaffold.errors import ScaffoldWarning

    from .conftest import make_spec

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generate_op(make_spec("steps", "Heaviside(x) + y**2", {"x": {}, "y": {}}), time_limit=None)
        generate_op(make_spec("smooth", "x * y", {"x": {}, "y": {}}), time_limit=None)
    messages = [str(w.message) for w in caught if issubclass(w.category, ScaffoldWarning)]
    assert len(messages) == 1, messages
    assert messages[0].startswith("steps.toml: forward: the gradient with respect to 'x' is zero everywhere")


def test_an_unused_scalar_is_a_warning_not_an_error(tmp_path, capsys):
    code = main(["new", "op", "scaled", "--forward", "2 * x", "--tensor", "x", "--scalar", "alpha=0.5",
                 "--output-dir", str(tmp_path)])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    assert err.count("scaffold: warning:") == 1, err
    assert "the scalar argument 'alpha' is not used in the forward; the op still takes it" in err
    assert "hint: remove it from the spec (or the --scalar flag), or use it in the expression" in err
    assert "def scaled(x: torch.Tensor, alpha: float = 0.5)" in (tmp_path / "scaled.py").read_text()
