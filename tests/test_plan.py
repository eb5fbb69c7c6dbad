"""The backward plan's cost model, the printer's pass-saving forms and the fused kernels, on generated code."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
import sympy
import torch
from sympy.codegen.cfunctions import log1p

from scaffold import generate_op, lowering, plan, write_files
from scaffold.api import compile_op
from scaffold.plan import OUTPUT
from scaffold.printing import NEG_ABS, print_torch
from scaffold.stable import log_argument, logit, neg_abs, xlog1py, xlogy

from .conftest import make_spec


def _load(tmp_path, spec):
    write_files(generate_op(spec, time_limit=None), tmp_path)
    module_spec = importlib.util.spec_from_file_location(spec.name, tmp_path / f"{spec.name}.py")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[spec.name] = module
    module_spec.loader.exec_module(module)
    return module


def _saved(function, *args):
    """Bytes of the distinct storages autograd keeps for backward, and the result."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = function(*args)
    return storages, out


def test_relu_saves_a_bool_mask_not_its_input(tmp_path):
    plan = compile_op(make_spec("relu", "Max(x, 0)")).plan
    assert plan.masks == ("mask",) and plan.saved == ("mask",) and "mask = x > 0" in plan.forward
    assert plan.saved_notes == ("mask: a bool mask, one byte an element, instead of x, which its condition reads",)
    # a quarter of the bytes of saving x in float32: one bool storage, one byte an element
    module = _load(tmp_path, make_spec("relu", "Max(x, 0)"))
    storages, _ = _saved(module.relu, torch.randn(1000, requires_grad=True))
    assert list(storages.values()) == [(1000, torch.bool)]


