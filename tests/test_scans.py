"""cumsum and cumprod (issue 34's scans): parsed with a required dim, computed by torch.cumsum/torch.cumprod,
differentiated by derivatives.yaml's rules (cumprod's exact where its input has zeros, and differentiable
again), forward mode too; the ops match torch in value and gradient at two batch ranks and pass their
generated tests."""

from __future__ import annotations

import pytest
import torch

from scaffold.api import compile_op, generate_op
from scaffold.batching import batching
from scaffold.errors import ScaffoldError
from scaffold.structural import CumProd, CumSum
from scaffold.write import write_files

from .conftest import GeneratedRun, background_run, import_generated, make_spec

#: name -> (forward, tensors, torch's reference)
OPS = {
    "exp_cumsum": ("cumsum(exp(x), dim=-1)", {"x": {}}, lambda x: torch.cumsum(torch.exp(x), dim=-1)),
    "running_product": ("cumprod(x, dim=-1)", {"x": {}}, lambda x: torch.cumprod(x, dim=-1)),
    "scan_energy": (
        "sum(cumsum(x*w, dim=0)**2, dim=-1)",
        {"x": {}, "w": {"shape": [5]}},
        lambda x, w: (torch.cumsum(x * w, dim=0) ** 2).sum(dim=-1),
    ),
}


def _inputs(name: str, shape: tuple[int, ...], generator: torch.Generator) -> list[torch.Tensor]:
    tensors = OPS[name][1]
    shapes = [tuple(spec.get("shape", shape)) for spec in tensors.values()]
    return [torch.randn(s, generator=generator, dtype=torch.float64).requires_grad_() for s in shapes]


@pytest.mark.parametrize("shape", [(4, 5), (2, 4, 5)])
@pytest.mark.parametrize("name", list(OPS))
def test_value_and_gradients_match_torch_at_two_ranks(tmp_path, name, shape):
    forward, tensors, reference = OPS[name]
    op = getattr(import_generated(tmp_path, make_spec(name, forward, tensors)), name)
    generator = torch.Generator().manual_seed(0)
    inputs = _inputs(name, shape, generator)
    out = op(*inputs)
    expected = reference(*inputs)
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    grads = torch.autograd.grad(out, inputs, upstream)
    for got, want in zip(grads, torch.autograd.grad(expected, inputs, upstream)):
        torch.testing.assert_close(got, want)


ZEROS = {
    "one zero": [[0.7, -1.3, 0.0, 0.9, 1.1], [1.2, 0.8, -0.6, 1.4, 0.0]],
    "two zeros in a row": [[0.7, 0.0, 0.0, 0.9, 1.1], [0.0, 0.0, -0.6, 1.4, 0.5]],
    "two zeros apart": [[0.0, 1.3, 0.0, 0.9, -1.1], [1.2, 0.0, -0.6, 0.0, 0.5]],
    "three zeros": [[0.0, 1.3, 0.0, 0.0, -1.1], [0.8, 0.0, 0.0, 0.0, 0.5]],
}


@pytest.fixture(scope="module")
def cumprods(tmp_path_factory):
    """cumprod along the last dimension and along the first: the generated ops."""
    folder = tmp_path_factory.mktemp("cumprods")
    return {
        dim: getattr(import_generated(folder, make_spec(f"cumprod_{i}", f"cumprod(x, dim={dim})")), f"cumprod_{i}")
        for i, dim in enumerate((-1, 0))
    }


@pytest.mark.parametrize("zeros", list(ZEROS))
@pytest.mark.parametrize("dim", [-1, 0])
def test_cumprod_is_exact_at_zeros_in_backward_twice_and_in_forward_mode(cumprods, zeros, dim):
    x = torch.tensor(ZEROS[zeros], dtype=torch.float64)
    x = (x if dim == -1 else x.T.contiguous()).requires_grad_()
    op = cumprods[dim]
    torch.testing.assert_close(op(x), torch.cumprod(x, dim=dim))
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    [grad] = torch.autograd.grad(op(x), x, upstream)
    [want] = torch.autograd.grad(torch.cumprod(x, dim=dim), x, upstream)
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad, want)
    assert torch.autograd.gradcheck(op, (x,))
    assert torch.autograd.gradgradcheck(op, (x,))
    tangent = torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    _, jvp = torch.func.jvp(op, (x.detach(),), (tangent,))
    _, want_jvp = torch.func.jvp(lambda t: torch.cumprod(t, dim=dim), (x.detach(),), (tangent,))
    torch.testing.assert_close(jvp, want_jvp)


