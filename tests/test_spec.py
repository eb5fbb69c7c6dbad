"""Specs: TOML and flags give the same validated OpSpec; bad specs fail at the edge."""

from __future__ import annotations

import ast
import builtins
import subprocess
import sys
from pathlib import Path

import pytest

import scaffold.testing
from scaffold import compile_op, generate_op, load_spec, spec_from_flags, write_files
from scaffold.errors import ScaffoldWarning, SpecError
from scaffold.spec import (
    RESERVED_ARGUMENT_NAMES,
    RESERVED_OP_NAMES,
    RUNTIME_FILE,
    STANDARD_MODULES,
    TEST_RUNTIME_PACKAGES,
    ScalarArg,
    TensorArg,
    camel_case,
    spec_to_toml,
)

from .conftest import SPECS, GeneratedRun, background_run, make_spec


def test_camel_case():
    assert camel_case("leaky_relu") == "LeakyRelu"
    assert camel_case("swish2") == "Swish2"
    assert camel_case("smooth_l1") == "SmoothL1"


def test_toml_spec_is_read_in_declaration_order():
    spec = load_spec(SPECS / "quadratic.toml")
    assert [t.name for t in spec.tensors] == ["x", "a", "b", "c"]
    assert [t.shape for t in spec.tensors] == [(4, 5), (5,), (4, 1), ()]
    assert spec.source == "quadratic.toml"


def test_flags_give_the_spec_a_file_gives():
    spec = spec_from_flags(
        "swish", "x / (1 + exp(-beta * x))", ["x=4,5"], ["alpha=0.5", "n:int=3", "flag=true"], learnable=["beta=1.0"]
    )
    assert spec.tensors == (TensorArg("x", (4, 5)), TensorArg("beta", (), learnable=True, init=1.0))
    assert spec.scalars == (ScalarArg("alpha", "float", 0.5), ScalarArg("n", "int", 3), ScalarArg("flag", "bool", True))
    assert spec_from_flags("op", "x", ["x=[]"]).tensors[0].shape == ()


def test_spec_round_trips_through_toml(tmp_path):
    spec = spec_from_flags("op", "x * alpha + beta", ["x=3"], ["alpha=0.5"], learnable=["beta=2.0"])
    path = tmp_path / "op.toml"
    path.write_text(spec_to_toml(spec))
    again = load_spec(path)
    assert (again.name, again.forward, again.tensors, again.scalars) == (
        spec.name,
        spec.forward,
        spec.tensors,
        spec.scalars,
    )


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('forward = "x"\n[tensors.x]\n', "missing required key 'name'"),
        ('name = "op"\nforward = "x"\n', "the op has no tensor arguments"),
        ('name = "op"\nforward = "x"\ncolour = 1\n[tensors.x]\n', "unknown key 'colour'"),
        ('name = "op"\nforward = "x"\n[tensors.x]\nshape = [0]\n', "shape must be a list of positive integers"),
        ('name = "op"\nforward = "x"\n[tensors.x]\ndomain = [1.0, -1.0]\n', "low < high"),
        ('name = "op"\nforward = "x"\n[tensors.x]\ninit = 1.0\n', "init is only used for learnable tensors"),
        ('name = "op"\nforward = "x*a"\n[tensors.x]\n[scalars.a]\ntype = "int"\ndefault = 0.5\n', "is not a int"),
        ('name = "op"\nforward = "x*a"\n[tensors.x]\n[scalars.a]\ntype = "complex"\ndefault = 1\n', "type must be"),
        ('name = "op"\nforward = "x"\n[tensors.x]\n[scalars.x]\ndefault = 1\n', "declared twice"),
        ('name = "op"\nforward = 3\n[tensors.x]\n', "forward must be a string"),
        (
            'name = "op"\nforward = "x*w"\n[tensors.x]\nshape = [32, 64, 10, 10]\n[tensors.w]\nshape = [64, 10]\n',
            r"tensors\.w\.shape: the example shapes of x \[32, 64, 10, 10\] and w \[64, 10\] do not broadcast "
            r"together: dimension -2 \(counted from the right\) is 10 in x and 64 in w",
        ),
    ],
)
def test_bad_specs(tmp_path, toml, message):
    path = tmp_path / "op.toml"
    path.write_text(toml)
    with pytest.raises(SpecError, match=message) as info:
        load_spec(path)
    assert str(info.value).startswith("op.toml")