def test_leaky_relu_mask_in_generated_code(tmp_path):
    spec = make_spec("leaky", "Piecewise((x, x > 0), (alpha*x, True))", scalars={"alpha": {"default": 0.01}})
    module = _load(tmp_path, spec)
    text = (tmp_path / "leaky.py").read_text()
    assert "mask = x > 0" in text and "ctx.save_for_backward(mask)" in text
    assert "#   mask: a bool mask, one byte an element, instead of x, which its condition reads" in text
    assert "ctx.mark_non_differentiable(mask)" in text
    x = torch.randn(1000, dtype=torch.float64, requires_grad=True)
    storages, out = _saved(module.leaky, x, 0.01)
    assert [dtype for _, dtype in storages.values()] == [torch.bool]
    (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
    # The slope keeps float64: where() over numbers alone would have made it float32 (0.0099999998).
    assert grad[x < 0].unique().tolist() == [0.01]


def test_backward_code_reads_like_the_math(tmp_path):
    # a step multiplies as a bool mask (torch.where(mask, grad_output, 0) took twice the time on a CPU)
    module = _load(tmp_path, make_spec("relu", "Max(x, 0)"))
    text = (tmp_path / "relu.py").read_text()
    backward = text[text.index("def _backward(") :].split("\n\n\n")[0]
    assert "grad_x = grad_output * mask" in backward and "torch.where" not in backward, backward
    x = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(module.relu(x), x, torch.tensor([3.0, 3.0, 3.0], dtype=torch.float64))
    assert grad.tolist() == [0.0, 0.0, 3.0]
    # a straight-through gradient through a Heaviside step is a comparison, with its value 1/2 at the jump
    spec = make_spec("clipped", "x*sign(y)", {"x": {}, "y": {}}, gradients={"y": "grad*x*Heaviside(1 - Abs(y))"})
    module = _load(tmp_path, spec)
    text = (tmp_path / "clipped.py").read_text()
    assert "(torch.abs(y) < 1).to(y.dtype).masked_fill_(torch.abs(y) == 1, 0.5)" in text
    assert "sign_()" not in text
    y = torch.tensor([-2.0, -1.0, 0.5, 1.0], dtype=torch.float64, requires_grad=True)
    x = torch.full_like(y, 2.0)
    (grad,) = torch.autograd.grad(module.clipped(x, y), y, torch.ones_like(y))
    assert grad.tolist() == [0.0, 1.0, 2.0, 1.0]
    # exp(x) * (x < 0) may be inf * 0: that step still selects
    module = _load(tmp_path, make_spec("neg_exp", "Min(exp(x), 1)"))
    assert "torch.where(" in (tmp_path / "neg_exp.py").read_text()
    x = torch.tensor([-1.0, 100.0], requires_grad=True)
    (grad,) = torch.autograd.grad(module.neg_exp(x), x, torch.ones_like(x))
    assert torch.isfinite(grad).all() and grad[1] == 0


def test_mish_is_computed_from_one_sigmoid(tmp_path):
    # PyTorch's mish costs two sigmoids' worth on a CPU, and silu(x) recomputes the sigmoid backward has
    module = _load(tmp_path, make_spec("mish", "x*tanh(log(1 + exp(x)))"))
    text = (tmp_path / "mish.py").read_text()
    forward = text[text.index("def forward(") : text.index("def setup_context(")]
    backward = text[text.index("def _backward(") : text.index("return (grad_x,)")]
    assert "mish(" not in forward.replace("def forward", "") and forward.count("torch.sigmoid(x)") == 1
    assert "silu" not in backward and backward.count("torch.sigmoid(x)") == 1
    x = torch.tensor([-100.0, -20.0, -1.0, 0.0, 1e-3, 1.0, 20.0, 100.0], requires_grad=True)
    out = module.mish(x)
    torch.testing.assert_close(out, torch.nn.functional.mish(x))
    (grad,) = torch.autograd.grad(out.sum(), x)
    (expected,) = torch.autograd.grad(torch.nn.functional.mish(x).sum(), x)
    torch.testing.assert_close(grad, expected)


def test_tanh_reads_its_output_through_the_fused_kernel():
    plan = compile_op(make_spec("t", "tanh(x)")).plan
    assert plan.saved == (OUTPUT,)
    files = generate_op(make_spec("t", "tanh(x)"), time_limit=None)
    assert "torch.ops.aten.tanh_backward(grad_output, out)" in files["t.py"]


def test_mask_not_taken_when_the_input_is_needed_anyway():
    # huber needs the difference in one branch: a mask would add bytes, not remove any. The difference is
    # kept from forward (a hidden output), not recomputed from both inputs.
    forward = "Piecewise((0.5*(x - y)**2, Abs(x - y) <= 1), (Abs(x - y) - 0.5, True))"
    plan = compile_op(make_spec("h", forward, {"x": {}, "y": {}})).plan
    assert plan.masks == () and plan.forward[0] == "tmp0 = x - y"
    assert plan.hidden == ("tmp0",) and plan.saved == ("tmp0",)
    backward = "\n".join(line.text for line in plan.backward)
    assert "torch.abs(tmp0) <= 1" in backward and " x " not in backward and " y " not in backward, backward


def test_policy_time_prefers_fewer_operations(tmp_path):
    memory = compile_op(make_spec("r", "Max(x, 0)")).plan
    time = compile_op(make_spec("r", "Max(x, 0)", policy="time")).plan
    assert memory.saved == ("mask",) and time.saved == ("x",) and time.masks == ()
    # time's forward is the clamp alone, memory's computes the mask beside it; memory keeps a byte an element
    assert time.forward == ("out = torch.clamp(x, min=0)",) and len(memory.forward) == 2
    module = _load(tmp_path, make_spec("r", "Max(x, 0)", policy="time"))
    storages, _ = _saved(module.r, torch.randn(1000, requires_grad=True))
    assert list(storages.values()) == [(4000, torch.float32)]


def test_a_sum_in_several_multiples_is_computed_once(tmp_path):
    """log(cosh(d)) is rewritten d + softplus(-2*d) - log(2), d = input - target; sympy distributes -2*d into
    -2*input + 2*target. The forward computes input - target once and multiplies it."""
    spec = make_spec("log_cosh", "log(cosh(input - target))", {"input": {}, "target": {}})
    source = generate_op(spec, time_limit=None)["log_cosh.py"]
    forward = source[source.index("    def forward(input, target):") :].split("@staticmethod")[0]
    assert "tmp0 = input - target" in forward and "softplus(-2 * tmp0)" in forward, forward
    assert "2 * target" not in forward and "2 * input" not in forward
    module = _load(tmp_path, spec)
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    out = module.log_cosh(x, y)
    torch.testing.assert_close(out, torch.log(torch.cosh(x - y)))
    assert torch.autograd.gradcheck(module.log_cosh, (x, y))


def test_a_temporary_is_read_wherever_its_expression_stands():
    """sympy's cse leaves beta*x inside exp(-alpha**2*exp(2*beta*x) + beta*x) after defining tmp0 = beta*x."""
    spec = make_spec(
        "erfact", "x*erf(alpha*exp(beta*x))", scalars={"alpha": {"default": 0.75}, "beta": {"default": 0.75}}
    )
    source = generate_op(spec, time_limit=None)["erfact.py"]
    backward = source[source.index("def _backward(") :].split("\n\n\n")[0]
    assert "tmp0 = beta * x" in backward and backward.count("beta * x") == 1, backward


def test_the_upstream_gradient_joins_a_shared_factor(tmp_path):
    """swish's gradients in x and beta share grad_output * sigmoid(u) * sigmoid(-u), as reverse mode shares
    it: computed once, with silu(u) written u * sigmoid(u) beside the sigmoid(u) backward has anyway."""
    spec = make_spec(
        "swish", "x / (1 + exp(-beta*x))", {"x": {}, "beta": {"shape": [], "learnable": True, "init": 1.0}}
    )
    source = generate_op(spec, time_limit=None)["swish.py"]
    backward = source[source.index("def _backward(") :].split("\n\n\n")[0]
    # (printed in place: stage 6b writes the products into the sigmoids' results)
    assert "tmp1 = torch.sigmoid(tmp0).mul_(grad_output)" in backward, backward
    assert "tmp2 = (-tmp0).sigmoid_().mul_(tmp1)" in backward and "silu" not in backward, backward
    assert backward.count("grad_output)") == 1 and "grad_output *" not in backward, backward  # in tmp1 only
    module = _load(tmp_path, spec)
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    beta = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(module.swish, (x, beta))
    assert torch.autograd.gradgradcheck(module.swish, (x, beta))


def test_a_product_is_distributed_only_over_bounded_factors():
    """lerp's grad_output * (1 - weight) becomes grad_output - grad_output*weight, sharing grad_output*weight
    with the gradient of y; a product with an unbounded factor stays whole (found_19: two powers that overflow
    in float32, multiplied apart from the tiny factor that kept their product finite)."""
    from scaffold.plan import _distributed

    spec = make_spec("lerp", "x + weight*(y - x)", {"x": {}, "y": {}, "weight": {}})
    source = generate_op(spec, time_limit=None)["lerp.py"]
    backward = source[source.index("def _backward(") :].split("\n\n\n")[0]
    # y - x is a hidden output tmp0; grad_output * weight is its gradient, read by x's and y's
    assert "grad_tmp0 = (grad_output * weight)" in backward and backward.count("grad_output * weight") == 1
    assert "grad_x = (grad_x - grad_tmp0)" in backward and "grad_y = grad_tmp0." in backward, backward
    g, t, s = sympy.symbols("grad_output t s", real=True)
    assert _distributed(g * (1 - s) * sympy.Symbol("u")) == g * sympy.Symbol("u") - g * s * sympy.Symbol("u")
    tamed = g * t**3 * (1 - 2 * (1 + t**2) ** -3) * (1 + t**2) ** -4
    assert _distributed(tamed) == tamed


def test_mish_backward_is_one_sigmoid_and_a_fused_tanh_backward():
    """mish' = t + silu(x) * (1 - t**2), t = tanh(softplus(x)) computed from sigmoid(x): 1 - t**2 is inexact
    only where t dominates the sum, so it stays one fused tanh_backward, not the accurate
    4*sigmoid(2u)*sigmoid(-2u) (accuracy at extreme inputs, first and second order: test_stability's mish
    cases)."""
    spec = make_spec("mish", "x*tanh(log(1 + exp(x)))", {"x": {}})
    source = generate_op(spec, time_limit=None)["mish.py"]
    backward = source[source.index("def _backward(") :].split("\n\n\n")[0]
    assert "torch.ops.aten.tanh_backward(" in backward and backward.count("torch.sigmoid(") == 1, backward
    assert "torch.tanh(" not in backward and "softplus" not in backward, backward
    assert "d out / d x = (1 - tanh(softplus(x))**2)*silu(x) + tanh(softplus(x))" in source


def test_mish_second_derivative_keeps_its_relative_accuracy(tmp_path):
    """Away from t, in the second derivative, 1 - t**2 takes its accurate form: at x = 10 to 14 every term
    of mish'' is about e**-2x, and 1 - t**2 would be 0 in float32 (t rounds to 1)."""
    spec = make_spec("mish", "x*tanh(log(1 + exp(x)))", {"x": {}})
    module = _load(tmp_path, spec)
    x = torch.tensor([10.0, 12.0, 14.0], requires_grad=True)
    (grad,) = torch.autograd.grad(module.mish(x).sum(), x, create_graph=True)
    (second,) = torch.autograd.grad(grad.sum(), x)
    exact = x.detach().double().requires_grad_()
    (exact_grad,) = torch.autograd.grad(
        (exact * torch.tanh(torch.nn.functional.softplus(exact))).sum(), exact, create_graph=True
    )
    (exact_second,) = torch.autograd.grad(exact_grad.sum(), exact)
    torch.testing.assert_close(second.double(), exact_second, rtol=1e-3, atol=0)


def test_the_cost_model_weighs_kernels():
    """tanh costs several multiplies: recomputing it in backward is not one operation."""
    from scaffold.cost import operations_of

    x = sympy.Symbol("x", real=True)
    assert operations_of(sympy.tanh(x), {"x"}) > operations_of(sympy.exp(x), {"x"}) > operations_of(2 * x, {"x"})
    # subexpressions that backward's CSE shares are counted once
    assert operations_of([sympy.tanh(x) * x, sympy.tanh(x) + x], {"x"}) == operations_of(sympy.tanh(x), {"x"}) + 2


def test_silu_and_gelu_become_primitives():
    silu = generate_op(make_spec("s", "x / (1 + exp(-x))"), time_limit=None)["s.py"]
    gelu = generate_op(make_spec("g", "x/2*(1 + erf(x/sqrt(2)))"), time_limit=None)["g.py"]
    assert "return torch.nn.functional.silu(x)" in silu
    assert "return torch.nn.functional.gelu(x)" in gelu and "torch.ops.aten.gelu_backward(grad_output, x)" in gelu
    # The docstring shows the derivative's formula, not the kernel's name.
    assert "gelu_grad" not in gelu


@pytest.mark.parametrize(
    "expr, text",
    [
        ("sqrt(2)*x*exp(-x**2/2)/(2*sqrt(pi))", "math.sqrt(2) / (2 * math.sqrt(math.pi)) * x * torch.exp(-0.5 * x**2)"),
        ("3*x/2", "1.5 * x"),
        ("2*x/3", "2/3 * x"),  # no short decimal: the fraction
        ("x/2", "x / 2"),
        ("-x*y", "-x * y"),
        ("alpha*x*y/3", "alpha / 3 * x * y"),
        ("(alpha + 1)*x", "(alpha + 1) * x"),
        ("1/sqrt(x)", "torch.rsqrt(x)"),
        # a number goes into a sum whose tensor terms have numbers of their own: no pass of its own
        ("2*x*(y/4 + 1)", "x * (y / 2 + 2)"),
        ("x*(26829*y**2 + 200000)/100000", "x * (0.26829 * y**2 + 2)"),
        ("2*x*(y + 1)", "2 * x * (y + 1)"),  # scaling y would be a pass too
    ],
)
def test_numbers_are_multiplied_out_before_touching_a_tensor(expr, text):
    symbols = {n: sympy.Symbol(n, real=True) for n in ("x", "y", "alpha")}
    assert print_torch(sympy.sympify(expr, locals=symbols), {"x", "y"}, where="test").text == text


def test_the_printer_names_the_modules_and_the_modules_own_functions_its_code_calls():
    x = sympy.Symbol("x", real=True)
    printed = print_torch(sympy.exp(neg_abs(x)) + sympy.exp(sympy.Symbol("alpha", real=True)), {"x"}, where="test")
    assert printed.text == "math.exp(alpha) + torch.exp(_neg_abs(x))"
    assert printed.imports == {"math"} and printed.helpers == {NEG_ABS}


def test_no_temporary_is_an_alias_of_another():
    """xexpy's exp(y) is a lowering definition; where exp(y) is also used bare, CSE reduces the definition
    to the temporary it already has. The generated code reads that temporary, with no `tmp2 = tmp1`."""
    files = generate_op(
        make_spec(
            "born_mayer", "A*exp(-r/rho) - C/r**6", {"r": {}, "A": {}}, {"rho": {"default": 1.0}, "C": {"default": 1.0}}
        )
    )
    source = files["born_mayer.py"]
    assert "torch.where(A == 0, tmp1.nan_to_num(), tmp1)" in source
    aliases = re.findall(r"^\s*(tmp\d+) = (tmp\d+)$", source, flags=re.MULTILINE)
    assert not aliases, aliases


def test_double_backward_differentiates_each_gradient_in_each_saved_tensor(tmp_path):
    # tanh's backward reads its output: the double backward differentiates in grad_output and the output,
    # and autograd chains the output's part through tanh itself.
    plan = compile_op(make_spec("tanh_op", "tanh(x)", {"x": {}})).plan
    assert plan.saved == (OUTPUT,)
    assert plan.double_backward.inputs == ("grad_output", OUTPUT)
    module = _load(tmp_path, make_spec("tanh_exp", "x*tanh(exp(x))", {"x": {}}))
    x = torch.tensor([-3.0, 0.5, 100.0], requires_grad=True)
    (grad,) = torch.autograd.grad(module.tanh_exp(x).sum(), x, create_graph=True)
    assert grad.grad_fn.name().startswith("_TanhExpBackward")  # the derived double backward is used
    (second,) = torch.autograd.grad(grad.sum(), x)
    exact = x.detach().double().requires_grad_()
    (exact_grad,) = torch.autograd.grad((exact * torch.tanh(torch.exp(exact))).sum(), exact, create_graph=True)
    (exact_second,) = torch.autograd.grad(exact_grad.sum(), exact)
    # float32 at x = 100: autograd of the gradient's code gave exp(100) * 0 = nan
    torch.testing.assert_close(second.double(), exact_second, rtol=1e-5, atol=1e-6)


def test_too_many_second_partials_leave_the_double_backward_to_autograd():
    forward = " + ".join(f"a{i}*tanh(w{i}*x + b{i})" for i in range(8))
    tensors = {"x": {}, **{f"{p}{i}": {} for i in range(8) for p in "awb"}}
    assert compile_op(make_spec("tanh_sum", forward, tensors)).plan.double_backward is None


def test_a_power_of_a_quotient_takes_in_its_factors(tmp_path):
    # d/dl (x/l)**k by the chain rule is k*(x/l)**(k - 1) * (-x/l**2): 0 * inf at x = 0 for k < 1. Written
    # -k*(x/l)**k/l it is 0 there, and so is its own derivative in l.
    spec = make_spec("weibull", "1 - exp(-(x/lam)**k)", {"x": {}, "lam": {}}, {"k": {"type": "float", "default": 0.5}})
    module = _load(tmp_path, spec)
    x = torch.tensor([0.0, 0.5, 2.0], dtype=torch.float64)
    lam = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(module.weibull(x, lam, 0.5).sum(), lam, create_graph=True)
    (second,) = torch.autograd.grad(grad, lam)
    t = x[1:] / 0.7
    expected = (-0.5 * t**0.5 * torch.exp(-(t**0.5)) / 0.7).sum()
    torch.testing.assert_close(grad.detach(), expected)
    assert torch.isfinite(second)


def test_a_case_distinction_between_numbers_takes_a_float_dtype_not_a_masks(tmp_path):
    # where(mask, 1, mask.new_tensor(0)) is int64 (the mask's new_tensor is bool), and times the scalar q a
    # float32 term inside a float64 gradient: 2.4e-8 off.
    q_default = {"q": {"type": "float", "default": 0.9}}
    spec = make_spec("pinball", "Max(q*(y - x), (q - 1)*(y - x))", {"x": {}, "y": {}}, q_default)
    module = _load(tmp_path, spec)
    assert not re.search(r"mask\d*\.new_tensor", (tmp_path / "pinball.py").read_text())
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0.3, -0.7, 2.5], dtype=torch.float64)
    (grad,) = torch.autograd.grad(module.pinball(x, y, 0.9).sum(), x)
    q = torch.tensor(0.9, dtype=torch.float64)
    torch.testing.assert_close(grad, torch.where(y - x >= 0, -q, 1 - q), rtol=0, atol=1e-15)


