"""``target = "custom_op"``: the op as a torch.library custom op built on its generated Function.

* ``test_generated_tests_pass``: a set of catalogue ops that between them have broadcasting, float, int and
  bool scalars, several outputs, custom gradients, masks, a forward that may return its input, and
  structured ops that keep intermediates (layer_norm, attention) generated as custom ops; their generated
  tests (opcheck among them) run in one pytest subprocess.
* the rest, in this process: what the custom op is (its name, namespace, registrations), that its vmap rule
  batches in one call, that wrong math fails the generated tests, and the spec's and CLI's messages.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import re
import warnings
from pathlib import Path

import pytest
import torch

from scaffold import ScaffoldError, compile_op, generate_op, spec_from_mapping
from scaffold.batching import batching
from scaffold.cli import main

try:
    from .catalogue import OPS
    from .conftest import BackgroundPytest
    from .structured_catalogue import STRUCTURED
    from .test_outputs import MULTI_OUTPUT_OPS
except ImportError:  # tests/ run as a plain folder, not a package
    from catalogue import OPS
    from conftest import BackgroundPytest
    from structured_catalogue import STRUCTURED
    from test_outputs import MULTI_OUTPUT_OPS

#: Between them: broadcasting (quadratic), float, int and bool scalars (huber, power, flip_sign), an
#: intermediate the Function would keep (huber, lerp), masks (leaky_relu), several outputs, custom
#: gradients (straight-through), and structured ops with hidden outputs (layer_norm, attention, linear_relu)
#: or none (amax_rows), several outputs (mean_variance).
NAMES = [
    "swish", "quadratic", "huber", "power", "flip_sign", "lerp", "leaky_relu", "softplus", "swish_gate",
    "identity_and_square", "sign_and_abs", "sign_ste", "layer_norm", "attention", "linear_relu", "mean_variance",
    "soft_cross_entropy", "amax_rows", "gram",
]  # fmt: skip
#: Not in the catalogues: several outputs (one the input itself), custom gradients (test_outputs.py's).
EXTRA = {name: MULTI_OUTPUT_OPS[name] for name in ("swish_gate", "identity_and_square", "sign_and_abs")}
EXTRA["sign_ste"] = dict(forward="sign(x)", tensors={"x": {}}, gradients={"x": "grad*Heaviside(1 - Abs(x))"})
_BY_NAME = {op.name: op.mapping() for op in [*OPS, *STRUCTURED]} | {n: {"name": n, **m} for n, m in EXTRA.items()}
_counter = itertools.count()


def _spec(name: str, **changes):
    return spec_from_mapping({**_BY_NAME[name], "target": "custom_op", **changes}, source="catalogue")


def _import(path: Path):
    module_spec = importlib.util.spec_from_file_location(f"_custom_op_{path.stem}_{next(_counter)}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _generated(tmp_path: Path, spec) -> object:
    for path, text in generate_op(spec, time_limit=None).items():
        (tmp_path / path).write_text(text, encoding="utf-8")
    return _import(tmp_path / f"{spec.name}.py")


def test_the_set_has_its_cases():
    assert all(name in _BY_NAME for name in NAMES), [n for n in NAMES if n not in _BY_NAME]
    specs = [_spec(name) for name in NAMES]
    assert any(s.gradients for s in specs) and any(len(s.outputs) > 1 for s in specs)
    assert {s.type for spec in specs for s in spec.scalars} >= {"float", "int", "bool"}


@pytest.fixture(scope="module")
def generated_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("custom_ops")
    for name in NAMES:
        for path, text in generate_op(_spec(name, namespace="scaffold_tests")).items():
            (folder / path).write_text(text, encoding="utf-8")
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    run = BackgroundPytest(folder, "--tb=short", "-rs", str(folder))
    yield folder, run
    run.close()


def test_generated_tests_pass(generated_folder):
    """Every op's generated tests, opcheck among them: each ran (not skipped) and passed."""
    _, run = generated_folder
    result = run.wait()
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-80:])
    assert result.returncode == 0, f"generated tests failed (exit {result.returncode}):\n{tail}"
    for name in NAMES:
        assert f"test_{name}.py::test_opcheck" not in result.stdout, f"{name}: opcheck was skipped"
    assert "cannot differentiate a torch.library custom op" in result.stdout  # the skips say why