def test_domains_are_inferred_from_the_expression():
    def domain(forward, scalars=()):
        (d,) = compile_op(spec_from_flags("op", forward, ["x"], list(scalars))).domains
        return d.low, d.high, d.avoid

    assert domain("x * tanh(x)") == (-3.0, 3.0, ())
    assert domain("log(x)")[0] > 0
    low, high, _ = domain("atanh(x)")
    assert -1 < low < high < 1
    assert domain("acosh(2 * x - 1)")[0] > 1
    assert domain("log1p(x)")[0] > -1
    assert domain("log(x**2 + 1)") == (-3.0, 3.0, ())  # positive everywhere: no restriction
    assert domain("Abs(x - 1)")[2] == (1.0,)
    assert domain("Max(x, alpha)", ["alpha=0.5"])[2] == (0.5,)
    assert domain("Piecewise((x, x > -1), (0, True))")[2] == (-1.0,)
    assert domain("1 / x")[2] == (0.0,)
    low, high, _ = domain("tan(x)")  # between the poles at -pi/2 and pi/2
    assert -1.57 < low < high < 1.57
    low, high, _ = domain("cot(2 * x)")  # between the poles at 0 and pi/2
    assert 0 < low < high < 1.57
    low, high, _ = domain("logit(x)")  # found numerically
    assert 0 < low < high < 1
    low, high, _ = domain("log(log(log(x)))")  # needs x > e
    assert low > 2.72


def test_domains_of_several_tensors_are_repaired_together():
    spec = spec_from_flags("op", "log(cos(x * y))", ["x", "y"])
    x, y = compile_op(spec).domains
    assert max(abs(x.low), abs(x.high)) * max(abs(y.low), abs(y.high)) < 1.57


@pytest.mark.parametrize(
    ("tensors", "scalars", "bad"),
    [
        (["x", "sum"], [], "sum"),  # jvp calls sum()
        (["x", "terms"], [], "terms"),  # jvp's list of terms
        (["x", "out"], [], "out"),  # the saved output in backward
        (["x", "grad_x"], [], "grad_x"),  # x's gradient
        (["x"], ["x_shape=1.0"], "x_shape"),  # ctx.x_shape
        (["x"], ["needs_input_grad=1.0"], "needs_input_grad"),  # scalars are ctx attributes
    ],
)
def test_names_the_generated_code_uses_are_refused(tensors, scalars, bad):
    forward = " * ".join([*tensors, *(s.split("=")[0] for s in scalars)])
    with pytest.raises(SpecError, match=f"argument name '{bad}' is used by the generated code itself"):
        spec_from_flags("op", forward, tensors, scalars)


@pytest.mark.parametrize("name", ["nn", "reference", "OP", "scaffold_testing", "torch", "device"])
def test_op_names_that_would_shadow_what_the_generated_code_uses(name):
    with pytest.raises(SpecError, match=f"op name '{name}' would shadow"):
        spec_from_flags(name, "x", ["x"])


@pytest.mark.parametrize("name", ["inspect", "copy", "random", "types", "warnings", "numpy", "networkx"])
def test_op_names_of_modules_the_generated_tests_import_are_refused(name):
    # The op's module NAME.py sits on sys.path where its tests run: `inspect` was generated, then its tests
    # failed with "partially initialized module 'inspect'".
    with pytest.raises(SpecError, match=f"op name '{name}' is also the name of .* {name}, which the generated") as info:
        spec_from_flags(name, "x", ["x"])
    assert info.value.hint == f"try 'my_{name}'"


