"""Rank and size as torch has them: a structured op called at other ranks than its example's.

* dims as written: a non-negative dim counts from the front, a negative one from the back, dim omitted is
  every dimension at call time; values and gradients against plain torch autograd at other ranks;
* matrix products as torch.matmul: vectors, and batch dimensions broadcast on either side, each gradient
  summed back to its operand's shape;
* rewrites compare dims as written (softmax(dim=1) recognised; dim=1 and dim=-1 never merged);
* a rank the math cannot take: a clear error from the generated _check_ranks, naming op, input, expectation;
* the generated test_second_shape fails for a Function broken the way main generated these ops.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
from pathlib import Path

import pytest
import torch

from scaffold import generate_op, spec_from_mapping

try:
    from .conftest import GeneratedRun, background_run
except ImportError:  # tests/ run as a plain folder, not a package
    from conftest import GeneratedRun, background_run

_counter = itertools.count()


def _files(name: str, forward: str, tensors: dict) -> dict[str, str]:
    return generate_op(spec_from_mapping({"name": name, "forward": forward, "tensors": tensors}, source=f"{name}.toml"))


def _module(name: str, forward: str, tensors: dict, folder: Path):
    path = folder / f"{name}.py"
    path.write_text(_files(name, forward, tensors)[f"{name}.py"], encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location(f"_ranks_{name}_{next(_counter)}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _assert_as_torch(op, reference, *shapes: tuple[int, ...]) -> None:
    """``op`` and ``reference`` (plain torch, differentiated by autograd) agree at ``shapes`` in float64: the
    value with its shape, and every input's gradient for a random upstream gradient."""
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=generator, dtype=torch.float64, requires_grad=True) for s in shapes]
    value, expected = op(*inputs), reference(*inputs)
    assert value.shape == expected.shape, f"at {shapes}: shape {tuple(value.shape)}, torch {tuple(expected.shape)}"
    torch.testing.assert_close(value, expected)
    upstream = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    grads = torch.autograd.grad(value, inputs, upstream)
    expected_grads = torch.autograd.grad(expected, inputs, upstream)
    for k, (grad, expected_grad) in enumerate(zip(grads, expected_grads)):
        torch.testing.assert_close(grad, expected_grad, msg=lambda m, k=k: f"gradient {k} at {shapes}: {m}")


# -- the examples -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 4), (2, 3, 4, 5), (3, 1, 2)])
def test_sum_over_dim_1_counts_from_the_front(shape, tmp_path: Path):
    module = _module("sq", "sum(x*x, dim=1)", {"x": {"shape": [4, 5]}}, tmp_path)
    _assert_as_torch(module.sq, lambda x: torch.sum(x * x, 1), shape)
    _assert_as_torch(module.Sq(), lambda x: torch.sum(x * x, 1), shape)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)])
def test_a_full_logsumexp_reduces_every_dimension_at_call_time(shape, tmp_path: Path):
    module = _module("lse", "log(sum(exp(x)))", {"x": {"shape": [5]}}, tmp_path)
    _assert_as_torch(module.lse, lambda x: torch.log(torch.sum(torch.exp(x))), shape)


@pytest.mark.parametrize("x_shape", [(8, 16), (2, 3, 16), (1, 16)])
def test_linear_relu_sums_the_weight_gradient_over_batch_dimensions(x_shape, tmp_path: Path):
    tensors = {"x": {"shape": [8, 16]}, "w": {"shape": [32, 16]}, "b": {"shape": [32]}}
    module = _module("linrelu", "Max(x @ transpose(w, 0, 1) + b, 0)", tensors, tmp_path)
    _assert_as_torch(module.linrelu, lambda x, w, b: torch.relu(x @ w.T + b), x_shape, (32, 16), (32,))


