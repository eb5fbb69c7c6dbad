"""Bool tensors and comparisons as values (issue 34): a tensor declared ``dtype = "bool"`` is a mask, with no
gradient and no domain, passed through unchanged; a bool tensor or a comparison is a condition (``where``,
``Piecewise``, ``&``, ``~``) and, used as a number, 1 where it holds and 0 elsewhere in the math's dtype
(``x*(x > 0)``, ``sum(m, dim=-1)``, ``1 - m``), its derivative 0 across the step. Masked means and
cross-entropy with ``ignore_index`` written by ``where`` match torch at two batch ranks, in value and
gradient, and pass their generated tests, which draw each mask with a True in every line (no 0/0)."""

from __future__ import annotations

import re

import pytest
import tomllib
import torch
from torch.nn import functional

from scaffold import generate_op
from scaffold.errors import ScaffoldError
from scaffold.spec import spec_from_mapping, spec_to_toml
from scaffold.testing import Input, OpTests, _one_true_per_line
from scaffold.write import write_files

from .conftest import WITHOUT_COMPILE, GeneratedRun, background_run, import_generated, make_spec

MASK = {"shape": [3, 4], "dtype": "bool"}
X = {"shape": [3, 4]}
MASKED_MEANS = {
    "where_mean": "sum(where(m, x, 0), dim=-1) / sum(m, dim=-1)",
    "product_mean": "sum(x*m, dim=-1)/sum(m, dim=-1)",
}
SHAPES = [(3, 4), (2, 3, 4)]
CE = "logsumexp(z, dim=-1) - sum(z*one_hot(t, num_classes=5), dim=-1)"
IGNORED = f"where(t == 0, 0, {CE})"
TARGETS = {"shape": [4], "dtype": "int64", "domain": [0, 4]}


def _masked(name: str, forward: str, **extra):
    return make_spec(name, forward, {"x": dict(X), "m": dict(MASK)}, **extra)


def _draw(shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
    m = torch.rand(shape, generator=generator) < 0.5
    m[..., 0] = True  # every row counts something
    return x, m


def _assert_same(out, expected, inputs):
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(9))
    for got, want in zip(torch.autograd.grad(out, inputs, upstream), torch.autograd.grad(expected, inputs, upstream)):
        torch.testing.assert_close(got, want)


# --- the spec ---------------------------------------------------------------------------------------------------


def test_a_bool_tensor_is_declared_with_dtype_bool_and_survives_the_round_trip():
    spec = _masked("masked", "x*m")
    m = spec.tensors[1]
    assert m.boolean and m.discrete and not m.integer and m.domain is None
    again = spec_from_mapping(tomllib.loads(spec_to_toml(spec)), source="masked.toml")
    assert again.tensors == spec.tensors


@pytest.mark.parametrize(
    ("settings", "key", "message"),
    [
        ({"domain": [0, 1]}, "tensors.m.domain", "a bool tensor takes no domain"),
        ({"learnable": True}, "tensors.m.learnable", "a bool tensor cannot be learnable: it has no gradient"),
        ({"avoid": [0.0]}, "tensors.m.avoid", "avoid is only used for floating-point tensors"),
        ({"dtype": "uint8"}, "tensors.m.dtype", "unknown dtype 'uint8' (supported: 'float', 'int64', 'bool')"),
    ],
)
def test_a_bool_tensor_takes_no_domain_and_no_learning(settings, key, message):
    with pytest.raises(ScaffoldError, match=re.escape(message)) as error:
        make_spec("bad", "x*m", {"x": dict(X), "m": {**MASK, **settings}})
    assert key in str(error.value)


def test_a_bool_tensor_has_no_gradient_to_give_and_an_op_needs_a_float_tensor():
    with pytest.raises(ScaffoldError, match="'m' is a bool tensor: it has no gradient"):
        _masked("bad", "x*m", gradients={"m": "grad"})
    with pytest.raises(ScaffoldError, match="every tensor argument is int64 or bool: the op needs a floating-point"):
        make_spec("bad", "sum(m, dim=-1)", {"m": dict(MASK)})


# --- comparisons and masks as numbers --------------------------------------------------------------------------