def test_the_op_is_the_custom_op(tmp_path: Path):
    module = _generated(tmp_path, _spec("swish", namespace="scaffold_tests_a"))
    assert isinstance(module.swish, torch._library.custom_ops.CustomOpDef)
    assert module.swish._qualname == "scaffold_tests_a::swish"
    assert torch.ops.scaffold_tests_a.swish.default is not None
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    beta = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(module.swish, (x, beta))
    # its autograd is the Function's: the same gradients, and a derived second derivative
    (grad,) = torch.autograd.grad(module.swish(x, beta).sum(), x, create_graph=True)
    (expected,) = torch.autograd.grad(module.SwishFunction.apply(x, beta).sum(), x, create_graph=True)
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)
    assert torch.autograd.gradgradcheck(module.swish, (x, beta))
    # the Module calls the op: the graph's node is the custom op's
    out = module.Swish()(x)
    assert "CustomOp" in type(out.grad_fn).__name__ or "swish" in type(out.grad_fn).__name__.lower()


def test_autocast_computes_in_float32(tmp_path: Path):
    module = _generated(tmp_path, _spec("swish", namespace="scaffold_tests_b"))
    x = torch.randn(8, dtype=torch.bfloat16, requires_grad=True)
    beta = torch.tensor(1.0, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module.swish(x, beta)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and beta.grad.dtype == torch.float32
    assert torch.isfinite(x.grad.float()).all()


def test_a_structured_op_keeps_its_intermediates_behind_the_functional(tmp_path: Path):
    """layer_norm keeps mu and rsqrt for backward: layer_norm_op returns them, layer_norm drops them."""
    module = _generated(tmp_path, _spec("layer_norm", namespace="scaffold_tests_c"))
    assert isinstance(module.layer_norm_op, torch._library.custom_ops.CustomOpDef)
    assert not isinstance(module.layer_norm, torch._library.custom_ops.CustomOpDef)
    inputs = [torch.randn(t.shape, dtype=torch.float64) for t in _spec("layer_norm").tensors]
    assert isinstance(module.layer_norm(*inputs), torch.Tensor)
    assert len(module.layer_norm_op(*inputs)) == 3
    torch.testing.assert_close(module.layer_norm(*inputs), module.layer_norm_op(*inputs)[0])


def test_an_elementwise_custom_op_returns_its_intermediate_as_a_structured_one_does(tmp_path: Path):
    """huber's Function keeps input - target as a hidden output; on the one pipeline its custom op returns it
    too (as layer_norm_op returns mu and rsqrt, above), and huber drops it, so that huber returns exactly
    what the functional does."""
    function = generate_op(spec_from_mapping(_BY_NAME["huber"], source="x"), time_limit=None)["huber.py"]
    assert "return out, tmp0" in function and "ctx.save_for_backward(tmp0)" in function
    module = _generated(tmp_path, _spec("huber", namespace="scaffold_tests_d"))
    x, t = torch.randn(2, 4, 5, dtype=torch.float64)
    out, difference = module.huber_op(x, t)
    torch.testing.assert_close(difference, x - t)
    assert isinstance(module.huber(x, t), torch.Tensor)
    torch.testing.assert_close(module.huber(x, t), out)
    torch.testing.assert_close(out, torch.nn.functional.huber_loss(x, t, reduction="none", delta=1.5))


def test_the_vmap_rule_batches_in_one_call(tmp_path: Path):
    """vmap over inputs batched at different dimensions (and one not batched), against a loop; the rule
    runs, not PyTorch's per-item fallback (which warns)."""
    module = _generated(tmp_path, _spec("quadratic", namespace="scaffold_tests_e"))
    x, a, b, c = (torch.randn(*s, dtype=torch.float64) for s in [(4, 3, 5), (3, 5), (4, 1), (3,)])
    calls = []
    batch_first = module._batch_first
    module._batch_first = lambda *args: (calls.append(args[1]), batch_first(*args))[1]
    out = torch.func.vmap(module.quadratic, in_dims=(1, 0, None, 0))(x, a, b, c)
    loop = torch.stack([module.quadratic(x[:, i], a[i], b, c[i]) for i in range(3)])
    torch.testing.assert_close(out, loop)
    assert calls == [1, 0, None, 0]  # one call of the rule for the whole batch


def test_a_wrong_backward_fails_the_generated_tests(tmp_path: Path):
    """The custom op's backward (the Function's) scaled by 1.01: gradcheck and the reference comparison
    fail; opcheck alone would not (it checks registrations, not the math)."""
    spec = _spec("swish", namespace="scaffold_tests_f")
    files = generate_op(spec, time_limit=None)
    source = files["swish.py"]
    scaled = re.sub(
        r"^        return (_gradients\(.*\))$",
        r"        return tuple(None if g is None else 1.01 * g for g in \1)",
        source,
        flags=re.M,
    )
    assert scaled != source
    files["swish.py"] = scaled
    for path, text in files.items():
        (tmp_path / path).write_text(text, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    result = BackgroundPytest(tmp_path, "-k", "gradcheck or reference or opcheck", str(tmp_path)).wait()
    assert "FAILED test_swish.py::test_gradcheck" in result.stdout, result.stdout[-3000:]
    assert "FAILED test_swish.py::test_matches_reference" in result.stdout
    assert "FAILED test_swish.py::test_opcheck" not in result.stdout


def test_the_namespace_is_the_projects_package():
    files = generate_op(_spec("swish"), module_import="myops.ops.swish", time_limit=None)
    assert '@torch.library.custom_op("myops::swish", mutates_args=())' in files["swish.py"]
    files = generate_op(_spec("swish"), time_limit=None)
    assert '@torch.library.custom_op("scaffold::swish", mutates_args=())' in files["swish.py"]
    files = generate_op(_spec("swish", namespace="mine"), module_import="myops.ops.swish", time_limit=None)
    assert '@torch.library.custom_op("mine::swish", mutates_args=())' in files["swish.py"]


def test_the_function_target_is_unchanged():
    spec = spec_from_mapping(_BY_NAME["swish"], source="catalogue")
    assert spec.target == "function"
    text = generate_op(spec, time_limit=None)["swish.py"]
    assert "torch.library" not in text and "custom_op" not in text
    assert generate_op(dataclasses.replace(spec, target="function"), time_limit=None)["swish.py"] == text


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"target": "library"}, "target must be one of 'function', 'custom_op', got 'library'"),
        ({"target": "custom_op", "namespace": "aten"}, "namespace 'aten' belongs to PyTorch's own operators"),
        ({"target": "custom_op", "namespace": "my-ops"}, "namespace 'my-ops' is not a valid name"),
        ({"namespace": "mine"}, "namespace names a custom op's namespace, and the target is not custom_op"),
    ],
)
def test_bad_targets_are_refused(changes, message):
    with pytest.raises(ScaffoldError) as info:
        spec_from_mapping({**_BY_NAME["swish"], **changes}, source="ops.toml")
    assert message in str(info.value)