# -- reductions and softmax at other ranks ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("forward", "reference"),
    [
        ("mean(x**2)", lambda x: torch.mean(x**2)),
        ("amax(x)", lambda x: torch.amax(x)),
        ("amin(x, keepdim=True) * x", lambda x: torch.amin(x, dim=tuple(range(x.dim())), keepdim=True) * x),
        ("x - mean(x, keepdim=True)", lambda x: x - x.mean(dim=None, keepdim=True)),
        ("logsumexp(x, keepdim=True) - x", lambda x: torch.logsumexp(x, tuple(range(x.dim())), keepdim=True) - x),
        ("sum(x, dim=(0, 1)) * 2", lambda x: torch.sum(x, (0, 1)) * 2),
        ("mean(x, dim=(-1, -2), keepdim=True) * x", lambda x: torch.mean(x, (-1, -2), keepdim=True) * x),
        ("x - mean(x, dim=0, keepdim=True)", lambda x: x - torch.mean(x, 0, keepdim=True)),
        ("softmax(x, dim=1)", lambda x: torch.softmax(x, 1)),
        ("exp(x) / sum(exp(x), dim=1, keepdim=True)", lambda x: torch.softmax(x, 1)),
        ("log_softmax(x, dim=0) * 2", lambda x: torch.log_softmax(x, 0) * 2),
        # written differently: the same dimension at rank 2, not at rank 3 (no work shared between them)
        (
            "log_softmax(x, dim=1) + logsumexp(x, dim=-1, keepdim=True)",
            lambda x: torch.log_softmax(x, 1) + torch.logsumexp(x, -1, keepdim=True),
        ),
        ("transpose(x, 0, 1) * 2", lambda x: x.transpose(0, 1) * 2),
    ],
)
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 4)])
def test_dims_as_written_at_other_ranks(forward, reference, shape, tmp_path: Path):
    module = _module("op", forward, {"x": {"shape": [4, 5]}}, tmp_path)
    _assert_as_torch(module.op, reference, shape)


@pytest.mark.parametrize(
    ("forward", "reference", "shapes"),
    [
        # a spread gradient, a broadcast operand and dims from the front: which dimensions the gradient runs
        # along at call time is not the example's
        ("mean(x + b, dim=0)", lambda x, b: torch.mean(x + b, 0), [(2, 3, 5), (5,)]),
        ("mean(x * b, dim=1)", lambda x, b: torch.mean(x * b, 1), [(2, 3, 5), (5,)]),
        ("sum(x * b, dim=0, keepdim=True) * x", lambda x, b: torch.sum(x * b, 0, keepdim=True) * x, [(2, 3, 5), (5,)]),
        ("mean(x, dim=0) * b", lambda x, b: torch.mean(x, 0) * b, [(2, 3, 5), (5,)]),
        # b of as many dimensions as x in the example, and fewer at call time (a batch beside one target)
        ("mean((x - b)**2)", lambda x, b: torch.mean((x - b) ** 2), [(2, 4, 5), (4, 5)]),
        ("mean((x - b)**2)", lambda x, b: torch.mean((x - b) ** 2), [(4, 5), (2, 4, 5)]),
        ("mean(x * b, dim=-1)", lambda x, b: torch.mean(x * b, -1), [(4, 5), (3, 1, 5)]),
    ],
)
def test_gradients_where_operands_have_other_ranks_than_in_the_example(forward, reference, shapes, tmp_path: Path):
    module = _module(
        "op", forward, {"x": {"shape": [4, 5]}, "b": {"shape": [5] if "dim" in forward else [4, 5]}}, tmp_path
    )
    _assert_as_torch(module.op, reference, *shapes)


def test_a_centred_value_over_a_front_dim_is_not_assumed_to_sum_to_zero(tmp_path: Path):
    """A LayerNorm over dim=0: its mean's gradient through the centred value is not dropped as zero where the
    dims as written are other dimensions than the example's."""
    forward = "xc = x - mean(x, dim=0, keepdim=True); xc / sqrt(mean(xc**2, dim=0, keepdim=True) + 1e-5) * w"
    module = _module("norm0", forward, {"x": {"shape": [4, 5]}, "w": {"shape": [5]}}, tmp_path)

    def reference(x, w):
        xc = x - x.mean(0, keepdim=True)
        return xc / torch.sqrt((xc**2).mean(0, keepdim=True) + 1e-5) * w

    for shape in [(4, 5), (2, 3, 5)]:
        _assert_as_torch(module.norm0, reference, shape, (5,))