def test_a_comparison_times_its_operand_is_relu_with_relus_gradient_at_zero(tmp_path):
    op = import_generated(tmp_path, make_spec("relu_mask", "x*(x > 0)", {"x": dict(X)})).relu_mask
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0], dtype=torch.float64, requires_grad=True)
    out = op(x)
    torch.testing.assert_close(out, torch.relu(x))
    # d/dx x*(x > 0) is (x > 0): 0 at 0, as relu's
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], (x > 0).double())


AS_NUMBERS = [
    ("where(m, x, 0)", lambda x, m: torch.where(m, x, 0.0)),
    ("Piecewise((x, m), (2*x, True))", lambda x, m: torch.where(m, x, 2 * x)),
    ("where(m & (x > 0), x**2, x)", lambda x, m: torch.where(m & (x > 0), x**2, x)),
    ("where(~m, exp(x), x)", lambda x, m: torch.where(~m, x.exp(), x)),
    ("x*(1 - m)", lambda x, m: x * (1 - m.double())),
    ("x + m", lambda x, m: x + m.double()),
    ("x*exp(m)", lambda x, m: x * m.double().exp()),
    ("x + sum(m, dim=-1, keepdim=True)", lambda x, m: x + m.double().sum(-1, keepdim=True)),
    ("x*(x > 0)*(1 - m) + 0.5*m", lambda x, m: torch.relu(x) * (~m) + 0.5 * m.double()),
    ("where(m == 0, x, 0)", lambda x, m: torch.where(~m, x, 0.0)),
    ("where(m | (x < -1), 0, x)", lambda x, m: torch.where(m | (x < -1), 0.0, x)),
    ("where(m, x, 0) + where(x > 0, m, 0)", lambda x, m: torch.where(m, x, 0.0) + (m & (x > 0)).double()),
]


@pytest.mark.parametrize("case", range(len(AS_NUMBERS)))
def test_bool_tensors_as_conditions_and_as_numbers_match_torch(tmp_path, case):
    forward, reference = AS_NUMBERS[case]
    name = f"masks{case}"  # a module of its own name: Python imports each name once
    op = getattr(import_generated(tmp_path, _masked(name, forward)), name)
    for shape in SHAPES:
        x, m = _draw(shape, seed=1)
        out = op(x, m)
        assert out.dtype == torch.float64
        _assert_same(out, reference(x, m), [x])
        assert m.dtype == torch.bool  # passed through unchanged
    x32 = x.detach().float().requires_grad_()
    out32 = op(x32, m)
    assert out32.dtype == torch.float32 and torch.autograd.grad(out32.sum(), x32)[0].dtype == torch.float32


def test_the_printed_code_does_no_arithmetic_on_a_raw_bool_tensor_and_counts_in_the_float_dtype(tmp_path):
    module = import_generated(tmp_path, _masked("mask_count", "x + sum(m, dim=-1, keepdim=True) - m"))
    source = (tmp_path / "mask_count.py").read_text()
    assert "m.new_tensor" not in source  # a bool tensor is no dtype anchor: its new_tensor(0) is bool
    x, m = _draw((3, 4))
    outs = module.MaskCountFunction.apply(x, m)
    assert all(o.dtype == torch.float64 for o in outs if o.is_floating_point())


@pytest.mark.parametrize("name", MASKED_MEANS)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_masked_mean_matches_torch(tmp_path, name, shape):
    spec = _masked(f"{name}{len(shape)}", MASKED_MEANS[name])
    module = import_generated(tmp_path, spec)
    name = spec.name
    x, m = _draw(shape, seed=2)
    out = getattr(module, name)(x, m)
    _assert_same(out, (x * m).sum(-1) / m.sum(-1), [x])
    outs = getattr(module, f"{spec.camel}Function").apply(x, m)
    grads = outs[0].grad_fn.apply(*(torch.ones_like(o) if o.is_floating_point() else None for o in outs))
    assert grads[1] is None and grads[0].shape == x.shape  # the mask takes no gradient


