"""The generated tests catch broken generated code.

Each case generates an op, breaks its module the way a hand-written Function is typically broken, and
requires that op's generated tests to fail; an unbroken control must pass. The module's cases run in one
pytest process, in the suite's background lane (tests/conftest.py), the runtime's each in one of its own.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from scaffold import generate_op, load_spec, write_files
from scaffold.spec import RUNTIME_FILE

from .conftest import SPECS, GeneratedRun, background_run


def _sub(pattern: str, replacement: str, count: int = 1):
    def mutate(text: str) -> str:
        new, n = re.subn(pattern, replacement, text, count=count, flags=re.MULTILINE)
        assert n, f"mutation pattern {pattern!r} did not match"
        return new

    return mutate


MUTATIONS = {
    # (spec, how the module is broken)
    "control": ("swish", lambda text: text),
    "scaled_backward": ("swish", _sub(r"grad_x = (?=tmp0)", "grad_x = 1.01 * ")),
    "wrong_partial": ("quadratic", _sub(r"\(2 \* a \* x \+ b\)", "(2 * a * x - b)")),
    "wrong_forward": (
        "swish",
        _sub(r"return \(beta \* x\)\.sigmoid_\(\)\.mul_\(x\)", "return torch.sigmoid(x).mul_(x)"),
    ),
    # Forward and backward wrong together: finite differences agree, only the reference test can tell.
    "consistently_wrong": (
        "quadratic",
        lambda text: _sub(r"return a \* x\*\*2", "return 2 * a * x**2")(
            _sub(r"\(2 \* a \* x \+ b\)", "(4 * a * x + b)")(
                _sub(r"grad_a = \(grad_output \* x\*\*2\)", "grad_a = (2 * grad_output * x**2)")(text)
            )
        ),
    ),
    "no_broadcast_reduction": (
        "quadratic",
        _sub(r"grad_a = \(grad_output \* x\*\*2\)\.sum_to_size\(a_shape\)", "grad_a = grad_output * x**2"),
    ),
    "ignores_needs_input_grad": ("quadratic", _sub(r"if needs_input_grad\[2\]:", "if True:")),
    "missing_none_return": (
        "smooth_l1",
        _sub(r"return \*grads, None$", "return grads"),
    ),
    "tensor_on_ctx": (
        "swish",
        _sub(r"ctx\.save_for_forward\(x, beta\)", "ctx.save_for_forward(x, beta)\n        ctx.x = x"),
    ),
    # The double backward is derived too: a wrong second partial is caught by gradgradcheck.
    "wrong_second_derivative": (
        "swish",
        _sub(r"\[grad_grad_x \* tmp6 \* x\]", "[grad_grad_x * tmp6 * x * 1.01]"),
    ),
    "double_backward_drops_a_term": (
        "quadratic",
        _sub(r"terms \+= \[grad_grad_a \* tmp1\] if grad_grad_a is not None else \[\]", "pass"),
    ),
    "wrong_kink_side": (
        "smooth_l1",
        _sub(
            r"torch\.where\(beta > torch\.abs\(tmp0\), 1 / beta \* tmp0, torch\.sign\(tmp0\)\)",
            "torch.where(beta > torch.abs(tmp0), torch.sign(tmp0), 1 / beta * tmp0)",
        ),
    ),
    # The textbook formulas agree at ordinary inputs; only the extreme-input test can tell.
    "unstable_forward": (
        "logistic_loss",
        _sub(
            r"return torch\.nn\.functional\.softplus\(-input \* target\)",
            "return torch.log(1 + torch.exp(-input * target))",
        ),
    ),
    "unstable_backward": (
        "logistic_loss",
        _sub(
            r"tmp0 = \(-input \* target\)\.sigmoid_\(\)\.mul_\(grad_output\)",
            "tmp0 = grad_output * torch.exp(-input * target) / (1 + torch.exp(-input * target))",
        ),
    ),
    # Wrong only where |x - y| > w, which no ordinary input reaches: caught at the extreme inputs in float64,
    # the gradient by differences of the op's own value, the value by the reference where it is accurate.
    "wrong_gradient_in_far_branch": (
        "wing_loss",
        _sub(r"\), torch\.sign\(tmp0\)$", "), 0 * tmp0"),
    ),
    "wrong_value_in_far_branch": (
        "wing_loss",
        _sub(r"math\.log\(tmp1 \* w \+ 1\)\)\.sub_\(w\)", "math.log(tmp1 * w + 1)).sub_(2 * w)"),
    ),
    # Forward mode has its own derived code: a wrong jvp is caught by torch.func.jvp and the hessian.
    "wrong_jvp": ("swish", _sub(r"\+ x_tangent \* \(tmp1 ", "+ 1.01 * x_tangent * (tmp1 ")),
    # The Module calls the Function itself, not the twin without jvp: fine in eager and in the compiled
    # functional, refused by Dynamo in a compiled model.
    "module_applies_function_with_jvp": (
        "swish",
        _sub(r"return _apply\(x, self\.beta\)", "return SwishFunction.apply(x, self.beta)"),
    ),
    # A forward that is not a function of its inputs alone (a statistic updated on every call, as a running
    # mean is): checkpoint's recomputation in backward is another forward than the one it replaces.
    "stateful_forward": (
        "swish",
        lambda text: _sub(r"^__all__ = ", "_calls = []\n__all__ = ")(
            _sub(
                r"return \(beta \* x\)\.sigmoid_\(\)\.mul_\(x\)",
                "_calls.append(None)\n        return (beta * x).sigmoid_().mul_(x) * len(_calls)",
            )(text)
        ),
    ),
    # A custom gradient is checked against its formula, and so is its own derivative (double backward).
    "wrong_custom_gradient": (
        "scaled_sign",
        _sub(r"\(torch\.abs\(y\) < 1\)", "(torch.abs(y) < 2)"),
    ),
    "derived_instead_of_custom_gradient": (
        "scaled_sign",
        _sub(
            r"grad_y = \(\n\s*\(grad_output \* x\)\n\s*\.mul_\(\(torch\.abs\(y\) < 1\)\.to\(y\.dtype\)"
            r"\.masked_fill_\(torch\.abs\(y\) == 1, 0\.5\)\)\n",
            "grad_y = ((0 * grad_output)\n",
        ),
    ),
    "wrong_custom_second_derivative": (
        "scaled_sign",
        _sub(r"\(grad_output \* x\)\n", "(grad_output * x.detach())\n"),
    ),
    # A saved intermediate (input - target, returned by forward as a hidden output): a second derivative
    # through it reaches backward as its gradient, which must add to the inputs'.
    "wrong_hidden_output_gradient": (
        "smooth_l1",
        _sub(r"grad_tmp0 = grad_tmp0 \+ grad_tmp0_returned", "grad_tmp0 = grad_tmp0 - grad_tmp0_returned"),
    ),
    "hidden_output_gradient_dropped": (
        "smooth_l1",
        _sub(r"grad_tmp0 = grad_tmp0 \+ grad_tmp0_returned", "pass"),
    ),
    # Several outputs: each has its own gradient and tangent, and the op returns them in order.
    "wrong_gradient_of_second_output": (
        "split_and_transform",
        _sub(r"\(-grad_neg\)\.mul_\(mask\)", "grad_neg.mul(mask)"),
    ),
    "backward_ignores_second_output": (
        "split_and_transform",
        _sub(r"\(-grad_neg\)\.mul_\(mask\)", "(0 * grad_neg).mul_(mask)"),
    ),
    "swapped_outputs": (
        "split_and_transform",
        _sub(r"return pos, neg, mask, mask1", "return neg, pos, mask, mask1"),
    ),
    "wrong_tangent_of_second_output": (
        "split_and_transform",
        _sub(r"neg_tangent = torch\.where\(x < 0, -x_tangent, 0\)", "neg_tangent = torch.where(x < 0, x_tangent, 0)"),
    ),
}
# The runtime (_scaffold_runtime.py) broken: the machinery every op shares, caught by the tests of an op that
# imports it. Each case is a folder of its own, run in a pytest process of its own (one runtime a process).
RUNTIME_MUTATIONS = {
    # The twin that torch.compile traces must not define jvp: Dynamo refuses one.
    "jvp_under_compile": _sub(r', "jvp": torch\.autograd\.Function\.jvp\}', "}"),
    # The twin that the op's own calls run (its forward takes ctx) must set up ctx as setup_context does...
    "twin_without_setup_context": _sub(r"^        function\.setup_context\(ctx, args, output\)$", "        pass"),
    # ...and must not run inside torch.func transforms, which need a Function with setup_context.
    "twin_inside_transforms": _sub(r"return function if transforms_active\(\) else direct", "return direct"),
    # Under autocast the op runs on what it is given, in bfloat16: its output is not the float32 it documents.
    "ignores_autocast": _sub(r"if not \(_any_autocast_enabled\(\) and .*:$", "if True:"),
    # A second derivative through backward's own code: autograd of it, not the derived double backward.
    "double_backward_not_derived": _sub(r"^    return torch\.is_grad_enabled\(\) and not .*$", "    return False"),
}
# Cases that only one generated test can catch, or that the test was written for.
CAUGHT_BY = {
    "scaled_backward": "test_jacrev",
    "module_applies_function_with_jvp": "test_compiled_model",
    "ignores_autocast": "test_autocast",
    "twin_inside_transforms": "test_jacrev",
    "stateful_forward": "test_checkpoint",
    "unstable_forward": "test_extreme_inputs",
    "wrong_gradient_in_far_branch": "test_extreme_inputs_float64",
    "wrong_value_in_far_branch": "test_extreme_inputs_float64",
    "jvp_under_compile": "test_compile",
    "wrong_custom_second_derivative": "test_gradgradcheck",
    "wrong_tangent_of_second_output": "test_forward_mode",
    "backward_ignores_second_output": "test_partly_used_outputs",
}


def _broken_ops(folder: Path) -> dict[str, GeneratedRun]:
    """Every case's files: the module's cases in one folder, one run; the runtime's, each a folder and a run."""
    runs = {}
    for case, mutate in RUNTIME_MUTATIONS.items():
        files = generate_op(dataclasses.replace(load_spec(SPECS / "swish.toml"), name=f"swish_{case}"))
        files[RUNTIME_FILE] = mutate(files[RUNTIME_FILE])
        write_files(files, folder / "runtime" / case)
        runs[case] = GeneratedRun(folder / "runtime" / case, ("-rf", "-k", CAUGHT_BY.get(case, "")))
    for case, (spec_name, mutate) in MUTATIONS.items():
        spec = dataclasses.replace(load_spec(SPECS / f"{spec_name}.toml"), name=f"{spec_name}_{case}")
        files = generate_op(spec)
        module = f"{spec.name}.py"
        files[module] = mutate(files[module])
        write_files(files, folder / "ops")
    # torch.compile's checks (seconds an op) only for the cases they are there to catch
    compiled = [case for case, test in CAUGHT_BY.items() if "compile" in test and case in MUTATIONS]
    runs["ops"] = GeneratedRun(folder / "ops", ("-rf", "-k", " or ".join(["not compile", *compiled])))
    return runs


@background_run(_broken_ops)
def test_generated_tests_catch_broken_code(background_results):
    result = background_results["ops"]
    failed = set(re.findall(r"^FAILED test_(\w+?)\.py::", result.stdout, flags=re.MULTILINE))
    for case, (spec_name, _) in MUTATIONS.items():
        name = f"{spec_name}_{case}"
        if case == "control":
            assert name not in failed, result.stdout[-3000:]
        else:
            assert name in failed, f"the generated tests did not catch {case!r}\n{result.stdout[-3000:]}"
        if case in CAUGHT_BY:
            test = f"FAILED test_{name}.py::{CAUGHT_BY[case]}["
            assert test in result.stdout, f"{CAUGHT_BY[case]} did not catch {case!r}\n{result.stdout[-3000:]}"
    for case in RUNTIME_MUTATIONS:
        result = background_results[case]
        test = f"FAILED test_swish_{case}.py::{CAUGHT_BY.get(case, '')}"
        assert test in result.stdout, f"the generated tests did not catch {case!r}\n{result.stdout[-3000:]}"