def _imported_modules(text: str) -> set[str]:
    """The top-level modules that ``text`` imports, anywhere in it (relative imports aside)."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_every_module_the_generated_files_import_is_refused_as_an_op_name():
    learnable = {"x": {}, "w": {"learnable": True, "init": 1.0}}
    specs = [
        make_spec("op", "sqrt(x) + x**n*w + log(2)*Max(x, 0)", learnable, {"n": {"type": "float", "default": 2.5}}),
        make_spec("op", "x * sigmoid(beta * x)", {"x": {}, "beta": {"learnable": True, "init": 1.0}}, fuse=True),
        make_spec("op", "x - log(sum(exp(x), dim=-1, keepdim=True))", {"x": {"shape": [3, 4]}}),
        make_spec("op", "exp(x) / sum(exp(x), dim=-1, keepdim=True)", {"x": {"shape": [3, 4]}}, fuse=True),
        make_spec("op", "x * tanh(x)", target="custom_op"),
        make_spec("op", "Abs(x)", gradients={"x": "grad"}),
    ]
    texts = [Path(scaffold.testing.__file__).read_text()]  # vendored into projects as tests/scaffold_testing.py
    for spec in specs:
        texts += generate_op(spec, time_limit=None).values()
        texts += generate_op(spec, time_limit=None, module_import="pkg.ops.op", shared_device_fixture=True).values()
    # The op's own module aside (op, pkg.ops.op), and __future__: an op name starts with a letter.
    imported = set().union(*map(_imported_modules, texts)) - {"op", "pkg", "__future__"}
    assert {"torch", "inspect", "math", "pytest", "scaffold"} <= imported
    refused = RESERVED_OP_NAMES | STANDARD_MODULES | TEST_RUNTIME_PACKAGES
    assert imported <= refused, imported - refused


def test_every_package_the_generated_tests_load_is_refused_as_an_op_name():
    # What a generated test file imports, and what torch imports for torch.compile and torch.func: every module
    # found on sys.path (where an op's module could shadow it). Modules the interpreter loaded at start-up (a
    # site-packages .pth file may import certifi, say) are not counted: they are loaded before the op's folder
    # is on sys.path, and differ between machines.
    code = """
import importlib.machinery, sys
before = set(sys.modules)
import pytest, torch, torch._dynamo, torch._inductor.compile_fx, torch.func
import scaffold.testing
found = {m.split(".")[0] for m in set(sys.modules) - before}
print(" ".join(sorted(m for m in found if importlib.machinery.PathFinder.find_spec(m) is not None)))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    loaded = {m for m in done.stdout.split() if not m.startswith("_")} - {"scaffold"}
    refused = STANDARD_MODULES | TEST_RUNTIME_PACKAGES
    assert "numpy" in loaded and loaded <= refused, loaded - refused


def test_every_name_the_generated_test_file_defines_is_a_reserved_op_name():
    # The test file imports the op's function by the op's name: a helper of the same name replaces it.
    spec = spec_from_flags("op", "sqrt(x) + x**n", ["x"], ["n=2.5"])
    tree = ast.parse(generate_op(spec)["test_op.py"])
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets}
    public = {n for n in defined if not n.startswith(("_", "test_"))}
    assert public and public <= RESERVED_OP_NAMES, public - RESERVED_OP_NAMES


