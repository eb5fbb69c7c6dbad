"""argmax/argmin and computed indices (issue 34): ``argmax(e, dim=D)`` and ``argmin`` are int64 values with no
gradient, usable (as are reshapes and slices of int64 indices: ``unsqueeze(t, -1)``) as one_hot's and gather's
index, the domain of valid indices checked where the example's shapes know it; arithmetic on indices is refused.
An output may be int64 indices: returned as int64, marked non-differentiable, left out of the gradient checks.
The NLL over ``unsqueeze(t, -1)`` equals torch's, and VQ-VAE's straight-through quantizer (one_hot of the
nearest code, ``[gradients] z = "grad"``) equals the hand-written one."""

from __future__ import annotations

import re

import pytest
import torch
from torch.nn import functional

from scaffold import generate_op
from scaffold.api import compile_op
from scaffold.errors import ScaffoldError
from scaffold.write import write_files

from .conftest import WITHOUT_COMPILE, GeneratedRun, background_run, import_generated, make_spec

NLL = "-gather(log_softmax(z, dim=-1), dim=-1, index=unsqueeze(t, -1))"
TARGETS = {"shape": [4], "dtype": "int64", "domain": [0, 4]}
DISTANCES = "d = sum(z**2, dim=-1, keepdim=True) - 2*(z @ transpose(codebook, 0, 1)) + sum(codebook**2, dim=-1)"
K = 8
VQ = f"{DISTANCES}\nzq = one_hot(argmin(d, dim=-1), num_classes={K}) @ codebook"
VQ_WITH_INDICES = f"{DISTANCES}\nidx = argmin(d, dim=-1)\nzq = one_hot(idx, num_classes={K}) @ codebook"
# the log-probability of each row's most likely class, and that class
TOP = "idx = argmax(z, dim=-1)\np = log_softmax(z, dim=-1)\nbest = sum(p*one_hot(idx, num_classes=5), dim=-1)"
# z*w where w is smallest along the last dimension (keepdim=True: the index has z's rank)
PICK = "gather(z*w, dim=-1, index=argmin(w, dim=-1, keepdim=True))"


def _nll_spec(name="nll_index"):
    return make_spec(name, NLL, {"z": {"shape": [4, 5]}, "t": dict(TARGETS)})


def _vq_spec(name="vq", forward=VQ, **extra):
    tensors = {"z": {"shape": [4, 3]}, "codebook": {"shape": [K, 3]}}
    gradients = {"z": "grad_zq" if "outputs" in extra else "grad"}
    return make_spec(name, forward, tensors, gradients=gradients, **extra)


def _top_spec(name="top", **extra):
    return make_spec(name, TOP, {"z": {"shape": [4, 5]}}, outputs=["best", "idx"], **extra)


def _pick_spec():
    return make_spec("pick", PICK, {"z": {"shape": [4, 5]}, "w": {"shape": [4, 5]}})


def _saved(directory, name: str) -> str:
    [saved] = re.findall(r"ctx\.save_for_backward\((.*)\)", (directory / f"{name}.py").read_text())
    return saved


@pytest.mark.parametrize(("z_shape", "t_shape"), [((4, 5), (4,)), ((2, 3, 5), (2, 3))])
def test_the_nll_of_an_unsqueezed_index_matches_torch_and_keeps_the_targets(tmp_path, z_shape, t_shape):
    op = import_generated(tmp_path, _nll_spec()).nll_index
    generator = torch.Generator().manual_seed(0)
    z = (torch.randn(z_shape, generator=generator, dtype=torch.float64) * 2).requires_grad_()
    t = torch.randint(0, 5, t_shape, generator=generator)
    out = op(z, t)
    flat = functional.nll_loss(functional.log_softmax(z, -1).reshape(-1, 5), t.reshape(-1), reduction="none")
    expected = flat.reshape(t_shape).unsqueeze(-1)
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(out, z, upstream)[0], torch.autograd.grad(expected, z, upstream)[0])
    # the targets and the log-probabilities (log_softmax's backward reads them, as torch's does); the
    # unsqueezed index is a view computed again from t, and no one-hot matrix or softmax is kept
    assert _saved(tmp_path, "nll_index") == "t, log_probs"


def _nearest_code(z, codebook):
    return torch.cdist(z.reshape(-1, z.shape[-1]), codebook).argmin(-1).reshape(z.shape[:-1])