def test_a_log_and_the_log1p_of_its_negation_are_one_logarithm_of_the_odds():
    """lowering.one_logarithm_of_odds: c*log(u) - c*log1p(-u) is c*logit(u), and c*log(a / (1 + b)) where
    a and b are u and -u guarded as an xlogy / xlog1py derivative reads them; any other pair of logarithms
    stays two."""
    u, v, c = sympy.symbols("u v c", real=True)
    odds = lowering.one_logarithm_of_odds
    assert odds(c * sympy.log(u) - c * log1p(-u)) == c * logit(u)
    a, b = log_argument(0, 1, u, v), log_argument(-1, 0, -u, 1 - v)
    assert odds(v - sympy.log(a) + log1p(b)) == v - sympy.log(a / (1 + b))
    for other in (
        sympy.log(u) - log1p(-v),  # two arguments
        sympy.log(u) + log1p(-u),  # log(u * (1 - u)), not the odds
        sympy.log(u) - 2 * log1p(-u),  # weights that differ
        sympy.log(log_argument(-1, 0, u, v)) - log1p(-u),  # the guard of a log1p around a log
    ):
        assert odds(other) == other


def test_one_plus_a_guarded_log1p_argument_is_the_guarded_sum():
    """lowering.guarded_sums: 1 + log_argument(-1, 0, y, x) is log_argument(0, 1, t, x), t = 1 + y a
    temporary (the guard reads it twice), where nothing reads the guarded argument otherwise; a log1p of it
    keeps the guard as it is."""
    u, v = sympy.symbols("u v", real=True)
    guarded = log_argument(-1, 0, -u, 1 - v)
    names = iter(sympy.symbols("t0:4"))
    definitions = []
    t0 = sympy.Symbol("t0")
    assert lowering.guarded_sums([v / (1 + guarded)], names, definitions) == [v / log_argument(0, 1, t0, 1 - v)]
    assert definitions == [(t0, 1 - u)]
    read = [v / (1 + guarded) + log1p(guarded)]
    assert lowering.guarded_sums(read, iter(sympy.symbols("t0:4")), []) == read
    # exact: 1 - u is 0 where u is 1 and nowhere else, and both guards give 1 at their point
    for us, vs in (([1.0, 1.0, 0.5, 1 - 2**-24], [1.0, 0.5, 1.0, 1.0]),):
        us, vs = torch.tensor(us), torch.tensor(vs)
        before = 1 + torch.where((1 - vs == 0) & (-us == -1), 0, -us)
        after = torch.where(torch.logical_or(1 - us, 1 - vs), 1 - us, 1)
        assert torch.equal(before, after)