@pytest.mark.parametrize(
    ("forward", "reference"),
    [
        ("t * exp(x) / sum(exp(x), dim=1, keepdim=True)", lambda x, t: t * torch.softmax(x, 1)),
        ("sum(-t * log_softmax(x, dim=1), dim=1)", lambda x, t: torch.sum(-t * torch.log_softmax(x, 1), 1)),
        ("log_softmax(x, dim=0) + logsumexp(x, dim=0, keepdim=True) * t", None),
    ],
)
def test_the_fused_plan_keeps_dims_as_written(forward, reference, tmp_path: Path, monkeypatch):
    """fuse = true (torch.compile the identity here: the fused plan's own code, which keeps a softmax's
    statistics and shares a log-normalizer, at another rank)."""
    monkeypatch.setattr(torch, "compile", lambda function, **options: function)
    files = generate_op(
        spec_from_mapping(
            {
                "name": "fop",
                "forward": forward,
                "tensors": {"x": {"shape": [4, 5]}, "t": {"shape": [4, 5]}},
                "fuse": True,
            },
            source="fop.toml",
        )
    )
    (tmp_path / "fop.py").write_text(files["fop.py"], encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location(f"_ranks_fop_{next(_counter)}", tmp_path / "fop.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if reference is None:

        def reference(x, t):
            return torch.log_softmax(x, 0) + torch.logsumexp(x, 0, keepdim=True) * t

    _assert_as_torch(module.fop, reference, (2, 3, 4), (2, 3, 4))


# -- matrix products as torch.matmul ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tensors", "shapes"),
    [
        ({"x": {"shape": [16]}, "w": {"shape": [16, 8]}}, [(16,), (16, 8)]),
        ({"x": {"shape": [16]}, "w": {"shape": [16, 8]}}, [(4,), (2, 3, 4, 5)]),  # a vector @ a batch of matrices
        ({"x": {"shape": [8, 16]}, "w": {"shape": [16]}}, [(2, 3, 4), (4,)]),  # a batch of matrices @ a vector
        ({"x": {"shape": [16]}, "w": {"shape": [16]}}, [(5,), (5,)]),  # a dot product
        ({"x": {"shape": [4, 5]}, "w": {"shape": [5, 3]}}, [(2, 1, 4, 5), (3, 5, 2)]),  # both broadcast
        ({"x": {"shape": [4, 5]}, "w": {"shape": [5, 3]}}, [(4, 5), (2, 5, 3)]),  # w's batch: x's gradient summed
        ({"x": {"shape": [2, 4, 5]}, "w": {"shape": [5, 3]}}, [(3, 1, 4, 5), (2, 5, 3)]),
    ],
)
def test_matrix_products_follow_torch_matmul(tensors, shapes, tmp_path: Path):
    module = _module("mm", "x @ w", tensors, tmp_path)
    _assert_as_torch(module.mm, lambda x, w: x @ w, *shapes)


def test_a_product_with_a_transpose_and_a_reduction_at_other_ranks(tmp_path: Path):
    tensors = {"q": {"shape": [8, 16]}, "k": {"shape": [6, 16]}, "v": {"shape": [6, 16]}}
    module = _module("attn", "softmax(q @ transpose(k, -1, -2) / 4, dim=-1) @ v", tensors, tmp_path)

    def reference(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 4, dim=-1) @ v

    _assert_as_torch(module.attn, reference, (2, 3, 8, 16), (6, 16), (3, 6, 16))


# -- ranks the math cannot take ---------------------------------------------------------------------------


def test_a_rank_the_math_cannot_take_is_a_clear_error(tmp_path: Path):
    sq = _module("sq", "sum(x*x, dim=1)", {"x": {"shape": [4, 5]}}, tmp_path)
    message = "sq: x must have at least 2 dimensions (sum over dim=1), got shape (4,)"
    with pytest.raises(ValueError, match=re.escape(message)):
        sq.sq(torch.ones(4))
    with pytest.raises(ValueError, match=re.escape(message)):
        sq.Sq()(torch.ones(4))
    tensors = {"x": {"shape": [8, 16]}, "w": {"shape": [32, 16], "learnable": True}}
    linear = _module("linear", "x @ transpose(w, 0, 1)", tensors, tmp_path)
    message = "linear: x must have at least 2 dimensions (a matrix in x @ transpose(w, 0, 1)), got shape (16,)"
    with pytest.raises(ValueError, match=re.escape(message)):
        linear.Linear()(torch.ones(16))
    message = "linear: w must have at least 2 dimensions (transpose(w, 0, 1)), got shape (16,)"
    with pytest.raises(ValueError, match=re.escape(message)):
        linear.linear(torch.ones(8, 16), torch.ones(16))
    vector = _module("vec", "x @ w", {"x": {"shape": [16]}, "w": {"shape": [16, 8]}}, tmp_path)
    message = "vec: x must have exactly 1 dimension (a vector in x @ w), got shape (2, 16)"
    with pytest.raises(ValueError, match=re.escape(message)):
        vector.vec(torch.ones(2, 16), torch.ones(16, 8))
    softmax = _module("sm", "softmax(x, dim=-3)", {"x": {"shape": [2, 4, 5]}}, tmp_path)
    message = "sm: x must have at least 3 dimensions (softmax over dim=-3), got shape (4, 5)"
    with pytest.raises(ValueError, match=re.escape(message)):
        softmax.sm(torch.ones(4, 5))


def test_ops_without_rank_requirements_have_no_check():
    files = _files("rowsum", "x * sum(x, dim=-1, keepdim=True)", {"x": {"shape": [4, 5]}})
    assert "_check_ranks" in files["rowsum.py"]  # dim=-1 needs a dimension
    assert "_check_ranks" not in _files("full", "x * sum(x, keepdim=True)", {"x": {"shape": [4, 5]}})["full.py"]


def test_check_ranks_compiles_without_graph_breaks(tmp_path: Path):
    module = _module("sq", "sum(x*x, dim=1)", {"x": {"shape": [4, 5]}}, tmp_path)
    compiled = torch.compile(module.sq, backend="eager", fullgraph=True)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(compiled(x), torch.sum(x * x, 1))


# -- the generated test of a second shape ----------------------------------------------------------------

#: Each op broken the way main generated it: dims counted from the back of the example's rank, a full
#: reduction over the example's one dimension, a weight gradient not summed over batch dimensions, a 0-d
#: parameter's gradient summed to ().
BROKEN = {
    "sq": (
        "sum(x*x, dim=1)",
        {"x": {"shape": [4, 5]}},
        [(r"\.sum\(dim=1\)", ".sum(dim=-1)"), (r"\.unsqueeze\(1\)", ".unsqueeze(-1)")],
    ),
    "lse": ("log(sum(exp(x)))", {"x": {"shape": [5]}}, [(r"dim=tuple\(range\(x\.dim\(\)\)\)", "dim=-1")]),
    "linrelu": (
        "Max(x @ transpose(w, 0, 1) + b, 0)",
        {"x": {"shape": [8, 16]}, "w": {"shape": [32, 16], "learnable": True}, "b": {"shape": [32]}},
        [(r"\.sum_to_size\(transposed\.shape\)", "")],
    ),
    # a parameter declared [] whose gradient is the total at every element (right only at a 0-d beta): the
    # second shape gives beta per element, the others' shape; elementwise and structured
    "swish_beta": (
        "x*sigmoid(beta*x)",
        {"x": {"shape": [4, 5]}, "beta": {"shape": [], "learnable": True}},
        [(r"\.sum_to_size\(beta_shape\)", ".sum().expand(beta_shape)")],
    ),
    "swish_rows": (
        "sum(x*sigmoid(beta*x), dim=-1)",
        {"x": {"shape": [4, 5]}, "beta": {"shape": [], "learnable": True}},
        [(r"\.sum_to_size\(beta_shape\)", ".sum().expand(beta_shape)")],
    ),
}


def _broken_ranks(folder: Path) -> GeneratedRun:
    for name, (forward, tensors, mutations) in BROKEN.items():
        for op, broken in ((f"{name}_control", False), (f"{name}_broken", True)):
            for path, text in _files(op, forward, tensors).items():
                if broken and path == f"{op}.py":
                    for pattern, replacement in mutations:
                        text, n = re.subn(pattern, replacement, text)
                        assert n, f"{pattern!r} not in {op}.py"
                (folder / path).write_text(text, encoding="utf-8")
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    return GeneratedRun(folder, ("-k", "second_shape or matches_reference", "-rf", "--tb=no", str(folder)))


@background_run(_broken_ranks)
def test_the_second_shape_test_fails_for_ops_right_at_the_example_rank_only(background_results):
    result = background_results
    failed = set(re.findall(r"FAILED \S*?test_(\w+)\.py::(test_\w+)", result.stdout))
    assert failed == {(f"{name}_broken", "test_second_shape") for name in BROKEN}, result.stdout[-3000:]
    assert f"\n{len(BROKEN)} failed, {3 * len(BROKEN)} passed" in result.stdout, result.stdout[-3000:]