def test_the_cli_flags(tmp_path: Path, capsys):
    flags = ["new", "op", "swish", "--forward", "x / (1 + exp(-beta * x))", "--tensor", "x", "--learnable", "beta"]
    assert main([*flags, "--target", "custom_op", "--namespace", "demo", "--output-dir", str(tmp_path)]) == 0
    assert '@torch.library.custom_op("demo::swish"' in (tmp_path / "swish.py").read_text(encoding="utf-8")
    with pytest.raises(SystemExit):
        main([*flags, "--target", "lib"])
    assert "invalid choice: 'lib'" in capsys.readouterr().err
    # flags over a spec file's keys
    (tmp_path / "swish.toml").write_text(
        'name = "swish"\nforward = "x / (1 + exp(-x))"\n[tensors.x]\n', encoding="utf-8"
    )
    args = ["new", "op", "--spec", str(tmp_path / "swish.toml"), "--output-dir", str(tmp_path / "b")]
    assert main([*args, "--target", "custom_op"]) == 0
    assert '@torch.library.custom_op("scaffold::swish"' in (tmp_path / "b" / "swish.py").read_text(encoding="utf-8")


def test_a_fused_custom_op_stays_compiled_through_opcheck(tmp_path: Path):
    """opcheck traces backward with fake tensors: the fused op runs its eager code there, without compiling
    (which fails inside a tracer) and without giving up compiling for real tensors of that kind."""
    module = _generated(tmp_path, _spec("swish", namespace="scaffold_tests_g", fuse=True))
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    beta = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*torch.compile failed")
        torch.library.opcheck(module.swish, (x, beta))
        grads = torch.autograd.grad(module.swish(x, beta).sum(), (x, beta))
    expected = torch.autograd.grad(module.SwishFunction.apply(x, beta).sum(), (x, beta))
    torch.testing.assert_close(grads, expected)
    assert module._fused_backward.compiled and None not in module._fused_backward.compiled.values()