# --- class indices compared --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("z_shape", "t_shape"), [((4, 5), (4,)), ((2, 3, 5), (2, 3))])
def test_ignore_index_written_by_where_matches_torch(tmp_path, z_shape, t_shape):
    op = import_generated(tmp_path, make_spec("ignored", IGNORED, {"z": {"shape": [4, 5]}, "t": TARGETS})).ignored
    generator = torch.Generator().manual_seed(3)
    z = (torch.randn(z_shape, generator=generator, dtype=torch.float64) * 2).requires_grad_()
    t = torch.randint(0, 5, t_shape, generator=generator)
    t.view(-1)[0] = 0  # an ignored target at least
    out = op(z, t)
    flat = functional.cross_entropy(z.reshape(-1, 5), t.reshape(-1), ignore_index=0, reduction="none")
    _assert_same(out, flat.reshape(t_shape), [z])


def test_a_comparison_with_an_index_outside_the_domain_never_holds(tmp_path):
    spec = make_spec("never", IGNORED.replace("t == 0", "t == -100"), {"z": {"shape": [4, 5]}, "t": TARGETS})
    op = import_generated(tmp_path, spec).never
    z = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 5, (2, 3))
    expected = functional.cross_entropy(z.reshape(-1, 5), t.reshape(-1), reduction="none").reshape(2, 3)
    _assert_same(op(z, t), expected, [z])


def test_one_hot_of_negative_indices_is_still_refused():
    spec = make_spec("bad", IGNORED, {"z": {"shape": [4, 5]}, "t": {**TARGETS, "domain": [-100, 4]}})
    with pytest.raises(ScaffoldError, match="outside 0 to 4"):
        generate_op(spec)


# --- what is refused --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("forward", "extra"),
    [
        ("x > 0", {}),
        ("m", {}),
        ("y = x*m\npositive = y > 0", {"outputs": ["y", "positive"]}),
    ],
)
def test_a_bool_output_is_refused_saying_how_to_return_it(forward, extra):
    with pytest.raises(ScaffoldError, match=re.escape("is a condition (a comparison or a bool tensor), not a number")):
        generate_op(_masked("bad", forward, **extra))
    with pytest.raises(ScaffoldError, match=re.escape("where(x > 0, 1.0, 0.0)")):
        generate_op(_masked("bad", forward, **extra))


@pytest.mark.parametrize(
    ("forward", "tensors", "message"),
    [
        (
            "sum(z*one_hot(m, num_classes=5), dim=-1)",
            {"z": {"shape": [3, 5]}, "m": {"shape": [3], "dtype": "bool"}},
            "one_hot() takes int64 indices, and this is a condition",
        ),
        (
            "gather(z, dim=-1, index=m)",
            {"z": {"shape": [3, 5]}, "m": {"shape": [3, 1], "dtype": "bool"}},
            "gather() takes int64 indices, and this is a condition",
        ),
        (
            "gather(z, dim=-1, index=t > 2)",
            {"z": {"shape": [3, 5]}, "t": {"shape": [3, 1], "dtype": "int64", "domain": [0, 4]}},
            "gather() takes int64 indices, and this is a condition",
        ),
    ],
)
def test_a_mask_as_indices_is_refused(forward, tensors, message):
    with pytest.raises(ScaffoldError, match=re.escape(message)):
        generate_op(make_spec("bad", forward, tensors))


# --- the generated tests ---------------------------------------------------------------------------------------


def test_masks_are_drawn_true_and_false_with_a_true_in_every_line():
    for shape in [(3, 4), (2, 3, 4), (5,), (1, 4), (4, 1, 3)]:
        for seed in range(5):
            mask = _one_true_per_line(torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < 0.5)
            for dim, size in enumerate(shape):
                if size > 1:
                    assert mask.any(dim=dim).all(), (shape, dim)
    assert torch.equal(_one_true_per_line(torch.zeros(1, 1, dtype=torch.bool)), torch.zeros(1, 1, dtype=torch.bool))


