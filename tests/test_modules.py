"""Modules like torch.nn's: named sizes ([sizes], --size, shape = [4, "features"]), init schemes,
reset_parameters, extra_repr, and the call-time check that one size name is one size."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - the usual name

from scaffold import generate_op, write_files
from scaffold.errors import SpecError
from scaffold.spec import Init, load_spec, parse_init, spec_from_flags, spec_to_toml, spec_with_flags

from .conftest import GeneratedRun, background_run, import_generated, make_spec

LAYER_NORM = {
    "name": "layer_norm",
    "forward": "mu = mean(x, dim=-1, keepdim=True)\nxc = x - mu\nvar = mean(xc**2, dim=-1, keepdim=True)\n"
    "xc / sqrt(var + eps) * weight + bias",
    "sizes": {"features": 16},
    "tensors": {
        "x": {"shape": [8, "features"]},
        "weight": {"shape": ["features"], "learnable": True, "init": "ones"},
        "bias": {"shape": ["features"], "learnable": True, "init": "zeros"},
    },
    "scalars": {"eps": {"default": 1e-5}},
}
LINEAR_RELU = {
    "name": "linear_relu",
    "forward": "Max(0, x @ transpose(weight, 0, 1) + bias)",
    "sizes": {"in_features": 16, "out_features": 32},
    "tensors": {
        "x": {"shape": [8, "in_features"]},
        "weight": {"shape": ["out_features", "in_features"], "learnable": True, "init": "linear"},
        "bias": {"shape": ["out_features"], "learnable": True, "init": "linear"},
    },
}


def _spec(data: dict):
    return make_spec(data["name"], data["forward"], data["tensors"], data.get("scalars"), **{"sizes": data["sizes"]})


@pytest.fixture(scope="module")
def layer_norm(tmp_path_factory):
    return import_generated(tmp_path_factory.mktemp("layer_norm"), _spec(LAYER_NORM))


@pytest.fixture(scope="module")
def linear_relu(tmp_path_factory):
    return import_generated(tmp_path_factory.mktemp("linear_relu"), _spec(LINEAR_RELU))


# --- the spec ------------------------------------------------------------------------------------------


def test_named_shapes_carry_the_example_values_and_the_names(tmp_path):
    path = tmp_path / "layer_norm.toml"
    path.write_text(
        'name = "layer_norm"\nforward = "x * weight"\n[sizes]\nfeatures = 16\n'
        '[tensors.x]\nshape = [4, "features"]\n[tensors.weight]\nshape = ["features"]\nlearnable = true\n'
    )
    spec = load_spec(path)
    x, weight = spec.tensors
    assert (x.shape, x.size_names) == ((4, 16), (None, "features"))
    assert (weight.shape, weight.size_names) == ((16,), ("features",))
    assert spec.sizes == (("features", 16),)
    assert spec.module_sizes == (("features", 16),)


def test_sizes_and_named_shapes_from_flags_equal_the_toml_spec():
    flags = spec_from_flags(
        "linear_relu",
        LINEAR_RELU["forward"],
        ["x=8,in_features", "weight=out_features,in_features", "bias=out_features"],
        learnable=["weight=linear", "bias=linear"],
        sizes=["in_features=16", "out_features=32"],
    )
    toml = _spec(LINEAR_RELU)
    assert flags.tensors == toml.tensors
    assert dict(flags.sizes) == dict(toml.sizes)
    # in order of first appearance: x names in_features first, as nn.Linear(in_features, out_features) takes them
    assert flags.module_sizes == (("in_features", 16), ("out_features", 32))


def test_a_spec_with_sizes_is_written_back_as_it_reads(tmp_path):
    spec = _spec(LINEAR_RELU)
    text = spec_to_toml(spec)
    assert "[sizes]\nin_features = 16\nout_features = 32\n" in text
    assert 'shape = ["out_features", "in_features"]' in text and 'init = "linear"' in text
    (tmp_path / "linear_relu.toml").write_text(text)
    assert load_spec(tmp_path / "linear_relu.toml", source="linear_relu.toml") == spec


def test_update_flags_change_a_size_and_keep_the_names():
    spec = spec_with_flags(_spec(LAYER_NORM), sizes=["features=20"])
    assert [t.shape for t in spec.tensors] == [(8, 20), (20,), (20,)]
    assert spec.tensors[0].size_names == (None, "features")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0.5, Init("constant", (0.5,))),
        (2, Init("constant", (2.0,))),
        ("ones", Init("ones")),
        ("zeros", Init("zeros")),
        ("normal(0, 0.02)", Init("normal", (0.0, 0.02))),
        (" normal( -1.5 , 2e-1 ) ", Init("normal", (-1.5, 0.2))),
        ("uniform(-0.1, 0.1)", Init("uniform", (-0.1, 0.1))),
        ("kaiming_uniform", Init("kaiming_uniform")),
        ("xavier_uniform", Init("xavier_uniform")),
        ("linear", Init("linear")),
    ],
)
def test_init_schemes_are_read_strictly(text, expected):
    assert parse_init(text, "tensors.w.init") == expected


@pytest.mark.parametrize(
    "text",
    ["Ones", "normal(0)", "normal(0, 1, 2)", "normal(0, nan)", "uniform(1e999, 2)", "normal(0, 1_0)", "exp(1)",
     "normal(0, (1))", True, [1.0]],
)  # fmt: skip
def test_bad_init_is_refused(text):
    with pytest.raises(SpecError):
        parse_init(text, "tensors.w.init")


def test_size_names_may_not_collide_with_the_ops_other_names():
    for name in ("x", "sum", "exp", "self", "torch", "training", "Op", "tmp1", "grad_x"):
        with pytest.raises(SpecError, match="size name"):
            make_spec("op", "x", {"x": {"shape": [4, name]}}, sizes={name: 4})


# --- the generated Module ------------------------------------------------------------------------------


def test_layer_norm_takes_its_size_by_position_and_by_keyword(layer_norm):
    for module in (layer_norm.LayerNorm(768), layer_norm.LayerNorm(features=768)):
        assert module.weight.shape == module.bias.shape == (768,)
        assert torch.equal(module.weight, torch.ones(768)) and torch.equal(module.bias, torch.zeros(768))
        with torch.no_grad():
            module.weight.normal_()
            module.bias.normal_()
        x = torch.randn(2, 3, 768, dtype=torch.float64)
        module = module.double()
        expected = F.layer_norm(x, (768,), module.weight, module.bias, 1e-5)
        torch.testing.assert_close(module(x), expected)
        torch.testing.assert_close(module(x), layer_norm.layer_norm(x, module.weight, module.bias, 1e-5))
    assert repr(layer_norm.LayerNorm(768)) == "LayerNorm(768, eps=1e-05)"
    assert repr(layer_norm.LayerNorm(32, eps=0.1)) == "LayerNorm(32, eps=0.1)"
    assert layer_norm.LayerNorm().weight.shape == (16,)  # the example's size by default


def test_a_number_that_broadcasts_with_a_named_size_takes_its_name(tmp_path):
    """x [8, 16] beside weight ["features"] (features = 16): torch ties x's last dimension to the weight's, so
    it is "features" too, for elementwise and structured ops alike; a product's inner dimension is tied when it
    lines up from the right (x [8, 16] @ transpose(w, 0, 1) with w ["out", "in"])."""
    unnamed = dict(LAYER_NORM, tensors=dict(LAYER_NORM["tensors"], x={"shape": [8, 16]}))
    assert _spec(unnamed).tensors[0].size_names == (None, "features")
    scaled = make_spec(
        "scaled", "x*w", {"x": {"shape": [4, 16]}, "w": {"shape": ["n"], "learnable": True}}, sizes={"n": 16}
    )
    assert scaled.tensors[0].size_names == (None, "n")
    linear = dict(LINEAR_RELU, tensors=dict(LINEAR_RELU["tensors"], x={"shape": [8, 16]}))
    assert _spec(linear).tensors[0].size_names == (None, "in_features")
    module = import_generated(tmp_path, _spec(unnamed))
    x = torch.randn(2, 3, 768, dtype=torch.float64)
    norm = module.LayerNorm(768).double()
    torch.testing.assert_close(norm(x), F.layer_norm(x, (768,), norm.weight, norm.bias, 1e-5))
    # a batch dimension equal to the size by chance is not tied: only dimensions that broadcast together are
    square = make_spec(
        "square", "x*w", {"x": {"shape": [16, 16]}, "w": {"shape": ["n"], "learnable": True}}, sizes={"n": 16}
    )
    assert square.tensors[0].size_names == (None, "n")


def test_one_size_name_is_one_size_at_call_time(layer_norm):
    message = 'layer_norm: size "features" is 16 in x (dim -1) but 20 in weight (dim 0)'
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layer_norm.layer_norm(torch.randn(4, 16), torch.ones(20), torch.zeros(16))
    with pytest.raises(ValueError, match='size "features" is 16 in x .* but 1 in bias'):
        layer_norm.layer_norm(torch.randn(4, 16), torch.ones(16), torch.zeros(1))  # would broadcast
    with pytest.raises(ValueError, match='size "features" is 10 in x .* but 768 in weight'):
        layer_norm.LayerNorm(768)(torch.randn(4, 10))
    # a tensor without the dimension a size is read from: a message, not an IndexError from shape[0]
    with pytest.raises(ValueError, match=r"weight needs at least 1 dimension for its sizes, got shape \(\)"):
        layer_norm.layer_norm(torch.randn(4, 16), torch.tensor(1.0), torch.zeros(16))


def test_the_size_check_compiles_without_a_graph_break(layer_norm):
    module = layer_norm.LayerNorm(8)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    x = torch.randn(3, 8)
    torch.testing.assert_close(compiled(x), module(x))
    # a mismatch is Dynamo's to report under fullgraph=True (an exception at trace time); without, the error
    with pytest.raises(ValueError, match='size "features" is 5 in x'):
        torch.compile(module, backend="eager")(torch.randn(3, 5))


def test_linear_relu_is_sized_and_initialised_like_nn_linear(linear_relu):
    module = linear_relu.LinearRelu(512, 256)
    assert module.weight.shape == (256, 512) and module.bias.shape == (256,)
    assert linear_relu.LinearRelu(in_features=512, out_features=256).weight.shape == (256, 512)
    assert repr(module) == "LinearRelu(512, 256)"
    bound = 1 / math.sqrt(512)
    for parameter in (module.weight, module.bias):
        assert parameter.abs().max() <= bound
        assert parameter.abs().max() > 0.9 * bound  # spread over the whole interval
    assert abs(float(module.weight.detach().std()) - bound / math.sqrt(3)) < 0.05 * bound
    x = torch.randn(5, 512)
    torch.testing.assert_close(module(x), F.relu(F.linear(x, module.weight, module.bias)))
    torch.testing.assert_close(module(x), linear_relu.linear_relu(x, module.weight, module.bias))


def test_reset_parameters_draws_again_and_restores(linear_relu, layer_norm):
    module = linear_relu.LinearRelu(64, 8)
    before = [p.detach().clone() for p in module.parameters()]
    module.reset_parameters()
    assert all(not torch.equal(p, b) for p, b in zip(module.parameters(), before))
    norm = layer_norm.LayerNorm(5)
    with torch.no_grad():
        norm.weight.add_(3.0)
        norm.bias.add_(3.0)
    norm.reset_parameters()
    assert torch.equal(norm.weight, torch.ones(5)) and torch.equal(norm.bias, torch.zeros(5))


def test_swish_takes_its_initial_beta(tmp_path):
    spec = spec_from_flags("swish", "x*sigmoid(beta*x)", ["x"], learnable=["beta=1.0"])
    swish = import_generated(tmp_path, spec)
    module = swish.Swish(beta=0.5)
    assert float(module.beta) == 0.5 and float(swish.Swish().beta) == 1.0
    x = torch.randn(7)
    torch.testing.assert_close(module(x), x * torch.sigmoid(0.5 * x))
    torch.testing.assert_close(module(x), swish.swish(x, module.beta))
    with torch.no_grad():
        module.beta.fill_(3.0)
    module.reset_parameters()
    assert float(module.beta) == 0.5


SCHEMES = {
    "x": {"shape": ["rows", "cols"]},
    "a": {"shape": ["rows", "cols"], "learnable": True, "init": "kaiming_uniform"},
    "b": {"shape": ["rows", "cols"], "learnable": True, "init": "xavier_uniform"},
    "c": {"shape": ["cols"], "learnable": True, "init": "normal(0.5, 0.02)"},
    "d": {"shape": ["cols"], "learnable": True, "init": "uniform(-0.3, 0.1)"},
    "g": {"shape": [], "learnable": True, "init": 0.25},
    "f": {"shape": ["cols"], "learnable": True, "init": -2},
}


def test_each_init_scheme_draws_as_nn_init_does(tmp_path):
    spec = make_spec("schemes", "x*a + b + c*x + d + g*x + f", SCHEMES, sizes={"rows": 48, "cols": 64})
    op = import_generated(tmp_path, spec)
    torch.manual_seed(0)
    module = op.Schemes(48, 64, g=0.75)
    fan_in, fan_out = 64, 48
    kaiming = math.sqrt(6 / fan_in)
    xavier = math.sqrt(6 / (fan_in + fan_out))
    assert module.a.abs().max() <= kaiming and module.a.abs().max() > 0.95 * kaiming
    assert module.b.abs().max() <= xavier and module.b.abs().max() > 0.95 * xavier
    assert abs(float(module.c.mean()) - 0.5) < 0.01 and 0.01 < float(module.c.std()) < 0.03
    assert module.d.min() >= -0.3 and module.d.max() <= 0.1 and module.d.max() - module.d.min() > 0.3
    assert float(module.g) == 0.75 and torch.equal(module.f, torch.full((64,), -2.0))
    assert module.a.shape == module.b.shape == (48, 64) and module.c.shape == (64,)
    assert repr(module) == "Schemes(48, 64)"


# --- the generated tests -------------------------------------------------------------------------------

MODULE_TESTS = "test_module or test_module_sizes or test_reset_parameters or test_matches_reference or gradcheck"


def _module_ops(folder: Path, data: dict) -> GeneratedRun:
    write_files(generate_op(_spec(data)), folder)
    text = (folder / f"test_{data['name']}.py").read_text()
    assert "def test_module_sizes(device):" in text and "def test_reset_parameters():" in text
    return GeneratedRun(folder, ("-k", MODULE_TESTS))


@pytest.mark.parametrize("data", [LAYER_NORM, LINEAR_RELU], ids=["layer_norm", "linear_relu"])
@background_run(_module_ops)
def test_the_generated_tests_pass(data, background_results):
    result = background_results
    assert result.returncode == 0, result.stdout + result.stderr


def _schemes(folder: Path) -> GeneratedRun:
    spec = make_spec("schemes", "x*a + b + c*x + d + g*x + f", SCHEMES, sizes={"rows": 48, "cols": 64})
    write_files(generate_op(spec), folder)
    return GeneratedRun(folder, ("-k", "test_module or test_module_sizes or test_reset_parameters"))


@background_run(_schemes)
def test_the_generated_schemes_tests_pass(background_results):
    result = background_results
    assert result.returncode == 0, result.stdout + result.stderr


MUTATIONS = [
    # the weight kaiming-uniform with torch's default a = 0 instead of nn.Linear's sqrt(5): bounds too wide
    ("nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))", "nn.init.kaiming_uniform_(self.weight)", "reset"),
    # the bias's bound from the wrong fan
    ("bound = 1 / math.sqrt(self.weight.shape[1])", "bound = 1 / math.sqrt(self.weight.shape[0])", "reset"),
    # a parameter that ignores the constructor's size
    ("torch.empty(out_features, in_features)", "torch.empty(32, in_features)", "sizes"),
    # the sizes swapped in the repr
    ('return f"{self.in_features}, {self.out_features}"', 'return f"{self.out_features}, {self.in_features}"', "sizes"),
    # a size check that reads the wrong dimension (right only where the sizes happen to agree)
    ("if weight.shape[1] != x.shape[-1]:", "if weight.shape[0] != x.shape[-1]:", "sizes"),
    # reset_parameters that does not draw again
    ("        self.reset_parameters()\n",
     "        self.reset_parameters()\n        self.reset_parameters = lambda: None\n", "reset"),
]  # fmt: skip


def _wrong_modules(folder: Path) -> dict[int, GeneratedRun]:
    """Each mutation in a folder of its own, run by the test it breaks."""
    files = generate_op(_spec(LINEAR_RELU))
    original = files["linear_relu.py"]
    runs = {}
    for index, (old, new, test) in enumerate(MUTATIONS):
        assert old in original, old
        write_files({**files, "linear_relu.py": original.replace(old, new)}, folder / str(index))
        selected = "test_reset_parameters" if test == "reset" else "test_module_sizes"
        runs[index] = GeneratedRun(folder / str(index), ("-k", selected))
    return runs


@background_run(_wrong_modules)
def test_the_generated_tests_fail_on_a_wrong_module(background_results):
    for index, (_, new, test) in enumerate(MUTATIONS):
        result = background_results[index]
        assert result.returncode == 1, f"{new!r} passed the {test} test:\n{result.stdout}"
