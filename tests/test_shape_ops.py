"""Shape operations (issue 34): slices with integer bounds, cat, reshape, unsqueeze, squeeze, flatten.
Each matches torch in value, gradient and second derivative (float64) at two batch ranks and passes its
generated tests; what cannot be right is refused with a message that says what and how to fix it."""

from __future__ import annotations

import pytest
import torch

from scaffold.api import compile_op, generate_op
from scaffold.batching import batching
from scaffold.errors import ScaffoldError
from scaffold.write import write_files

from .conftest import WITHOUT_COMPILE, GeneratedRun, background_run, import_generated, make_spec, run_pytest


def _rotate_half(x):
    return torch.cat((-x[..., 2:], x[..., :2]), dim=-1)


#: name -> (forward, tensors {name: example shape}, torch's op over the same tensors)
CASES = {
    "rope": (
        "x*cos_ + cat((-x[..., 2:], x[..., :2]), dim=-1)*sin_",
        {"x": [4, 4], "cos_": [4, 4], "sin_": [4, 4]},
        lambda x, cos_, sin_: x * cos_ + _rotate_half(x) * sin_,
    ),
    "inner_rows": ("exp(x[1:-1, :2])", {"x": [4, 3]}, lambda x: torch.exp(x[1:-1, :2])),
    "last_columns": ("x[..., -2:]", {"x": [4, 3]}, lambda x: x[..., -2:]),
    "product_sliced": ("(x*y)[..., 1:]", {"x": [4, 3], "y": [4, 3]}, lambda x, y: (x * y)[..., 1:]),
    "joined_squares": (
        "sum(cat((x, exp(y)), dim=-1)**2, dim=-1)",
        {"x": [4, 3], "y": [4, 2]},
        lambda x, y: (torch.cat((x, torch.exp(y)), dim=-1) ** 2).sum(-1),
    ),
    "joined_rows": (
        "cat((x, y*x[:1]), dim=0)",
        {"x": [4, 3], "y": [2, 3]},
        lambda x, y: torch.cat((x, y * x[:1]), dim=0),
    ),
    "rows_of_twelve": (
        "sum(reshape(x, (-1, 12))**2, dim=-1)",
        {"x": [4, 6, 2]},
        lambda x: (x.reshape(-1, 12) ** 2).sum(-1),
    ),
    "unsqueezed": (
        "exp(unsqueeze(x, -1)) * y",
        {"x": [4, 3], "y": [4, 3, 2]},
        lambda x, y: torch.exp(x.unsqueeze(-1)) * y,
    ),
    "lead_unsqueezed": ("unsqueeze(x, 0) * y", {"x": [4, 3], "y": [2, 4, 3]}, lambda x, y: x.unsqueeze(0) * y),
    "squeezed": ("squeeze(x, -1) * y", {"x": [4, 3, 1], "y": [4, 3]}, lambda x, y: x.squeeze(-1) * y),
    "flat_pairs": (
        "sum(flatten(x, start_dim=-2, end_dim=-1)**2, dim=-1)",
        {"x": [4, 3, 2]},
        lambda x: (x.flatten(-2, -1) ** 2).sum(-1),
    ),
    "flat_all": ("flatten(x)*2", {"x": [4, 3, 2]}, lambda x: x.flatten() * 2),
    "stacked_squares": (
        "sum(stack((x, exp(y)), dim=-1)**2, dim=-1)",
        {"x": [4, 3], "y": [4, 3]},
        lambda x, y: (torch.stack((x, torch.exp(y)), dim=-1) ** 2).sum(-1),
    ),
    "stacked_rows": ("stack((x, x*y), dim=0)", {"x": [4, 3], "y": [4, 3]}, lambda x, y: torch.stack((x, x * y), 0)),
}

#: the cases whose dims count from the back: a leading batch dimension is a batch
BATCHED = [
    "rope",
    "last_columns",
    "product_sliced",
    "joined_squares",
    "rows_of_twelve",
    "unsqueezed",
    "squeezed",
    "flat_pairs",
    "flat_all",
    "stacked_squares",
]
#: also generated as custom ops, whose vmap rule calls the op once where that is right
CUSTOM_OPS = ["rope", "rows_of_twelve", "unsqueezed", "flat_pairs", "stacked_squares"]


def _spec(name: str, **extra):
    forward, shapes, _ = CASES[name]
    return make_spec(name, forward, {t: {"shape": s} for t, s in shapes.items()}, **extra)


def _inputs(shapes: list[list[int]], seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=generator, dtype=torch.float64).requires_grad_() for s in shapes]


def _check_against_torch(op, native, inputs: list[torch.Tensor]) -> None:
    out, expected = op(*inputs), native(*inputs)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    upstream = torch.randn(expected.shape, dtype=torch.float64)
    grads = torch.autograd.grad(out, inputs, upstream, create_graph=True)
    expected_grads = torch.autograd.grad(expected, inputs, upstream, create_graph=True)
    for grad, want in zip(grads, expected_grads):
        torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)
    # second derivatives (backward is differentiable torch code), where the op is not linear
    total, expected_total = (sum((g * g.detach()).sum() for g in gs) for gs in (grads, expected_grads))
    if expected_total.requires_grad:
        second = torch.autograd.grad(total, inputs, allow_unused=True, materialize_grads=True)
        expected_second = torch.autograd.grad(expected_total, inputs, allow_unused=True, materialize_grads=True)
        for got, want in zip(second, expected_second):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_in_value_and_gradients(tmp_path, name):
    op = getattr(import_generated(tmp_path, _spec(name)), name)
    _, shapes, native = CASES[name]
    _check_against_torch(op, native, _inputs(list(shapes.values()), seed=0))