def test_the_generated_tests_carry_the_mask_as_floats_and_pass_it_as_bool(tmp_path):
    module = import_generated(tmp_path, _masked("where_mean", MASKED_MEANS["where_mean"]))
    assert 'Input("m", (2, 3), dtype="bool"' in (tmp_path / "test_where_mean.py").read_text()
    seen = []

    def reference(x, m):
        seen.append(m.dtype)
        return (x * m).sum(-1) / m.sum(-1)

    tests = OpTests(
        function=module.WhereMeanFunction,
        op=module.where_mean,
        module=module.WhereMean,
        reference=reference,
        inputs=[Input("x", (3, 4)), Input("m", (3, 4), dtype="bool")],
        elementwise=False,
    )
    both = set()
    for seed in range(4):
        _, m = tests.make_inputs("cpu", seed=seed)
        assert set(m.unique().tolist()) <= {0.0, 1.0} and (m.sum(-1) > 0).all()
        both |= set(m.unique().tolist())
    assert both == {0.0, 1.0}
    assert (tests.extreme_inputs()[1].sum(-1) > 0).all()
    tests.check_gradcheck("cpu")
    tests.check_matches_reference("cpu")
    tests.check_only_needed_gradients("cpu")
    assert set(seen) == {torch.bool}


def _generated(folder):
    specs = [_masked(name, forward) for name, forward in MASKED_MEANS.items()]
    specs += [
        _masked("mean_custom_op", MASKED_MEANS["product_mean"], target="custom_op"),  # opcheck takes m as bool
        make_spec("relu_mask", "x*(x > 0)", {"x": dict(X)}),
        make_spec("ignored", IGNORED, {"z": {"shape": [4, 5]}, "t": TARGETS}),
        _masked("selected", "where(m & (x > 0), x**2, 0.5*x)*(1 - m) + where(~m, exp(x), x)"),
        _masked("counted", "x*exp(m) + sum(m, dim=-1, keepdim=True)"),
        # a mask and a parameter: the Module's forward takes x and m, unchanged
        make_spec(
            "masked_scale",
            "sum(w*x*m, dim=-1)/sum(m, dim=-1)",
            {"x": dict(X), "m": dict(MASK), "w": {"shape": [4], "learnable": True, "init": 1.0}},
        ),
    ]
    runs = {}
    for spec in specs:
        write_files(generate_op(spec), folder / spec.name)
        compiled = spec.name in ("where_mean", "mean_custom_op", "selected")
        runs[spec.name] = GeneratedRun(folder / spec.name, () if compiled else WITHOUT_COMPILE)
    return runs


@background_run(_generated)
def test_masked_ops_pass_their_generated_tests(background_results):
    for name, result in background_results.items():
        assert result.returncode == 0, (name, result.stdout[-3000:])


def test_a_division_by_a_mask_is_refused():
    with pytest.raises(ScaffoldError, match="simplifies to something infinite, undefined or complex"):
        generate_op(_masked("bad", "x/m"))


def test_messages_spell_a_mask_used_as_a_number_as_the_language_writes_it():
    with pytest.raises(ScaffoldError) as error:  # a sum over the rows beside x of the rows' shape
        generate_op(_masked("bad", "x + sum(m, dim=-1)"))
    assert "sum(where(m != 0, 1, 0), dim=-1)" in str(error.value)
    with pytest.raises(ScaffoldError) as error:
        generate_op(_masked("bad", "where(m & (x > 0), x, 0) + sum(x*m, dim=-1)"))
    assert "(x > 0) & (m != 0)" in str(error.value) and "Ne(" not in str(error.value)


def test_bench_draws_masks_and_indices_that_take_no_gradient():
    from scaffold.bench import make_inputs
    from scaffold.domain import InputDomain

    spec = make_spec(
        "bench_mask",
        f"sum(x*m, dim=-1)/sum(m, dim=-1) + {CE}",
        {"x": {"shape": [4, 5]}, "m": {"shape": [4, 5], "dtype": "bool"}, "z": {"shape": [4, 5]}, "t": TARGETS},
    )
    domains = [InputDomain(n, -3.0, 3.0, (), "") for n in ("x", "z")]  # bench reads only the floats'
    x, m, z, t = make_inputs(spec, domains, numel=4096, device=torch.device("cpu"), dtype=torch.float32)
    assert x.requires_grad and z.requires_grad and x.dtype == torch.float32
    assert m.dtype == torch.bool and not m.requires_grad and m.any(-1).all() and not m.all()
    assert t.dtype == torch.int64 and not t.requires_grad and 0 <= t.min() and t.max() <= 4