@pytest.mark.parametrize("z_shape", [(4, 3), (2, 5, 3)])
def test_the_vq_vae_straight_through_quantizer_matches_the_hand_written_one(tmp_path, z_shape):
    op = import_generated(tmp_path, _vq_spec()).vq
    generator = torch.Generator().manual_seed(1)
    z = torch.randn(z_shape, generator=generator, dtype=torch.float64, requires_grad=True)
    codebook = torch.randn(K, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    out = op(z, codebook)
    nearest = _nearest_code(z.detach(), codebook.detach())
    torch.testing.assert_close(out, codebook.detach()[nearest])
    grad = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    grad_z, grad_codebook = torch.autograd.grad(out, (z, codebook), grad)
    torch.testing.assert_close(grad_z, grad)  # straight through
    expected = torch.zeros(K, 3, dtype=torch.float64).index_add(0, nearest.reshape(-1), grad.reshape(-1, 3))
    torch.testing.assert_close(grad_codebook, expected)
    assert _saved(tmp_path, "vq") == "index"  # the nearest codes' indices, not the distances nor the one-hot


def test_int64_indices_as_an_output_are_returned_as_they_are_and_marked_non_differentiable(tmp_path):
    module = import_generated(tmp_path, _vq_spec("vq_idx", VQ_WITH_INDICES, outputs=["zq", "idx"]))
    source = (tmp_path / "vq_idx.py").read_text()
    assert "ctx.mark_non_differentiable(idx)" in source
    assert "grad_idx = torch.zeros" not in source  # its gradient is never filled in nor read
    generator = torch.Generator().manual_seed(2)
    z = torch.randn(2, 5, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    codebook = torch.randn(K, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    nearest = _nearest_code(z.detach(), codebook.detach())
    for zq, idx in (module.vq_idx(z, codebook), module.VqIdx()(z, codebook)):
        assert idx.dtype == torch.int64 and not idx.requires_grad
        assert torch.equal(idx, nearest)
        torch.testing.assert_close(zq, codebook.detach()[nearest])
        (grad_codebook,) = torch.autograd.grad(zq.sum(), codebook)
        torch.testing.assert_close(
            grad_codebook,
            torch.zeros(K, 3, dtype=torch.float64).index_add(
                0, nearest.reshape(-1), torch.ones(10, 3, dtype=torch.float64)
            ),
        )


@pytest.mark.parametrize("z_shape", [(4, 5), (2, 3, 5)])
def test_argmax_gives_torchs_indices_and_no_gradient(tmp_path, z_shape):
    module = import_generated(tmp_path, _top_spec())
    generator = torch.Generator().manual_seed(3)
    z = torch.randn(z_shape, generator=generator, dtype=torch.float64, requires_grad=True)
    best, idx = module.top(z)
    assert idx.dtype == torch.int64 and torch.equal(idx, z.detach().argmax(-1))
    expected = functional.log_softmax(z, -1).amax(-1)
    torch.testing.assert_close(best, expected)
    torch.testing.assert_close(torch.autograd.grad(best.sum(), z)[0], torch.autograd.grad(expected.sum(), z)[0])
    # forward mode: no tangent through the indices, the log-probability's only
    tangent = torch.randn(z_shape, generator=generator, dtype=torch.float64)
    _, (best_tangent, _) = torch.func.jvp(lambda x: module.TopFunction.apply(x)[:2], (z.detach(),), (tangent,))
    _, expected_tangent = torch.func.jvp(lambda x: functional.log_softmax(x, -1).amax(-1), (z.detach(),), (tangent,))
    torch.testing.assert_close(best_tangent, expected_tangent)
    assert "ctx.mark_non_differentiable(idx)" in (tmp_path / "top.py").read_text()


@pytest.mark.parametrize("shape", [(4, 5), (3, 2, 5)])
def test_argmin_with_keepdim_indexes_gather_at_two_ranks(tmp_path, shape):
    op = import_generated(tmp_path, _pick_spec()).pick
    generator = torch.Generator().manual_seed(4)
    z, w = (torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = op(z, w)
    expected = torch.gather(z * w, -1, w.argmin(-1, keepdim=True))
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), (z, w))
    for grad, expected_grad in zip(grads, torch.autograd.grad(expected.sum(), (z, w))):
        torch.testing.assert_close(grad, expected_grad)


def test_argmax_is_printed_as_written_and_as_torch(tmp_path):
    import sympy

    from scaffold.printing import print_torch
    from scaffold.structural import ArgMax, ArgMin, spelled

    x = sympy.Symbol("x", real=True)
    call = ArgMin(x, sympy.Integer(-1), sympy.true)
    assert spelled(call) == "argmin(x, dim=-1, keepdim=True)"
    assert spelled(ArgMax(x, sympy.Integer(0), sympy.false)) == "argmax(x, dim=0)"
    assert print_torch(call, {"x"}, where="test").text == "x.argmin(dim=-1, keepdim=True)"


def test_argmax_asks_for_the_dimension_it_searches_at_every_rank():
    from scaffold.program import rank_requirements

    tensors = {"w": {"shape": [4, 2, 3]}, "z": {"shape": [2, 3, 4]}}
    program = compile_op(make_spec("ranks", "one_hot(argmax(w, dim=-3), num_classes=4) * z", tensors)).program
    [needed] = rank_requirements(program)
    assert (needed.tensor, needed.rank, needed.exact, needed.reason) == ("w", 3, False, "argmax over dim=-3")


@pytest.mark.parametrize(("dim", "one_call"), [(-1, ((True,),)), (0, None)])
def test_the_custom_ops_vmap_rule_is_one_call_for_an_argmax_along_a_dim_from_the_end(tmp_path, dim, one_call):
    from scaffold.batching import batching

    name = f"argmax_vmap{-dim}"
    forward = f"sum(z*one_hot(argmax(z, dim={dim}), num_classes=4), dim={dim})"
    spec = make_spec(name, forward, {"z": {"shape": [4, 4]}}, target="custom_op", namespace=f"t_argmax{-dim}")
    compiled = compile_op(spec)
    found = batching(compiled.program, compiled.plan.visible, frozenset())
    assert (found and found.one_call) == one_call
    op = getattr(import_generated(tmp_path, spec), name)
    z = torch.randn(3, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(op)(z), torch.stack([op(item) for item in z]))
    expected = (z[0] * functional.one_hot(z[0].argmax(dim), 4)).sum(dim)
    torch.testing.assert_close(op(z[0]), expected)


def _refused(forward: str, tensors=None, **extra) -> str:
    with pytest.raises(ScaffoldError) as caught:
        compile_op(make_spec("bad", forward, tensors or {"z": {"shape": [4, 5]}}, **extra))
    return str(caught.value)


def test_one_hot_of_an_argmin_over_more_positions_than_classes_is_refused():
    message = _refused("one_hot(argmin(z, dim=-1), num_classes=4)")
    assert "argmin(z, dim=-1) holds indices up to 4 (in the example), outside 0 to 3, which one_hot refuses" in message
    assert "num_classes must be at least n" in message
    message = _refused(
        "gather(w, dim=-1, index=argmax(z, dim=-1, keepdim=True))", {"z": {"shape": [4, 5]}, "w": {"shape": [4, 3]}}
    )
    assert "outside 0 to 2, which gather refuses" in message and "the size of dim=-1 must be at least n" in message


@pytest.mark.parametrize(
    ("forward", "expected"),
    [
        # arithmetic on indices, and indices read as numbers
        (
            "one_hot(argmax(z, dim=-1) + 1, num_classes=6)",
            "argmax(z, dim=-1) + 1 reads argmax(z, dim=-1), int64 indices, as a number",
        ),
        ("z*argmax(z, dim=-1, keepdim=True)", "reads argmax(z, dim=-1, keepdim=True), int64 indices, as a number"),
        ("sum(argmax(z, dim=-1))", "sum(argmax(z, dim=-1)) reads argmax(z, dim=-1), int64 indices, as a number"),
        ("argmax(argmin(z, dim=-1), dim=-1)", "int64 indices, as a number"),
        # a float expression as an index
        (
            "gather(z, dim=-1, index=z)",
            "gather takes an int64 tensor argument of indices, an argmax or argmin, or a reshape or slice of those",
        ),
        # torch's argmax without dim flattens: refused
        ("one_hot(argmax(z), num_classes=20)", "argmax() needs the dimension it searches along"),
        ("one_hot(argmax(z, dim=-1, keepdim=1), num_classes=5)", "argmax() takes keepdim=True or keepdim=False"),
        ("one_hot(argmax(z, dim=2), num_classes=5)", "dim=2 is out of range"),
    ],
)
def test_indices_used_otherwise_are_refused_saying_what_is_allowed(forward, expected):
    message = _refused(forward)
    assert expected in message
    if "as a number" in expected:
        assert "int64 indices are an int64 tensor argument, argmax(e, dim=D) or argmin(e, dim=D)" in message


def test_an_unsqueezed_index_keeps_its_arguments_domain():
    tensors = {"z": {"shape": [4, 5]}, "t": {"shape": [4], "dtype": "int64", "domain": [0, 5]}}
    message = _refused(NLL, tensors)
    assert "the domain of unsqueeze(t, -1), [0, 5], has indices outside 0 to 4, which gather refuses" in message
    assert "hint: declare domain = [0, 4] for t, or raise the size of dim=-1" in message


def test_an_op_returning_only_indices_is_refused():
    message = _refused("argmax(z, dim=-1)")
    assert "every output is int64 indices, which have no gradient" in message


#: The straight-through hard one-hot (Gumbel-softmax's hard sample without the noise): the one_hot of the argmax
#: forward, z's gradient passed straight through.
HARD = make_spec(
    "hard_one_hot", "one_hot(argmax(z, dim=-1), num_classes=5)", {"z": {"shape": [4, 5]}}, gradients={"z": "grad"}
)


@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 5)])
def test_a_hard_one_hot_is_float_with_a_straight_through_gradient_and_a_zero_tangent(tmp_path, shape):
    op = import_generated(tmp_path, HARD).hard_one_hot
    z = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    out = op(z)
    torch.testing.assert_close(out, functional.one_hot(z.argmax(-1), 5).to(z.dtype))
    upstream = torch.randn(shape, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(out, z, upstream)[0], upstream)
    # forward mode: zeros of the output's dtype (torch.func.jvp refuses a Function's None for a float output)
    _, tangent = torch.func.jvp(op, (z.detach(),), (torch.randn(shape, dtype=torch.float64),))
    torch.testing.assert_close(tangent, torch.zeros(shape, dtype=torch.float64))