@pytest.mark.parametrize("name", BATCHED)
def test_matches_torch_with_a_batch_dimension(tmp_path, name):
    op = getattr(import_generated(tmp_path, _spec(name)), name)
    _, shapes, native = CASES[name]
    _check_against_torch(op, native, _inputs([[3, *s] for s in shapes.values()], seed=1))


def test_slice_and_cat_are_recomputed_not_saved():
    """RoPE's backward keeps its three inputs: the slices and their cat are views and a copy of x, cheaper
    computed again than kept."""
    source = generate_op(_spec("rope"))["rope.py"]
    assert "ctx.save_for_backward(x, cos_, sin_)" in source
    assert "slice_scatter" in source and ".narrow(-1, " in source


def test_a_reshape_is_computed_item_by_item_under_vmap_and_a_flatten_at_the_end_in_one_call():
    for name, one_call in [("rows_of_twelve", False), ("flat_pairs", True), ("last_columns", True)]:
        program = compile_op(_spec(name)).program
        rule = batching(program, tuple(o.value for o in program.outputs), frozenset())
        assert (rule is not None and any(all(case) for case in rule.one_call)) == one_call, name


#: The ops whose generated tests compile them too: one slice and cat, one reshape.
COMPILED = {"rope", "rows_of_twelve"}


def _generated(folder):
    runs = {}
    for name in CASES:
        write_files(generate_op(_spec(name)), folder / name)
        runs[name] = GeneratedRun(folder / name, () if name in COMPILED else WITHOUT_COMPILE)
    for name in CUSTOM_OPS:
        write_files(generate_op(_spec(name, target="custom_op")), folder / f"{name}_op")
        runs[f"{name}_op"] = GeneratedRun(folder / f"{name}_op")
    return runs


@background_run(_generated)
def test_each_passes_its_generated_tests(background_results):
    for name, result in background_results.items():
        assert result.returncode == 0, (name, result.stdout[-3000:])


@pytest.mark.parametrize(
    ("forward", "tensors", "message"),
    [
        ("x[::2]", {"x": [4, 3]}, "a slice's step must be left out (steps are 1)"),
        ("x[..., 0]", {"x": [4, 3]}, "only slices (start:stop) index a value"),
        ("x[..., 1.5:]", {"x": [4, 3]}, "a slice's bounds must be literal integers"),
        ("x[..., ..., 1:]", {"x": [4, 3]}, "an index has at most one '...'"),
        ("x[..., 3:]", {"x": [4, 3]}, "3: at dim=-1 of x (shape [4, 3]) takes no elements (that dimension has 3)"),
        ("cat((x,), dim=0)", {"x": [4, 3]}, "cat() joins two or more expressions"),
        ("cat(x, y)", {"x": [4, 3], "y": [4, 3]}, "cat() takes a tuple of expressions and dim=D"),
        (
            "cat((x, y), dim=-1)",
            {"x": [4, 3], "y": [3, 3]},
            "cat along dim=-1: x (shape [4, 3]) and y (shape [3, 3]) differ in another dimension",
        ),
        (
            "cat((x, y), dim=0)",
            {"x": [4, 3], "y": [3]},
            "cat needs operands with the same number of dimensions: x (shape [4, 3]), y (shape [3])",
        ),
        (
            "reshape(x, (5, -1))",
            {"x": [4, 3]},
            "reshape of x (shape [4, 3]), 12 elements, to (5, -1): 12 is not a multiple of 5",
        ),
        ("reshape(x, (5, 3))", {"x": [4, 3]}, "reshape of x (shape [4, 3]), 12 elements, to (5, 3): that holds 15"),
        ("stack((x, y), dim=0)", {"x": [4, 3], "y": [3]}, "stack needs operands of one shape: x (shape [4, 3]) and y"),
        ("stack((x, x), dim=3)", {"x": [4, 3]}, "dim=3 is out of range for the stacked result (valid: -3 to 2)"),
        ("reshape(x, (-1, -1))", {"x": [4, 3]}, "reshape() takes sizes of at least 1, and at most one -1"),
        ("reshape(x, 12)", {"x": [4, 3]}, "reshape() takes the new shape as a tuple of integers"),
        ("squeeze(x, 0)", {"x": [4, 3]}, "squeeze at dim=0 of x (shape [4, 3]): that dimension has size 4, not 1"),
        ("unsqueeze(x, 3)", {"x": [4, 3]}, "dim=3 is out of range for x (shape [4, 3]) unsqueezed (valid: -3 to 2)"),
        (
            "flatten(x, start_dim=1, end_dim=0)",
            {"x": [4, 3]},
            "flatten of x (shape [4, 3]): start_dim=1 comes after end_dim=0",
        ),
    ],
)
def test_what_cannot_be_right_is_refused(forward, tensors, message):
    spec = make_spec("refused", forward, {t: {"shape": s} for t, s in tensors.items()})
    with pytest.raises(ScaffoldError) as caught:
        compile_op(spec)
    assert message in str(caught.value)


def test_sizes_a_reshape_ties_keep_the_example_shapes_in_the_generated_tests(tmp_path):
    """x (4, 6) reshaped to rows of 12: the tests' small sizes (2, 3) hold 6 elements, no multiple of 12, so
    the generated tests keep the example's shape, where the op is defined (they raised in the reference)."""
    spec = make_spec("rows_2d", "sum(reshape(x, (-1, 12))**2, dim=-1)", {"x": {"shape": [4, 6]}})
    write_files(generate_op(spec), tmp_path)
    result = run_pytest(tmp_path, "-k", "cpu and (matches_reference or gradcheck or second_shape)")
    assert result.returncode == 0, result.stdout[-3000:]