# --- the one path (rules -> dataflow -> program_op.py.j2), elementwise ops and structured ones ------------


def _structured(tmp_path: Path, spec) -> object:
    """The op generated (rules -> dataflow -> program_op.py.j2, as every op is), elementwise or not."""
    return _generated(tmp_path, spec)


def _one_calls(module) -> list:
    """Records the vmap rule's one-call batches: each _batch_first call's batch dimension."""
    calls = []
    batch_first = module._batch_first
    module._batch_first = lambda *args: (calls.append(args[1]), batch_first(*args))[1]
    return calls


def _vmap_against_loop(op, inputs: list[torch.Tensor], in_dims: tuple) -> tuple:
    """vmap over a batch of 3 in ``in_dims`` (None: that input is not batched; 1 for a 0-dim one: 0)
    against a loop of the op; the in_dims it used."""
    in_dims = tuple(None if d is None else min(d, x.dim()) for x, d in zip(inputs, in_dims))
    batched = [x if d is None else torch.stack([x + k for k in range(3)], dim=d) for x, d in zip(inputs, in_dims)]
    out = torch.func.vmap(op, in_dims=in_dims)(*batched)
    items = [op(*(x if d is None else x.select(d, k) for x, d in zip(batched, in_dims))) for k in range(3)]
    if isinstance(out, tuple):
        expected = tuple(torch.stack(o) for o in zip(*items))
    else:
        expected = torch.stack(items)
    torch.testing.assert_close(out, expected, msg=lambda m: f"in_dims={in_dims}: {m}")
    return in_dims


@pytest.mark.parametrize("name", ["quadratic", "swish_gate", "leaky_relu", "huber"])
def test_an_elementwise_op_through_the_structured_path_batches_in_one_call(tmp_path: Path, name: str):
    """The rule of the elementwise path: inputs batched at any dimension, or not, one call of the op; also
    where the op returns hidden outputs (leaky_relu's mask, huber's input - target) that read every input."""
    module = _structured(tmp_path, _spec(name, namespace=f"scaffold_tests_s{name}"))
    assert "_ONE_CALL" not in vars(module)  # the elementwise rule, which needs no check at call time
    inputs = [torch.randn(t.shape, dtype=torch.float64) for t in _spec(name).tensors]
    n = len(inputs)
    for in_dims in [(0,) * n, (1,) * n] + ([(None,) + (0,) * (n - 1)] if n > 1 else []):
        calls = _one_calls(module)
        assert calls == list(_vmap_against_loop(getattr(module, name), inputs, in_dims)), in_dims


#: Structured ops whose every step keeps a leading batch dimension first (dims counted from the end,
#: products of matrices), and the cases one call computes: (a) all of them, (b) some (a batched vector
#: operand of ``@`` must stay a vector; a transpose(weight, 0, 1) counts from the front; a hidden output
#: must be batched too: layer_norm's mu and rsqrt read x alone, div's 1/y reads y alone).
_BATCHED = {
    "softmax_textbook": [(True,)],
    "layer_norm": [(True, False, False), (True, False, True), (True, True, False), (True, True, True)],
    "div": [(False, True), (True, True)],
    "attention": [c for c in itertools.product((False, True), repeat=3) if any(c)],
    "matvec": [(True, False)],
    "linear_gelu_learned": [(False, False, True), (True, False, False), (True, False, True)],
}


@pytest.mark.parametrize("name", sorted(_BATCHED))
def test_a_structured_op_batches_in_one_call_where_that_is_right(tmp_path: Path, name: str):
    """vmap against a loop, inputs batched at dimension 0, at 1, and one not batched: one call of the op in
    the cases the rule lists, one call per item in the others; either way the loop's result."""
    module = _structured(tmp_path, _spec(name, namespace=f"scaffold_tests_b{name}"))
    assert sorted(module._ONE_CALL) == sorted(_BATCHED[name])
    inputs = [torch.randn(t.shape, dtype=torch.float64) for t in _spec(name).tensors]
    n = len(inputs)
    cases = [(0,) * n, (1,) * n] + [tuple(None if i == j else 0 for i in range(n)) for j in range(n) if n > 1]
    for in_dims in cases:
        calls = _one_calls(module)
        in_dims = _vmap_against_loop(getattr(module, name), inputs, in_dims)
        one_call = tuple(d is not None for d in in_dims) in _BATCHED[name]
        assert calls == (list(in_dims) if one_call else []), in_dims


