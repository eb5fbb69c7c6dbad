"""ignore_index written by ``where`` (issue 34): inside ``where(t == k, a, b)``'s ``b``, ``where(t != k, a, b)``'s
``a``, or a product with the mask ``(t != k)``, a one_hot or gather of t reads ``torch.where(t == k, 0, t)``, so an
ignored target outside [0, C) (torch's -100, or -1 declared in the domain) gives torch's cross-entropy and NLL, not
an index error. k is a literal or an int scalar; anywhere else an index outside the domain's valid range is still
refused."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from scaffold import generate_op
from scaffold.errors import ScaffoldError
from scaffold.write import write_files

from .conftest import WITHOUT_COMPILE, GeneratedRun, background_run, import_generated, make_spec

CE = "logsumexp(z, dim=-1) - sum(z*one_hot(t, num_classes=5), dim=-1)"
NLL = "-squeeze(gather(log_softmax(z, dim=-1), dim=-1, index=unsqueeze(t, -1)), -1)"
LOGITS = {"shape": [4, 5]}
TARGETS = {"shape": [4], "dtype": "int64", "domain": [0, 4]}
WITH_IGNORED = {**TARGETS, "domain": [-1, 4]}  # -1 drawn by the generated tests
SHAPES = [(6, 5), (2, 3, 5)]


def _targets(shape: tuple[int, ...], ignored: int, generator: torch.Generator) -> torch.Tensor:
    t = torch.randint(0, 5, shape[:-1], generator=generator)
    t.view(-1)[::3] = ignored
    return t


def _assert_torchs(out, z, expected):
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(expected.shape, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(out, z, upstream)[0], torch.autograd.grad(expected, z, upstream)[0])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("written", ["inline", "steps"])
def test_cross_entropy_ignores_torchs_default_index_outside_the_domain(tmp_path, shape, written):
    forward = f"where(t == -100, 0, {CE})" if written == "inline" else f"ce = {CE}; where(t == -100, 0, ce)"
    op = import_generated(tmp_path, make_spec(f"ce_{written}", forward, {"z": LOGITS, "t": TARGETS}))
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
    t = _targets(shape, -100, generator)
    expected = functional.cross_entropy(z.reshape(-1, 5), t.reshape(-1), reduction="none").reshape(t.shape)
    _assert_torchs(getattr(op, f"ce_{written}")(z, t), z, expected)


@pytest.mark.parametrize("shape", SHAPES)
def test_nll_with_the_ignored_index_in_the_domain(tmp_path, shape):
    op = import_generated(
        tmp_path, make_spec("nll_ignored", f"where(t != -1, {NLL}, 0)", {"z": LOGITS, "t": WITH_IGNORED})
    ).nll_ignored
    generator = torch.Generator().manual_seed(1)
    z = torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
    t = _targets(shape, -1, generator)
    log_p = functional.log_softmax(z, dim=-1).reshape(-1, 5)
    expected = functional.nll_loss(log_p, t.reshape(-1), ignore_index=-1, reduction="none").reshape(t.shape)
    _assert_torchs(op(z, t), z, expected)


def test_the_mean_over_targets_not_ignored_is_torchs_mean(tmp_path):
    forward = f"valid = t != -100; ce = {CE}; sum(where(valid, ce, 0)) / sum(valid)"
    op = import_generated(tmp_path, make_spec("ce_mean", forward, {"z": LOGITS, "t": TARGETS})).ce_mean
    generator = torch.Generator().manual_seed(2)
    for shape in SHAPES:
        z = torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
        t = _targets(shape, -100, generator)
        _assert_torchs(op(z, t), z, functional.cross_entropy(z.reshape(-1, 5), t.reshape(-1)))


MASKED_MEAN = f"valid = t != -1; ce = {CE}; sum(valid*ce) / sum(valid)"


def test_a_mask_times_the_loss_ignores_the_index_too(tmp_path):
    # (t != k)*ce is 0 wherever t is k, whatever the one_hot read there: ce reads a valid index in its place
    op = import_generated(tmp_path, make_spec("masked_mean", MASKED_MEAN, {"z": LOGITS, "t": WITH_IGNORED}))
    generator = torch.Generator().manual_seed(4)
    for shape in SHAPES:
        z = torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
        t = _targets(shape, -1, generator)
        expected = functional.cross_entropy(z.reshape(-1, 5), t.reshape(-1), ignore_index=-1)
        _assert_torchs(op.masked_mean(z, t), z, expected)


def test_the_ignored_index_may_be_an_int_scalar(tmp_path):
    scalars = {"ignore_index": {"type": "int", "default": -100}}
    spec = make_spec("ce_scalar", f"where(t == ignore_index, 0, {CE})", {"z": LOGITS, "t": TARGETS}, scalars)
    op = import_generated(tmp_path, spec).ce_scalar
    z = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    t = _targets((6, 5), 3, torch.Generator().manual_seed(3))
    _assert_torchs(op(z, t, 3), z, functional.cross_entropy(z, t, ignore_index=3, reduction="none"))
    t[::3] = -100
    _assert_torchs(op(z, t), z, functional.cross_entropy(z, t, reduction="none"))


@pytest.mark.parametrize(
    "forward",
    [
        CE,  # no where at all
        f"where(t == -1, {CE}, 0)",  # the branch where t is -1
        f"where(t == 2, 0, {CE})",  # another index ignored: -1 still reaches one_hot
        f"exp(where(t == -1, 0, 1)) * ({CE})",  # no factor is 0 where t is -1
    ],
)
def test_an_index_outside_the_range_where_nothing_ignores_it_is_refused(forward):
    with pytest.raises(ScaffoldError, match=r"\[-1, 4\], has indices outside 0 to 4"):
        generate_op(make_spec("unguarded", forward, {"z": LOGITS, "t": WITH_IGNORED}))


def _generated(folder):
    specs = {
        "nll_ignored": make_spec("nll_ignored", f"where(t != -1, {NLL}, 0)", {"z": LOGITS, "t": WITH_IGNORED}),
        "ce_ignored": make_spec("ce_ignored", f"where(t == -1, 0, {CE})", {"z": LOGITS, "t": WITH_IGNORED}),
        "masked_mean": make_spec("masked_mean", MASKED_MEAN, {"z": LOGITS, "t": WITH_IGNORED}),
    }
    for name, spec in specs.items():
        write_files(generate_op(spec), folder / name)
    return {name: GeneratedRun(folder / name, () if name == "ce_ignored" else WITHOUT_COMPILE) for name in specs}


@background_run(_generated)
def test_ops_that_ignore_an_index_their_tests_draw_pass_their_generated_tests(background_results):
    for name, result in background_results.items():
        assert result.returncode == 0, (name, result.stdout[-3000:])