_SCOPES = (ast.FunctionDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _own_nodes(scope: ast.AST):
    """The nodes of ``scope`` outside the scopes nested in it (a comprehension's first iterable is outside)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))
        elif not isinstance(node, (ast.FunctionDef, ast.Lambda)):
            stack.append(node.generators[0].iter)


def test_no_scope_that_calls_the_op_has_a_local_of_an_allowed_op_name():
    # Inside a function or comprehension with a local (or parameter) named like the op, the op's name is
    # that local: an op named `out` made assert_matches_reference fail with UnboundLocalError.
    names = set()
    for fuse in (False, True):
        tensors = {"x": {"shape": [3]}, "w": {"learnable": True, "init": 1.0}}
        spec = make_spec("op", "sqrt(x) + x**n*w", tensors, {"n": {"type": "float", "default": 2.5}}, fuse=fuse)
        for text in generate_op(spec, time_limit=None).values():
            for scope in ast.walk(ast.parse(text)):
                if not isinstance(scope, _SCOPES):
                    continue
                nodes = list(_own_nodes(scope))
                if any(isinstance(n, ast.Name) and n.id == "op" and isinstance(n.ctx, ast.Load) for n in nodes):
                    names |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                    if isinstance(scope, (ast.FunctionDef, ast.Lambda)):
                        names |= {a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg)}
    # Today no generated scope calls the op by name (the test file holds it in OP, the Module calls
    # _function()); a template that starts to must reserve that scope's locals.
    public = {n for n in names if n[:1].isalpha()}
    assert public <= RESERVED_OP_NAMES, public - RESERVED_OP_NAMES


def _threshold(folder: Path) -> GeneratedRun:
    # As PyTorch's own F.threshold(x, threshold, value): the argument shadows the op only where it is taken.
    # The tensor threshold enters only through a comparison: autograd of the reference has no gradient for
    # it (the generated tests take it as 0, as the op's is, with a warning at generation).
    spec = make_spec("threshold", "Piecewise((x, x > threshold), (value, True))", {"x": {}, "threshold": {}},
                     {"value": {"type": "float", "default": 0.0}})  # fmt: skip
    with pytest.warns(ScaffoldWarning, match="'threshold' is zero everywhere"):
        write_files(generate_op(spec, time_limit=None), folder)
    return GeneratedRun(folder)


@background_run(_threshold)
def test_the_op_may_share_an_arguments_name(background_results):
    result = background_results
    assert result.returncode == 0, result.stdout[-3000:]


def test_every_builtin_the_generated_code_calls_is_a_reserved_name():
    spec = spec_from_flags(
        "op", "Piecewise((x * alpha, x > 0), (log(1 + exp(x)) * y, True))", ["x", "y"], ["alpha=2.0"]
    )
    used = set()
    # The runtime aside: no argument of the op reaches its scopes.
    for path, text in generate_op(spec).items():
        if path == RUNTIME_FILE:
            continue
        tree = ast.parse(text)
        # Annotations are strings (from __future__ import annotations): an argument named `type` shadows none.
        annotations = [a for n in ast.walk(tree) for a in (getattr(n, "annotation", None), getattr(n, "returns", None))]
        in_annotations = {id(n) for a in annotations if a is not None for n in ast.walk(a)}
        names = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in in_annotations]
        used |= {n.id for n in names if hasattr(builtins, n.id)}
    assert used and used <= RESERVED_ARGUMENT_NAMES, used - RESERVED_ARGUMENT_NAMES


def test_every_attribute_of_the_autograd_ctx_is_a_reserved_name():
    import torch

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, grad):
            return 2 * grad

    ctx = Twice.apply(torch.ones(1, requires_grad=True)).grad_fn
    public = {a for a in dir(ctx) if not a.startswith("_")}
    assert public <= RESERVED_ARGUMENT_NAMES, public - RESERVED_ARGUMENT_NAMES


def test_spec_with_flags_adds_and_replaces_arguments_by_name():
    from scaffold.spec import spec_from_flags, spec_with_flags

    spec = spec_from_flags("swish", "x * sigmoid(beta * x)", ["x=3"], learnable=["beta=1.0"], doc="mine")
    changed = spec_with_flags(spec, forward="x * sigmoid(beta * x) * gamma", learnable=["gamma=2.0"], tensors=["x=2,3"])
    assert changed.forward == "x * sigmoid(beta * x) * gamma" and changed.doc == "mine"
    assert [(t.name, t.shape, t.learnable, t.init) for t in changed.tensors] == [
        ("x", (2, 3), False, None),
        ("beta", (), True, 1.0),
        ("gamma", (), True, 2.0),
    ]
    as_scalar = spec_with_flags(spec, scalars=["beta=0.5"])
    assert [t.name for t in as_scalar.tensors] == ["x"]
    assert [(s.name, s.default) for s in as_scalar.scalars] == [("beta", 0.5)]
    assert spec_with_flags(spec) == spec


def test_spec_with_flags_changes_only_what_the_flag_names():
    from scaffold.spec import spec_from_flags, spec_with_flags

    spec = spec_from_flags("swish", "x * sigmoid(beta * x)", ["x=3"], learnable=["beta=0.5"])
    spec = spec_with_flags(spec, tensors=["x=4,3"])
    spec = spec_with_flags(spec, tensors=["beta=3"])  # a new shape; still learnable, with its init
    assert [(t.name, t.shape, t.learnable, t.init) for t in spec.tensors] == [
        ("x", (4, 3), False, None),
        ("beta", (3,), True, 0.5),
    ]