@pytest.mark.parametrize(
    ("forward", "shapes", "one_call"),
    [
        ("sum(x, dim=1)", {"x": [4, 5]}, None),  # counted from the front: no rule, vmap's own loop
        ("sum(x) + y", {"x": [5], "y": [5]}, {(False, True)}),  # over every dimension
        ("sum(x * y, dim=-1)", {"x": [4], "y": [3, 4]}, {(True, False), (False, True), (True, True)}),  # padded
    ],
)
def test_a_structured_op_that_one_call_would_get_wrong_runs_per_item(tmp_path: Path, forward, shapes, one_call):
    """Where moving the batch dimension first would change what a step computes, the rule calls the op
    once per item (or the op has none): vmap's result is the loop's in every case."""
    tensors = {name: {"shape": shape} for name, shape in shapes.items()}
    namespace = f"t_r{len(forward)}"
    spec = spec_from_mapping(
        {"name": "reduced", "forward": forward, "tensors": tensors, "target": "custom_op", "namespace": namespace},
        source="test",
    )
    module = _generated(tmp_path, spec)
    assert getattr(module, "_ONE_CALL", None) == one_call
    inputs = [torch.randn(shape, dtype=torch.float64) for shape in shapes.values()]
    n = len(inputs)
    for in_dims in [(0,) * n, (1,) * n, *[tuple(None if i == j else 0 for i in range(n)) for j in range(n)]]:
        if all(d is None for d in in_dims):
            continue
        calls = _one_calls(module) if one_call else []
        in_dims = _vmap_against_loop(module.reduced, inputs, in_dims)
        once = one_call and tuple(d is not None for d in in_dims) in one_call
        assert calls == (list(in_dims) if once else []), in_dims


def test_a_reduced_value_broadcast_into_a_larger_one_is_not_batched_in_one_call():
    """``sum(x, dim=-1) + y`` with x (3, 4) and y (2, 3): x batched first, the sum (B, 3) would line its batch
    dimension up with y's 2 (scaffold.batching); y batched alone is right."""
    tensors = {"x": {"shape": [3, 4]}, "y": {"shape": [2, 3]}}
    spec = spec_from_mapping({"name": "r", "forward": "sum(x, dim=-1) + y", "tensors": tensors}, source="test")
    compiled = compile_op(spec)
    assert batching(compiled.program, compiled.plan.visible, frozenset()).one_call == ((False, True),)


@pytest.mark.parametrize("name", ["flip_sign", "identity_and_square"])
def test_an_output_that_is_an_input_is_a_copy_through_the_structured_path(tmp_path: Path, name: str):
    """A custom op may not return an input, nor a view of one (opcheck's schema test): flip_sign's
    ``x if flag else -x`` and identity_and_square's ``same = x`` return copies."""
    module = _structured(tmp_path, _spec(name, namespace=f"scaffold_tests_a{name}"))
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(getattr(module, name), (x, True) if name == "flip_sign" else (x,))
    out = getattr(module, name)(x)
    same = out[0] if isinstance(out, tuple) else out
    assert same.data_ptr() != x.data_ptr()


def test_a_transposed_input_is_a_copy(tmp_path: Path):
    """``transpose(x, -1, -2)`` is a view of x: the custom op returns a copy; of a value of its own, the view."""
    mapping = {"name": "swapped", "tensors": {"x": {"shape": [3, 4]}}, "target": "custom_op"}
    for forward, namespace, copied in [
        ("transpose(x, -1, -2)", "t_t1", True),
        ("transpose(exp(x), -1, -2)", "t_t2", False),
    ]:
        spec = spec_from_mapping({**mapping, "forward": forward, "namespace": namespace}, source="test")
        module = _generated(tmp_path, spec)
        assert (".clone()" in Path(module.__file__).read_text(encoding="utf-8")) == copied
        torch.library.opcheck(module.swapped, (torch.randn(3, 4, dtype=torch.float64, requires_grad=True),))