def test_a_negated_product_with_a_log_negates_its_weight():
    """lowering.negated_weights: -xlog1py(1 - y, -p) is xlog1py(y - 1, -p), no negation of the product;
    a weight with no number to take the sign (y) keeps it."""
    p, y = sympy.symbols("p y", real=True)
    assert lowering.negated_weights(-xlog1py(1 - y, -p) - xlogy(y, p)) == xlog1py(y - 1, -p) - xlogy(y, p)
    assert lowering.negated_weights(2 - xlogy(y, p)) == 2 - xlogy(y, p)


def test_a_reciprocal_read_as_a_factor_is_divided_by():
    """plan._divisors: a temporary 1/e read only as a factor is e, and each product divides by it (two
    divisions, not a reciprocal and two multiplies); one read elsewhere (a sum's term) stays a reciprocal,
    and so does one of scalars alone."""
    x, y, z, alpha = sympy.symbols("x y z alpha", real=True)
    scalars = frozenset({alpha})
    steps, (first, second) = plan.straight_line([x / (y + z), x**2 / (y + z)], {"x", "y", "z"}, scalars)
    assert [(s.name, s.expr) for s in steps] == [("tmp0", y + z)]
    assert (str(first), str(second)) == ("x/tmp0", "x**2/tmp0")
    steps, _ = plan.straight_line([x / (y + z), 1 / (y + z) + x], {"x", "y", "z"}, scalars)
    assert [s.expr for s in steps] == [1 / (y + z)]
    steps, _ = plan.straight_line([x / (alpha + 1), y / (alpha + 1)], {"x", "y"}, scalars)
    assert [s.expr for s in steps] == [1 / (alpha + 1)]
