"""``scaffold check``: the command, its targets and its bad input; each kind of bug caught with a verdict that
names it (tests/check_corpus holds the hand-written Functions, right and wrong, that test_check_corpus.py runs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from scaffold.check import CHECKS, EXIT_BAD_INPUT, caller, check_function, smallest_shapes
from scaffold.cli import main
from scaffold.errors import ScaffoldError
from scaffold.spec import spec_from_mapping

SWISH = {
    "name": "swish",
    "forward": "x * sigmoid(beta * x)",
    "tensors": {"x": {"shape": [4, 5]}, "beta": {"shape": []}},
}

FUNCTIONS = '''
import torch


class Swish(torch.autograd.Function):
    """Right: setup_context, needs_input_grad, a gradient summed to beta's shape, differentiable backward."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, beta):
        return x * torch.sigmoid(beta * x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        x, beta = ctx.saved_tensors
        s = torch.sigmoid(beta * x)
        gx = grad * s * (1 + beta * x * (1 - s)) if ctx.needs_input_grad[0] else None
        gb = (grad * x * x * s * (1 - s)).sum_to_size(beta.shape) if ctx.needs_input_grad[1] else None
        return gx, gb


class SavedSigmoid(torch.autograd.Function):
    """The long guide's pattern: sigmoid saved from forward, so backward has no graph back to x through it."""

    @staticmethod
    def forward(ctx, x, beta):
        s = torch.sigmoid(beta * x)
        ctx.save_for_backward(x, beta, s)
        return x * s

    @staticmethod
    def backward(ctx, grad):
        x, beta, s = ctx.saved_tensors
        return grad * (s + beta * x * s * (1 - s)), (grad * x * x * s * (1 - s)).sum_to_size(beta.shape)


class CtxAttribute(Swish):
    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.x, ctx.beta = inputs
        ctx.save_for_backward(*inputs)


class SavedTwice(Swish):
    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_backward(*inputs)


class MutatesSaved(Swish):
    @staticmethod
    def backward(ctx, grad):
        x, beta = ctx.saved_tensors
        s = torch.sigmoid(beta * x)
        gx = grad * s * (1 + beta * x * (1 - s))
        x.mul_(2)
        return gx, (grad * s * (1 - s)).sum_to_size(beta.shape)


class MutatesInput(Swish):
    @staticmethod
    def forward(x, beta):
        bx = x.mul_(beta)  # the caller's x is now beta * x
        return bx * torch.sigmoid(bx) / beta


class MutatesGradOutput(Swish):
    @staticmethod
    def backward(ctx, grad):
        x, beta = ctx.saved_tensors
        s = torch.sigmoid(beta * x)
        gb = (grad * x * x * s * (1 - s)).sum_to_size(beta.shape)
        return grad.mul_(s * (1 + beta * x * (1 - s))), gb


class WrongDerivative(Swish):
    @staticmethod
    def backward(ctx, grad):
        x, beta = ctx.saved_tensors
        s = torch.sigmoid(beta * x)
        return grad * s, (grad * x * x * s * (1 - s)).sum_to_size(beta.shape)


class Matrices(Swish):
    """Takes matrices only (a kernel written for 2-d input)."""

    @staticmethod
    def forward(x, beta):
        if x.dim() != 2:
            raise ValueError(f"expected a matrix, got {x.dim()} dimensions")
        return x * torch.sigmoid(beta * x)


class KeepsMask(Swish):
    """Keeps an intermediate tensor (a mask) as a ctx attribute: a warning, as the values are right."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.positive = inputs[0] > 0


class SquaredNorm(torch.autograd.Function):
    """sum(x**2) over the last dimension, written as dim 1: right for a 2-d x only."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.pow(2).sum(1)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad.unsqueeze(1)


class TooFewReturns(Swish):
    @staticmethod
    def backward(ctx, grad):
        x, beta = ctx.saved_tensors
        s = torch.sigmoid(beta * x)
        return (grad * s * (1 + beta * x * (1 - s)),)


class IgnoresNeedsInputGrad(Swish):
    @staticmethod
    def backward(ctx, grad):
        x, beta = ctx.saved_tensors
        s = torch.sigmoid(beta * x)
        return grad * s * (1 + beta * x * (1 - s)), (grad * x * x * s * (1 - s)).sum_to_size(beta.shape)


class Overflows(Swish):
    """x / (1 + exp(-beta*x)): exp overflows to inf at large -beta*x, where the math is 0."""

    @staticmethod
    def forward(x, beta):
        return x / (1 + torch.exp(-beta * x))

    @staticmethod
    def backward(ctx, grad):
        x, beta = ctx.saved_tensors
        e = torch.exp(-beta * x)
        s = 1 / (1 + e)
        d = e / (1 + e) ** 2
        return grad * (s + beta * x * d), (grad * x * x * d).sum_to_size(beta.shape)


class Raises(Swish):
    @staticmethod
    def backward(ctx, grad):
        x, beta, mask = ctx.saved_tensors
        return grad, grad


class Reordered(Swish):
    """Takes beta first."""

    @staticmethod
    def forward(beta, x):
        return x * torch.sigmoid(beta * x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        beta, x = inputs
        ctx.save_for_backward(x, beta)

    @staticmethod
    def backward(ctx, grad):
        gx, gb = Swish.backward(ctx, grad)
        return gb, gx


def swish(x, beta):
    return Swish.apply(x, beta)


class SwishModule(torch.nn.Module):
    def forward(self, x, beta):
        return Swish.apply(x, beta)


module = SwishModule()


class LearnableSwish(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.beta = torch.nn.Parameter(torch.tensor(1.0))

    def forward(self, x):
        return Swish.apply(x, self.beta)


learnable_swish = LearnableSwish()
'''


@pytest.fixture(scope="module")
def functions(tmp_path_factory):
    folder = tmp_path_factory.mktemp("check")
    (folder / "functions.py").write_text(textwrap.dedent(FUNCTIONS))
    (folder / "swish.toml").write_text(
        'name = "swish"\nforward = "x * sigmoid(beta * x)"\n[tensors.x]\nshape = [4, 5]\n[tensors.beta]\nshape = []\n'
    )
    return folder


def _verdicts(functions, name, checks, spec=SWISH, **kwargs):
    spec = spec_from_mapping(spec, source=spec["name"])
    report = check_function(spec, f"{functions / 'functions.py'}:{name}", checks=checks, **kwargs)
    return {v.check: v for v in report.verdicts}, report


def test_a_right_function_passes_every_check(functions, capsys):
    code = main(["check", f"{functions / 'functions.py'}:Swish", "--spec", str(functions / "swish.toml")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "The Function holds (12 passed)" in out
    assert all(f"ok  {check}" in out for check in CHECKS)


@pytest.mark.parametrize(
    ("name", "check", "words"),
    [
        ("CtxAttribute", "ctx", "forward keeps its inputs or outputs as ctx attributes (ctx.x, ctx.beta)"),
        ("SavedTwice", "ctx", "forward calls ctx.save_for_backward 2 times"),
        ("TooFewReturns", "ctx", "backward returns 1 values for the 2 arguments of forward (x, beta)"),
        ("MutatesSaved", "retain_graph", "backward changes a saved tensor in place (ctx.saved_tensors[0])"),
        ("MutatesInput", "inputs_unchanged", "forward changes its input x in place"),
        ("MutatesGradOutput", "inputs_unchanged", "backward changes grad_output in place"),
        ("WrongDerivative", "gradients", "the gradient of x is"),
        ("WrongDerivative", "gradcheck", "backward disagrees with finite differences"),
        ("Overflows", "extreme_inputs", "in float32 at extreme inputs"),
        ("Raises", "gradients", "backward raised ValueError"),
    ],
)
def test_each_kind_of_bug_fails_with_a_verdict_that_names_it(functions, name, check, words):
    verdicts, report = _verdicts(functions, name, [check])
    assert verdicts[check].status == "fail"
    assert words in verdicts[check].message
    assert report.exit_code() == 1


def test_a_dimension_counted_from_the_wrong_end_fails_at_the_second_shape(functions):
    spec = {"name": "squared_norm", "forward": "sum(x**2, dim=-1)", "tensors": {"x": {"shape": [4, 5]}}}
    verdicts, _ = _verdicts(functions, "SquaredNorm", ["forward", "gradients", "second_shape"], spec=spec)
    assert verdicts["forward"].status == verdicts["gradients"].status == "pass"
    assert verdicts["second_shape"].status == "fail"
    assert verdicts["second_shape"].message == "forward's value has shape (2, 11), the math's (2, 9)"
    assert verdicts["second_shape"].example.startswith("smallest failing input: x of shape (1, 1, 2): [")


def test_no_batch_dimension_is_a_warning_where_other_sizes_hold(functions):
    verdicts, report = _verdicts(functions, "Matrices", ["second_shape"])
    assert verdicts["second_shape"].status == "warn"
    assert verdicts["second_shape"].message.startswith(
        "takes no batch dimension more, which the math does (other sizes pass): forward raised ValueError: "
        "expected a matrix, got 3 dimensions"
    )
    assert report.exit_code() == 0


def test_warnings_fail_only_under_strict(functions):
    checks = ["gradgradcheck", "needs_input_grad"]
    verdicts, report = _verdicts(functions, "SavedSigmoid", checks)
    assert verdicts["gradgradcheck"].status == "warn"
    assert verdicts["gradgradcheck"].message.startswith("not twice differentiable")
    assert report.exit_code() == 0
    verdicts, _ = _verdicts(functions, "KeepsMask", ["ctx"])
    assert verdicts["ctx"].status == "warn"
    assert verdicts["ctx"].message.startswith("forward keeps tensors as ctx attributes (ctx.positive)")
    verdicts, report = _verdicts(functions, "IgnoresNeedsInputGrad", checks, strict=True)
    assert verdicts["needs_input_grad"].message.startswith("backward ignores ctx.needs_input_grad")
    assert report.exit_code() == 1


def test_a_failure_comes_with_the_smallest_input_that_shows_it(functions):
    verdicts, _ = _verdicts(functions, "WrongDerivative", ["gradients"])
    assert verdicts["gradients"].example.startswith("smallest failing input: x of shape (1, 1): [")


def test_smallest_shapes_shrink_equal_sizes_together():
    candidates = smallest_shapes([(4, 5), (5,)])
    assert candidates[0] == [(1, 1), (1,)]
    assert all(shapes[0][1] == shapes[1][0] for shapes in candidates)
    assert [(4, 5), (5,)] in candidates


def test_old_style_functions_skip_torch_func_and_say_why(functions):
    verdicts, _ = _verdicts(functions, "SavedSigmoid", ["torch_func"])
    assert verdicts["torch_func"].status == "skip"
    assert "setup_context" in verdicts["torch_func"].message


@pytest.mark.parametrize("name", ["swish", "module"])
def test_a_function_or_a_module_instance_stands_in(functions, name):
    verdicts, report = _verdicts(functions, name, ["forward", "gradients", "ctx"])
    assert report.exit_code() == 0, verdicts


def test_a_module_takes_the_learnable_tensors_as_its_parameters(functions):
    learnable = {**SWISH, "tensors": {"x": {"shape": [4, 5]}, "beta": {"shape": [], "learnable": True}}}
    verdicts, report = _verdicts(functions, "learnable_swish", ["forward", "gradients", "second_shape"], learnable)
    assert report.exit_code() == 0, verdicts
    with pytest.raises(ScaffoldError, match=r"the Module has no parameter beta \(the spec's learnable tensor\)"):
        _verdicts(functions, "module", ["forward"], learnable)


def test_call_maps_the_arguments(functions):
    verdicts, report = _verdicts(functions, "Reordered", ["forward", "gradients"], call="Reordered.apply(beta, x)")
    assert report.exit_code() == 0, verdicts
    verdicts, report = _verdicts(functions, "Reordered", ["forward"])
    assert "forward" in verdicts["forward"].message and report.exit_code() == 1


def test_call_is_parsed_not_run():
    namespace = {"f": lambda *args: args}
    assert caller("f(x, 2, (y, -1.5))", ["x", "y"], namespace)(10, 20) == (10, 2, (20, -1.5))
    for text, words in [
        ("__import__('os').system('true')", "not a name of the module or an attribute of one"),
        ("open(x)", "open is not defined in the target's module"),
        ("f(x + 1)", "is not a name of the spec"),
        ("f(z)", "z is not an argument of the spec"),
        ("f(x); g()", "cannot read --call"),
        ("f.__class__(x)", "not a name of the module or an attribute of one"),
    ]:
        with pytest.raises(ScaffoldError, match=words.replace("(", r"\(")):
            caller(text, ["x", "y"], namespace)


@pytest.mark.parametrize(
    ("target", "extra", "words"),
    [
        ("missing.py:F", [], "missing.py: file not found"),
        ("functions.py", [], "cannot read the target 'functions.py'"),
        ("functions.py:Nope", [], "Nope is not defined there"),
        ("no_such_module_xyz:F", [], "cannot import it"),
        ("functions.py:Swish", ["--only", "speed"], "no check named speed"),
        ("functions.py:Swish", ["--call", "Swish.apply(q)"], "q is not an argument of the spec"),
    ],
)
def test_bad_input_exits_2_with_a_message(functions, capsys, monkeypatch, target, extra, words):
    monkeypatch.chdir(functions)
    assert main(["check", target, "--spec", "swish.toml", *extra]) == EXIT_BAD_INPUT
    assert words in capsys.readouterr().err


def test_flags_instead_of_a_spec(functions, capsys, monkeypatch):
    monkeypatch.chdir(functions)
    args = ["check", "functions.py:Swish", "--forward", "x * sigmoid(beta * x)", "--tensor", "x=3,4"]
    assert main([*args, "--tensor", "beta=[]", "--only", "forward,gradients"]) == 0
    assert main(["check", "functions.py:Swish", "--tensor", "x"]) == EXIT_BAD_INPUT
    assert "missing --spec, or --forward and --tensor" in capsys.readouterr().err


def test_written_tests_import_a_module_target_from_where_it_was_found(functions, tmp_path, monkeypatch):
    package = tmp_path / "ops"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "acts.py").write_text(textwrap.dedent(FUNCTIONS))
    monkeypatch.chdir(tmp_path)
    spec = str(functions / "swish.toml")
    assert main(["check", "ops.acts:Swish", "--spec", spec, "--write-tests", "tests", "--only", "forward"]) == 0
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_check_swish.py", "-k", "forward"],
        capture_output=True,
        text=True,
        cwd=tmp_path / "tests",
    )
    assert run.returncode == 0 and " passed" in run.stdout, run.stdout + run.stderr  # CPU (and CUDA where there is one)


def test_write_tests_writes_a_pytest_file_that_runs_the_checks(functions, tmp_path, capsys):
    tests = tmp_path / "tests"
    target = f"{functions / 'functions.py'}:WrongDerivative"
    spec = str(functions / "swish.toml")
    assert main(["check", target, "--spec", spec, "--write-tests", str(tests), "--only", "forward"]) == 0
    written = tests / "test_check_swish.py"
    assert "created" in capsys.readouterr().out and written.exists()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(written),
            "-k",
            "cpu and (forward or gradients)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "1 failed, 1 passed" in run.stdout, run.stdout + run.stderr
    assert "gradients: the gradient of x is" in run.stdout
