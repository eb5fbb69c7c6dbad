"""The runtime module (_scaffold_runtime.py): the machinery every generated op shares, written once beside the
ops, so that an op's module holds the op.

* standalone (`scaffold new op`), the same bytes for every op, written once per folder, never silently
  replaced where it differs (another scaffold's, or edited);
* in a project, once in the ops package (tests/test_project*.py run projects' tests);
* no op's module reads torch._C or imports scaffold; swish's module stays short.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest
import torch

from scaffold import generate_op, load_spec, write_files
from scaffold.cli import main
from scaffold.errors import WriteError
from scaffold.spec import RUNTIME_FILE, RUNTIME_MODULE

from .conftest import SPECS, make_spec

GOLDEN = Path(__file__).parent / "golden"

#: The bound on swish's module (non-blank lines): the op, not the machinery (issue 33: at most 110; 208 before
#: the runtime, 135 before the jvp became one sum and the double backward one line per term).
SWISH_LINES = 110

SPECS_OF_EVERY_KIND = {
    "elementwise": lambda: load_spec(SPECS / "swish.toml"),
    "custom gradient": lambda: load_spec(SPECS / "swish_custom.toml"),
    "several outputs": lambda: load_spec(SPECS / "split_and_transform.toml"),
    "structured": lambda: make_spec("op", "x - log(sum(exp(x), dim=-1, keepdim=True))", {"x": {"shape": [3, 4]}}),
    "custom op": lambda: make_spec("op", "x * tanh(x)", target="custom_op"),
    "structured custom op": lambda: make_spec(
        "op", "exp(x) / sum(exp(x), dim=-1, keepdim=True)", {"x": {"shape": [3, 4]}}, target="custom_op"
    ),
    "fused": lambda: make_spec("op", "x * sigmoid(x)", fuse=True),
    "structured fused": lambda: make_spec(
        "op", "exp(x) / sum(exp(x), dim=-1, keepdim=True)", {"x": {"shape": [3, 4]}}, fuse=True
    ),
}


def test_swish_holds_the_op_not_the_machinery():
    text = (GOLDEN / "swish.py").read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) <= SWISH_LINES, len(lines)
    for machinery in ("inspect.signature", "autocast(", "NoJvp", "Direct", "functionalize", "def _function"):
        assert machinery not in text, machinery


@pytest.mark.parametrize("kind", list(SPECS_OF_EVERY_KIND))
def test_no_op_module_reads_torch_private_names_or_imports_scaffold(kind):
    spec = SPECS_OF_EVERY_KIND[kind]()
    runtimes = set()
    for in_package in (False, True):
        files = generate_op(spec, time_limit=None, in_package=in_package, module_import="pkg.ops.op")
        module = files[f"{spec.name}.py"]
        tree = ast.parse(module)
        assert "torch._C" not in module and not any(
            isinstance(n, ast.Attribute) and ast.unparse(n) == "torch._C" for n in ast.walk(tree)
        )
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported |= {node.module or "."}
        assert not any(name.split(".")[0] == "scaffold" for name in imported), imported
        assert (RUNTIME_FILE in files) is not in_package
        runtimes |= {files[RUNTIME_FILE]} if not in_package else set()
    # the same runtime for every kind of op: the golden one
    assert runtimes == {(GOLDEN / RUNTIME_FILE).read_text()}


def test_a_second_op_finds_the_runtime_and_leaves_it(tmp_path):
    first = write_files(generate_op(load_spec(SPECS / "swish.toml")), tmp_path)
    second = write_files(generate_op(make_spec("softsign", "x / (1 + Abs(x))")), tmp_path)
    status = {w.path.name: w.status for w in first + second if w.path.name == RUNTIME_FILE}
    assert [w.status for w in first if w.path.name == RUNTIME_FILE] == ["created"]
    assert [w.status for w in second if w.path.name == RUNTIME_FILE] == ["unchanged"], status


def test_a_runtime_that_differs_is_not_replaced_without_force(tmp_path, capsys):
    # An older scaffold's runtime, or one the user edited: the ops already there import it.
    write_files(generate_op(load_spec(SPECS / "swish.toml")), tmp_path)
    runtime = tmp_path / RUNTIME_FILE
    edited = runtime.read_text() + "\n# mine: a note\n"
    runtime.write_text(edited)
    with pytest.raises(WriteError, match="it differs from the runtime this scaffold writes"):
        write_files(generate_op(make_spec("softsign", "x / (1 + Abs(x))")), tmp_path)
    assert runtime.read_text() == edited and not (tmp_path / "softsign.py").exists()
    assert main(["new", "op", "softsign", "--forward", "x / (1 + Abs(x))", "--tensor", "x", "-o", str(tmp_path)]) == 1
    assert "pass --force" in capsys.readouterr().err and runtime.read_text() == edited
    written = write_files(generate_op(make_spec("softsign", "x / (1 + Abs(x))")), tmp_path, force=True)
    assert [w.status for w in written if w.path.name == RUNTIME_FILE] == ["overwritten"]
    assert runtime.read_text() == (GOLDEN / RUNTIME_FILE).read_text()


def test_a_standalone_op_in_a_package_imports_the_runtime_beside_it(tmp_path, monkeypatch):
    # `scaffold new op -o mypkg/ops` where mypkg.ops is a package: the module imports the runtime relatively.
    package = tmp_path / "mypkg_runtime" / "ops"
    write_files(generate_op(make_spec("cube", "x**3")), package)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("mypkg_runtime.ops.cube")
    assert module._runtime.__name__ == f"mypkg_runtime.ops.{RUNTIME_MODULE}"
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(module.cube(x).sum(), x)
    torch.testing.assert_close(grad, 3 * x.detach() ** 2)
    for name in [m for m in sys.modules if m.startswith("mypkg_runtime")]:
        del sys.modules[name]


def test_the_runtime_is_reserved_as_an_op_name():
    from scaffold.errors import SpecError
    from scaffold.spec import RESERVED_OP_NAMES

    assert RUNTIME_MODULE in RESERVED_OP_NAMES
    with pytest.raises(SpecError):
        make_spec(RUNTIME_MODULE, "x")