#: An int64 argument returned as it is, beside a float output.
PASSED_THROUGH = make_spec(
    "passed_through", "y = x*2; idx = t", {"x": {"shape": [4]}, "t": dict(TARGETS)}, outputs=["y", "idx"]
)


def test_an_int64_argument_returned_as_it_is_is_marked_non_differentiable_with_no_tangent(tmp_path):
    module = import_generated(tmp_path, PASSED_THROUGH)
    source = (tmp_path / "passed_through.py").read_text()
    assert "ctx.mark_non_differentiable(idx)" in source
    x, t = torch.randn(4, dtype=torch.float64), torch.tensor([0, 3, 1, 4])
    y, idx = module.passed_through(x.requires_grad_(), t)
    assert idx.dtype == torch.int64 and not idx.requires_grad and torch.equal(idx, t)
    _, (y_tangent, idx_tangent) = torch.func.jvp(lambda x: module.passed_through(x, t), (x.detach(),), (x.detach(),))
    torch.testing.assert_close(y_tangent, 2 * x.detach())
    assert idx_tangent.dtype == torch.int64  # torch.func gives an integer output no float tangent


def _generated(folder):
    specs = [
        HARD,
        PASSED_THROUGH,  # the reference's one_hot in the float dtype: the generated tests sum it as a float output
        _nll_spec(),
        _vq_spec(),
        _vq_spec("vq_idx", VQ_WITH_INDICES, outputs=["zq", "idx"]),
        _vq_spec("vq_idx_op", VQ_WITH_INDICES, outputs=["zq", "idx"], target="custom_op"),
        _top_spec(),
        _top_spec("top_op", target="custom_op"),  # the custom op's vmap rule batches argmax along dim=-1
        _pick_spec(),
    ]
    runs = {}
    for spec in specs:
        write_files(generate_op(spec), folder / spec.name)
        compiled = spec.name in ("vq", "top_op", "nll_index")
        runs[spec.name] = GeneratedRun(folder / spec.name, () if compiled else WITHOUT_COMPILE)
    return runs


@background_run(_generated)
def test_the_ops_pass_their_generated_tests(background_results):
    for name, result in background_results.items():
        assert result.returncode == 0, (name, result.stdout[-3000:])
