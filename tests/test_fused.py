"""Fused mode (``fuse = true``): the op's math runs through torch.compile, with an eager fallback.

Compiling takes seconds per op on CPU, so only a few ops are compiled here; speed is measured by
``scaffold bench`` and benchmarks/run.py, not asserted.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch

from scaffold import compile_op, generate_op, write_files

from .conftest import GeneratedRun, background_run, make_spec

SWISH = {"x": {}, "beta": {"shape": [], "learnable": True, "init": 1.0}}


def _load(folder, name):
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_fused_module_is_the_eager_math_behind_torch_compile():
    eager = generate_op(make_spec("swish", "x / (1 + exp(-beta*x))", SWISH), time_limit=None)["swish.py"]
    fused = generate_op(make_spec("swish", "x / (1 + exp(-beta*x))", SWISH, fuse=True), time_limit=None)["swish.py"]
    assert "torch.compile(" not in eager and "Fused(" not in eager
    assert "def _forward(x, beta):" in fused
    assert "def _backward(needs_input_grad, grad_output, x, beta, beta_shape):" in fused  # x needs no sum_to_size
    assert "return _fused_forward(x, beta)" in fused
    # backward computes its gradients by _fused_backward (through the double backward's Function where one is to come)
    assert "gradients = staticmethod(_fused_backward)" in fused
    assert "return _gradients(ctx.needs_input_grad, grad_output, x, beta, beta.shape)" in fused
    # The same math either way: the forward's line and the gradients' lines, in place in eager (stage 6b),
    # as printed in fused mode (the compiler plans its memory; the sigmoid pair from one exp, test below)
    assert "return (beta * x).sigmoid_().mul_(x)" in eager and "return x * torch.sigmoid(beta * x)" in fused
    assert "grad_beta = (tmp2 * x**2).sum_to_size(beta_shape)" in eager  # tmp2 is read again: out of place
    assert "grad_beta = (tmp6 * x**2).sum_to_size(beta_shape)" in fused
    assert "grad_x = tmp0.mul_(tmp2).add_(tmp1)" in eager and "grad_x = tmp0 * tmp6 + tmp5" in fused


def _fused_ops(folder: Path) -> GeneratedRun:
    # gradcheck, gradgradcheck (eager: double backward), torch.func (eager inside transforms), the reference
    for spec in (
        make_spec("swish_fused", "x / (1 + exp(-beta*x))", SWISH, fuse=True),
        make_spec(
            "leaky_fused", "Piecewise((x, x > 0), (alpha*x, True))", scalars={"alpha": {"default": 0.1}}, fuse=True
        ),
        make_spec("logsigmoid_fused", "-log(1 + exp(-x))", fuse=True),
    ):
        write_files(generate_op(spec), folder)
    return GeneratedRun(folder)


@background_run(_fused_ops)
def test_generated_tests_of_fused_ops_pass(background_results):
    result = background_results
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    # The op compiles inside forward: torch's deprecation notices from that stay out of the output too.
    assert "DeprecationWarning" not in result.stdout, result.stdout[-3000:]


def test_fused_op_compiles_once_and_matches_eager(tmp_path):
    write_files(generate_op(make_spec("mul_fused", "x*y", {"x": {}, "y": {"shape": [5]}}, fuse=True)), tmp_path)
    module = _load(tmp_path, "mul_fused")
    x = torch.randn(4, 5, requires_grad=True)
    y = torch.randn(5, requires_grad=True)
    out = module.mul_fused(x, y)
    grad_x, grad_y = torch.autograd.grad(out, (x, y), torch.ones_like(out))
    for fused in (module._fused_forward, module._fused_backward):
        assert len(fused.compiled) == 1 and None not in fused.compiled.values() and not fused.warned
    torch.testing.assert_close(out, x * y)
    torch.testing.assert_close(grad_y, x.sum(0))  # summed back over the broadcast dimension


def test_compile_failure_falls_back_to_eager_with_one_warning(tmp_path, monkeypatch):
    write_files(generate_op(make_spec("exp_fused", "exp(x)", fuse=True)), tmp_path)
    module = _load(tmp_path, "exp_fused")

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch, "compile", broken)
    x = torch.randn(3, requires_grad=True)
    with pytest.warns(UserWarning, match="exp_fused: torch.compile failed, running eagerly for such inputs"):
        out = module.exp_fused(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the backward's own compile fails too; the forward's is not retried
        module._fused_backward.warned = True
        (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
        again = module.exp_fused(x)
    assert list(module._fused_forward.compiled.values()) == [None]
    assert list(module._fused_backward.compiled.values()) == [None]
    torch.testing.assert_close(out, torch.exp(x))
    torch.testing.assert_close(grad, torch.exp(x))
    torch.testing.assert_close(again, out)


def test_a_backward_that_is_one_aten_kernel_runs_eagerly(tmp_path):
    """tanh's and sigmoid's backward is ATen's tanh_backward or sigmoid_backward alone: compiling it fuses
    nothing and adds a compiled call, so fused code compiles the forward only."""
    for forward, one in [("tanh(x)", True), ("1 / (1 + exp(-x))", True), ("tanh(2*x)", False), ("exp(x)", False)]:
        assert compile_op(make_spec("op", forward, fuse=True)).plan.one_kernel is one, forward
    assert not compile_op(make_spec("op", "x*y", {"x": {}, "y": {}}, fuse=True)).plan.one_kernel
    write_files(generate_op(make_spec("tanh_fused", "tanh(x)", fuse=True)), tmp_path)
    module = _load(tmp_path, "tanh_fused")
    assert not hasattr(module, "_fused_backward")
    x = torch.randn(3, 4, requires_grad=True)
    out = module.tanh_fused(x)
    (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
    assert len(module._fused_forward.compiled) == 1 and None not in module._fused_forward.compiled.values()
    torch.testing.assert_close(out, torch.tanh(x))
    torch.testing.assert_close(grad, 1 - torch.tanh(x) ** 2)


def _source_of(text: str, function: str, following: str) -> str:
    return text.split(f"def {function}(")[1].split(following)[0]


def test_fused_code_takes_a_sigmoid_pair_from_one_exp_and_softplus_from_exp_and_log(tmp_path):
    # Inductor computes each sigmoid with an exp and a division, softplus with an exp and a log1p (slower than
    # log on a CPU); eager code keeps PyTorch's one-kernel primitives.
    swish = make_spec("swish_pair", "x / (1 + exp(-beta*x))", SWISH)
    fused = generate_op(dataclasses.replace(swish, fuse=True))["swish_pair.py"]
    backward = _source_of(fused, "_backward", "_fused_forward = ")
    assert "sigmoid" not in backward and backward.count("torch.exp(") == 1
    assert "torch.sigmoid(" in _source_of(generate_op(swish)["swish_pair.py"], "_backward", "class ")
    write_files(generate_op(make_spec("logsig", "-log(1 + exp(-x))", fuse=True)), tmp_path)
    forward = _source_of((tmp_path / "logsig.py").read_text(), "_forward", "def _backward")
    assert "softplus" not in forward and "log1p" not in forward and forward.count("torch.log(") == 1
    # as exact as PyTorch's own, at every scale, and so is autograd of the code (torch.func differentiates
    # backward's code; forward's the same way where it is eager)
    module = _load(tmp_path, "logsig")
    x = torch.tensor([-1e4, -50, -20, -1, -1e-8, 0, 1e-8, 1, 20, 50, 1e4], dtype=torch.float64, requires_grad=True)
    out = module._forward(x)
    torch.testing.assert_close(out, torch.nn.functional.logsigmoid(x), rtol=4e-16, atol=0)
    (grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad, torch.sigmoid(-x), rtol=4e-16, atol=0)
    # -|t| inside the pair's exponential is _neg_abs(t): abs in the compiled kernels, and where autograd may
    # differentiate the code a form whose derivative at 0 is the case t >= 0's, so that torch.func's second
    # derivative (autograd of backward's code) is right at x = 0, where abs' derivative 0 would give
    # sigmoid'(0) = 0
    assert "torch.exp(_neg_abs(" in backward and "torch.abs(" not in backward
    (tmp_path / "swish_pair.py").write_text(fused, encoding="utf-8")
    pair = _load(tmp_path, "swish_pair")
    x = torch.tensor([0.0, -1e-8, 1e-8, -3.0, 2.5, 40.0, -40.0], dtype=torch.float64)
    beta = torch.tensor(1.3, dtype=torch.float64)
    hessian = torch.func.hessian(lambda x, b: pair.swish_pair(x, b).sum(), argnums=(0, 1))(x, beta)
    expected = torch.func.hessian(lambda x, b: (x * torch.sigmoid(b * x)).sum(), argnums=(0, 1))(x, beta)
    for row, expected_row in zip(hessian, expected):
        for block, expected_block in zip(row, expected_row):
            torch.testing.assert_close(block, expected_block, rtol=1e-12, atol=1e-15)


def test_fused_code_squares_erfs_argument_for_its_exponential(tmp_path):
    # Inductor's vectorized erf computes exp(-t*t) inside; the C++ compiler shares it with the derivative's
    # exponential only where that squares the same temporary (gelu's backward: an exp per element less).
    # PyTorch's gelu_backward kernel is written out so here; eager code keeps it.
    specs = {
        "gelu_erf": make_spec("gelu_erf", "x/2*(1 + erf(x/sqrt(2)))"),
        "erf_scaled": make_spec("erf_scaled", "x**2 * erf(a*x)", {"x": {}, "a": {"shape": []}}),
    }
    assert "gelu_backward" in generate_op(specs["gelu_erf"])["gelu_erf.py"]
    x = torch.linspace(-6, 6, 49, dtype=torch.float64)
    grad = torch.randn(49, dtype=torch.float64)
    a = torch.tensor(0.7, dtype=torch.float64)
    for name, spec in specs.items():
        write_files(generate_op(dataclasses.replace(spec, fuse=True)), tmp_path)
        backward = _source_of((tmp_path / f"{name}.py").read_text(), "_backward", "_fused_forward = ")
        assert "gelu_backward" not in backward
        temporary = backward.split("torch.erf(")[1].split(")")[0]
        assert f"torch.exp(-({temporary}**2))" in backward, backward
        module = _load(tmp_path, name)
        if name == "gelu_erf":
            expected = torch.ops.aten.gelu_backward(grad, x)
            (got,) = module._backward((True,), grad, x)
        else:
            t = x.clone().requires_grad_()
            expected = torch.autograd.grad(t**2 * torch.erf(a * t), t, grad)[0]
            got = module._backward((True, False), grad, x, a, a.shape)[0]
        torch.testing.assert_close(got, expected, rtol=1e-14, atol=1e-15)


def test_neg_abs_is_abs_only_where_nothing_differentiates_it(tmp_path):
    # The compiled kernels run with autograd off: there -|t| is -abs(t), one operation. Dynamo traces the same
    # function with autograd on inside an enclosing torch.compile of double backward, and torch.func runs it
    # eagerly: there it is the relu form, whose derivative at 0 is -1.
    write_files(generate_op(make_spec("silu_abs", "x / (1 + exp(-x))", fuse=True)), tmp_path)
    module = _load(tmp_path, "silu_abs")
    assert "def _neg_abs(t):" in (tmp_path / "silu_abs.py").read_text()

    def traced_calls(grad: bool) -> set:
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        torch.compiler.reset()
        with torch.set_grad_enabled(grad):
            out = torch.compile(module._neg_abs, backend=backend, fullgraph=True)(torch.tensor([-2.0, 0.0, 3.0]))
        torch.testing.assert_close(out, torch.tensor([-2.0, 0.0, -3.0]))
        return {getattr(n.target, "__name__", str(n.target)) for g in graphs for n in g.graph.nodes}

    assert "abs" in traced_calls(grad=False) and "relu" not in traced_calls(grad=False)
    assert "relu" in traced_calls(grad=True) and "abs" not in traced_calls(grad=True)
    t = torch.tensor([0.0, -1.0, 2.0], requires_grad=True)
    (slope,) = torch.autograd.grad(module._neg_abs(t).sum(), t)
    torch.testing.assert_close(slope, torch.tensor([-1.0, 1.0, -1.0]))
    slope = torch.func.grad(lambda t: module._neg_abs(t).sum())(t.detach())
    torch.testing.assert_close(slope, torch.tensor([-1.0, 1.0, -1.0]))


def test_fused_plan_reads_the_input_rather_than_a_mask_computed_eagerly():
    # A mask is computed in setup_context, an eager pass outside the compiled kernels (read x, write the mask)
    # that costs more than backward reading x; eager code saves it, 1 byte per element instead of 4.
    leaky = ("leaky", "Piecewise((x, x > 0), (alpha*x, True))")
    scalars = {"alpha": {"default": 0.1}}
    eager = compile_op(make_spec(*leaky, scalars=scalars)).plan
    fused = compile_op(make_spec(*leaky, scalars=scalars, fuse=True)).plan
    assert eager.masks == ("mask",) and eager.saved == ("mask",)
    assert fused.masks == () and fused.saved == ("x",)


#: A dozen shapes of ranks 1 to 3, two with a size of 1 (Dynamo specializes on those).
SHAPES = [(5,), (7,), (3, 4), (6, 5), (2, 3, 4), (3, 5, 2), (9,), (4, 4), (2, 2, 2), (1, 8), (8, 1), (13,)]
#: Which of x and beta need a gradient.
NEEDS = [(True, True), (True, False), (False, True)]


def test_fused_op_stays_compiled_across_dtypes_shapes_and_needed_gradients(tmp_path):
    # Dynamo keeps at most torch._dynamo.config.recompile_limit (8) compiled variants of one code object;
    # float32 and float64 at three ranks and three needs_input_grad patterns are more than that, and an
    # op compiled once for all of them would run eagerly from then on.
    spec = make_spec("swish_kinds", "x / (1 + exp(-beta*x))", SWISH, fuse=True)
    write_files(generate_op(spec), tmp_path / "fused")
    write_files(generate_op(dataclasses.replace(spec, fuse=False)), tmp_path / "eager")
    fused, eager = _load(tmp_path / "fused", "swish_kinds"), _load(tmp_path / "eager", "swish_kinds")
    calls = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no warning about compiling, or falling back
        for dtype in (torch.float32, torch.float64):
            for i, shape in enumerate(SHAPES):
                needs = NEEDS[i % len(NEEDS)]
                x = torch.randn(shape, dtype=dtype, requires_grad=needs[0])
                beta = torch.tensor(1.3, dtype=dtype, requires_grad=needs[1])
                wrt = [t for t, need in zip((x, beta), needs) if need]
                with torch.profiler.profile() as profile:
                    out = fused.swish_kinds(x, beta)
                    grads = torch.autograd.grad(out, wrt, torch.ones_like(out))
                # forward's and backward's compiled code ran, not their eager fallback
                regions = [e for e in profile.events() if e.name.startswith("Torch-Compiled Region")]
                assert len(regions) == 2, (dtype, shape, needs, [e.name for e in profile.events()])
                calls += 1
                expected = eager.swish_kinds(x, beta)
                torch.testing.assert_close(out, expected)
                for grad, want in zip(grads, torch.autograd.grad(expected, wrt, torch.ones_like(expected))):
                    torch.testing.assert_close(grad, want)
    assert calls == 2 * len(SHAPES)
    for function in (fused._fused_forward, fused._fused_backward):
        assert None not in function.compiled.values() and not function.warned
        assert len(function.compiled) < 2 * len(SHAPES)  # sizes other than 1 share compiled code


def test_cli_fuse_and_policy_flags(tmp_path, capsys):
    from scaffold.cli import main

    assert main(["new", "op", "e", "--forward", "exp(x)", "--tensor", "x", "--fuse", "-o", str(tmp_path)]) == 0
    assert '_fused_forward = _runtime.Fused(_forward, "e")' in (tmp_path / "e.py").read_text()
    spec = tmp_path / "r.toml"
    spec.write_text('name = "r"\nforward = "Max(x, 0)"\n\n[tensors.x]\n')
    assert main(["new", "op", "--spec", str(spec), "--policy", "time", "-o", str(tmp_path)]) == 0
    text = (tmp_path / "r.py").read_text()
    # under 'time' backward reads x (no mask computed in forward); under 'memory', the default, a one-byte mask
    assert "ctx.save_for_backward(x)" in text and "mask" not in text and "Fused(" not in text
    assert main(["new", "op", "--spec", str(spec), "-o", str(tmp_path / "memory")]) == 0
    assert "ctx.save_for_backward(mask)" in (tmp_path / "memory" / "r.py").read_text()


@pytest.mark.parametrize(
    "key, message",
    [
        ('policy = "fast"', "policy must be one of 'memory', 'time', got 'fast'"),
        ("fuse = 1", "fuse must be true or false, got 1"),
    ],
)
def test_bad_fuse_or_policy_in_a_spec(tmp_path, capsys, key, message):
    from scaffold.cli import main

    spec = tmp_path / "r.toml"
    spec.write_text(f'name = "r"\nforward = "Max(x, 0)"\n{key}\n\n[tensors.x]\n')
    assert main(["new", "op", "--spec", str(spec), "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "r.py").exists()