def test_cumsum_twice_differentiable_and_in_forward_mode(tmp_path):
    op = import_generated(tmp_path, make_spec("scan_square", "cumsum(x, dim=1)**2")).scan_square
    x = torch.randn(3, 4, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(op, (x,))
    assert torch.autograd.gradgradcheck(op, (x,))
    tangent = torch.randn_like(x)
    _, jvp = torch.func.jvp(op, (x.detach(),), (tangent,))
    _, want = torch.func.jvp(lambda t: torch.cumsum(t, dim=1) ** 2, (x.detach(),), (tangent,))
    torch.testing.assert_close(jvp, want)


def test_parsed_as_scan_nodes_with_their_dim():
    program = compile_op(make_spec("both", "cumsum(x, dim=-1) + cumprod(x, dim=0)")).program
    calls = [v.expr for v in program.values if isinstance(v.expr, (CumSum, CumProd))]
    assert sorted((type(c).__name__, c.dim) for c in calls) == [("CumProd", 0), ("CumSum", -1)]
    assert all(v.shape == (4, 5) for v in program.values if isinstance(v.expr, (CumSum, CumProd)))


def _saved(forward: str, **extra) -> list[str]:
    text = generate_op(make_spec("saving", forward, **extra))["saving.py"]
    return [line.strip() for line in text.splitlines() if "ctx.save_for_backward(" in line]


def test_what_backward_saves():
    # cumsum's gradient reads nothing but its own: exp's input, then nothing at all beside a reduction
    assert _saved("cumsum(exp(x), dim=-1)") == ["ctx.save_for_backward(x)"]
    assert _saved("sum(cumsum(x, dim=-1), dim=-1)") == []
    # cumprod's reads its input and result: an output is saved; an intermediate one is computed again from
    # the input under the policy "memory", kept under "time"
    assert _saved("cumprod(x, dim=-1)") == ["ctx.save_for_backward(x, out)"]
    assert _saved("mean(cumprod(sigmoid(x), dim=1), dim=(0, 1))") == ["ctx.save_for_backward(x)"]
    kept = _saved("mean(cumprod(sigmoid(x), dim=1), dim=(0, 1))", policy="time")
    assert kept == ["ctx.save_for_backward(x, running_product)"], kept


@pytest.mark.parametrize(
    ("forward", "message", "hint"),
    [
        ("cumsum(x)", "cumsum() needs the dimension it runs along", "write it as cumsum(x, dim=-1)"),
        ("cumprod(x, dim=-1, keepdim=True)", "cumprod() got 'keepdim', an unknown keyword", "cumprod(x, dim=-1)"),
        ("cumsum(x, -1)", "cumsum() takes one expression and the dimension as keywords", "cumsum(x, dim=-1)"),
        ("cumsum(x, dim=2)", "dim=2 is out of range", "dim counts from 0, or from -1 for the last dimension"),
    ],
)
def test_bad_calls_are_refused_with_how_to_write_them(forward, message, hint):
    with pytest.raises(ScaffoldError) as caught:
        compile_op(make_spec("bad_scan", forward))
    assert message in str(caught.value)
    assert hint in str(caught.value)


@pytest.mark.parametrize(("dim", "one_call"), [(-1, ((True,),)), (0, None)])
def test_the_custom_ops_vmap_rule_is_one_call_over_a_dim_from_the_end(tmp_path, dim, one_call):
    """vmap moves the batch dimension first: a scan along a dim from the end computes the batch in one call
    of the op; along dim=0 (the batch, then) it does not, and the rule calls the op once per item."""
    name = f"scan_vmap{-dim}"  # a module name of its own: import_generated imports it by name
    spec = make_spec(name, f"cumprod(exp(x), dim={dim})", target="custom_op", namespace=f"t_scan{-dim}")
    compiled = compile_op(spec)
    found = batching(compiled.program, compiled.plan.visible, frozenset())
    assert (found and found.one_call) == one_call
    op = getattr(import_generated(tmp_path, spec), name)
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(op)(x), torch.stack([op(item) for item in x]))
    torch.testing.assert_close(op(x[0]), torch.cumprod(torch.exp(x[0]), dim=dim))


#: Causal linear attention (Katharopoulos et al.): the running sums of k v^T and of k, read by each query.
LINEAR_ATTENTION = (
    "kv = cumsum(unsqueeze(k, -1)*unsqueeze(v, -2), dim=-3); num = sum(unsqueeze(q, -1)*kv, dim=-2);"
    " den = sum(q*cumsum(k, dim=-2), dim=-1); num/unsqueeze(den, -1)"
)
POSITIVE = {"shape": [2, 6, 4], "domain": [0.1, 1.0]}
ATTENTION_TENSORS = {"q": POSITIVE, "k": POSITIVE, "v": {"shape": [2, 6, 3]}}


def _linear_attention(q, k, v):
    kv = torch.cumsum(k.unsqueeze(-1) * v.unsqueeze(-2), dim=-3)
    return (q.unsqueeze(-1) * kv).sum(-2) / (q * torch.cumsum(k, dim=-2)).sum(-1, keepdim=True)


@pytest.mark.parametrize("batch", [(), (3,)])
def test_causal_linear_attention_matches_torch(tmp_path, batch):
    op = import_generated(tmp_path, make_spec("linear_attention", LINEAR_ATTENTION, ATTENTION_TENSORS)).linear_attention
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.rand((*batch, 2, 6, 4), generator=generator, dtype=torch.float64) + 0.1 for _ in "qk")
    v = torch.randn((*batch, 2, 6, 3), generator=generator, dtype=torch.float64)
    inputs = [x.requires_grad_() for x in (q, k, v)]
    out, expected = op(*inputs), _linear_attention(*inputs)
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad(out, inputs, upstream), torch.autograd.grad(expected, inputs, upstream)):
        torch.testing.assert_close(got, want)


def _generated(folder):
    # linear attention: backward recomputes kv only for q's gradient (an if-block that once held only a
    # comment), and at its first position q's gradient is 0 exactly, which float32 rounds to noise as plain
    # autograd does (the extreme-input check allows that noise)
    runs = {"linear_attention": GeneratedRun(folder / "linear_attention")}
    write_files(
        generate_op(make_spec("linear_attention", LINEAR_ATTENTION, ATTENTION_TENSORS)),
        runs["linear_attention"].directory,
    )
    for name, (forward, tensors, _) in OPS.items():
        write_files(generate_op(make_spec(name, forward, tensors)), folder / name)
        runs[name] = GeneratedRun(folder / name)
    write_files(generate_op(make_spec("scan_op", "cumprod(x, dim=-1)", target="custom_op")), folder / "scan_op")
    runs["scan_op"] = GeneratedRun(folder / "scan_op")
    return runs


@background_run(_generated)
def test_scans_pass_their_generated_tests(background_results):
    for name, result in background_results.items():
        assert result.returncode == 0, (name, result.stdout[-3000:])
