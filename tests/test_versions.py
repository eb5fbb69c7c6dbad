"""Generated code on every torch release scaffold claims, from the one release CI runs (2.13).

scripts/compat.py runs the generated tests under other releases; these tests pin, on CI's torch, the
mechanisms that make those releases right:

* torch.compile traces a Function's forward as written, with no in-place operation: torch 2.11's Dynamo
  loses the gradient of an output that an in-place operation wrote (pytorch#180642), so that swish's
  compiled gradients were off by 0.95 and 2.3 there while eager was right;
* torch's private checks (``torch._C._are_functorch_transforms_active``, ``torch._C._is_any_autocast_enabled``)
  sit behind one guarded helper, and an op still passes its own generated tests where torch lacks them.
"""

from __future__ import annotations

import ast
import inspect
import operator
import re
from pathlib import Path

import pytest
import torch

from scaffold import generate_op, load_spec, spec_from_mapping, write_files

from .conftest import SPECS, GeneratedRun, background_run, import_generated
from .structured_catalogue import STRUCTURED

GOLDEN = Path(__file__).parent / "golden"
_IN_PLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ipow}


def _dynamo_graphs(function, *inputs) -> list[torch.fx.GraphModule]:
    """The graphs Dynamo traces of ``function`` called on ``inputs`` (fullgraph: exactly one)."""
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module

    torch.compiler.reset()
    torch.compile(function, fullgraph=True, backend=backend)(*inputs)
    return graphs


def _in_place_nodes(graph_module: torch.fx.GraphModule) -> list[str]:
    """The in-place operations (``mul_``, ``sigmoid_``, ``+=``) of a graph."""
    found = []
    for node in graph_module.graph.nodes:
        if node.op == "call_method" and node.target.endswith("_") and not node.target.startswith("_"):
            found.append(node.target)
        elif node.op == "call_function":
            name = getattr(node.target, "__name__", "")
            if node.target in _IN_PLACE_OPERATORS or (name.endswith("_") and not name.startswith("_")):
                found.append(name)
    return found


def _forward_bodies(graph: torch.fx.GraphModule) -> dict[str, torch.fx.GraphModule]:
    """The subgraphs Dynamo traced of autograd.Functions' forwards (``fwd_body_0``, ...)."""
    return {
        name: module
        for name, module in graph.named_modules()
        if name.startswith("fwd_body") and isinstance(module, torch.fx.GraphModule)
    }


@pytest.mark.parametrize("spec_name", ["swish", "smooth_l1"])
def test_compile_traces_the_forward_out_of_place(tmp_path, spec_name):
    spec = load_spec(SPECS / f"{spec_name}.toml")
    module = import_generated(tmp_path, spec)
    function = getattr(module, module.__all__[1])  # NAMEFunction
    # The Function's own forward reuses its temporaries in eager: the twin torch.compile traces must not.
    assert re.search(r"\.[a-z]+_\(", inspect.getsource(function.forward))
    torch.manual_seed(0)
    inputs = [torch.randn(4, 5, dtype=torch.float64, requires_grad=True)]
    if spec_name == "swish":
        inputs.append(torch.tensor(0.7, dtype=torch.float64, requires_grad=True))
    else:
        inputs.append(torch.randn(4, 5, dtype=torch.float64, requires_grad=True))
    op = getattr(module, spec.name)

    (graph,) = _dynamo_graphs(op, *inputs)
    bodies = _forward_bodies(graph)
    assert bodies, "Dynamo traced no autograd.Function forward"
    for name, body in bodies.items():
        assert _in_place_nodes(body) == [], f"{name} computes in place:\n{body.code}"

    def gradients(function):
        out = function(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        return torch.autograd.grad(out.sum(), inputs)

    torch.compiler.reset()
    compiled = gradients(torch.compile(op, fullgraph=True, backend="aot_eager"))
    for got, expected in zip(compiled, gradients(op)):
        torch.testing.assert_close(got, expected)


def test_an_op_whose_forward_has_nothing_to_reuse_keeps_the_plain_twin(tmp_path):
    spec = spec_from_mapping({"name": "plain_square", "forward": "x**2", "tensors": {"x": {}}}, source="x.toml")
    text = generate_op(spec)["plain_square.py"]
    assert "_apply = _runtime.dispatcher(PlainSquareFunction)\n" in text and "def _forward" not in text


def test_private_torch_names_are_read_in_one_guarded_place():
    # in the runtime that every op imports (no op's module reads torch._C: test_runtime.py)
    tree = ast.parse((GOLDEN / "_scaffold_runtime.py").read_text())
    (helper,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "_torch_private"]
    in_helper = {id(node) for node in ast.walk(helper)}
    private = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and ast.unparse(node.value) == "torch"
    ]
    assert private and all(name == "torch._C" for name in private), private
    outside = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and ast.unparse(n) == "torch._C" and id(n) not in in_helper
    ]
    assert outside == [], f"torch._C is read outside _torch_private, on lines {outside}"


#: conftest.py of a generated op's folder: the op's module is imported while torch._C lacks the private
#: checks, which are then put back (torch's own modules read them).
_WITHOUT_PRIVATE_NAMES = """\
import importlib

import torch

NAMES = ("_are_functorch_transforms_active", "_is_any_autocast_enabled")
saved = {{name: getattr(torch._C, name) for name in NAMES}}
for name in NAMES:
    delattr(torch._C, name)
try:
    op = importlib.import_module("{name}")
finally:
    for name, value in saved.items():
        setattr(torch._C, name, value)
assert op._runtime.transforms_active is not torch._C._are_functorch_transforms_active
"""


def _layer_norm():
    (entry,) = [op for op in STRUCTURED if op.name == "layer_norm"]
    return spec_from_mapping(entry.mapping(), source="layer_norm.toml")


def _without_private_checks(folder: Path, which: str) -> GeneratedRun:
    spec = load_spec(SPECS / "swish.toml") if which == "swish" else _layer_norm()
    write_files(generate_op(spec), folder)
    (folder / "conftest.py").write_text(_WITHOUT_PRIVATE_NAMES.format(name=spec.name))
    return GeneratedRun(folder, ("-k", "cpu or module", "-rfEs", "--tb=short"))


@pytest.mark.parametrize("which", ["swish", "layer_norm"])
@background_run(_without_private_checks)
def test_an_op_passes_its_own_tests_without_torchs_private_checks(which, background_results):
    result = background_results
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
