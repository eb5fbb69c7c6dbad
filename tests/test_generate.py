"""Generated files: golden outputs, determinism, lint-clean, and the generated tests pass."""

from __future__ import annotations

import ast
import difflib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaffold import generate_op, load_spec, write_files
from scaffold.formatting import format_source

from .conftest import SPECS, GeneratedRun, background_run, import_generated, make_spec

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_OPS = ["swish", "quadratic", "smooth_l1", "swish_custom"]
UPDATE = os.environ.get("SCAFFOLD_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("name", GOLDEN_OPS)
def test_golden(name):
    """Set SCAFFOLD_UPDATE_GOLDEN=1 to rewrite the golden files after an intended change."""
    files = generate_op(load_spec(SPECS / f"{name}.toml"))
    for path, text in files.items():
        golden = GOLDEN / path
        if UPDATE:
            golden.write_text(text, encoding="utf-8")
            continue
        expected = golden.read_text(encoding="utf-8")
        if text != expected:
            diff = "".join(
                difflib.unified_diff(
                    expected.splitlines(True), text.splitlines(True), f"golden/{path}", f"generated/{path}"
                )
            )
            pytest.fail(f"generated {path} differs from the golden file:\n{diff}")


@pytest.mark.parametrize("spec_file", sorted(SPECS.glob("*.toml")), ids=lambda p: p.stem)
def test_rendering_is_deterministic_and_parses(spec_file):
    spec = load_spec(spec_file)
    first, second = generate_op(spec), generate_op(spec)
    assert first == second
    for path, text in first.items():
        ast.parse(text, filename=path)
        assert "TODO" not in text


# Scaffold's own style outside a project: ruff's defaults with a line length of 120. ``ruff check`` runs
# ruff's default rules (import order and ``__all__`` order among them) and pycodestyle's whitespace rules.
STANDALONE_RUFF = ["--no-cache", "--isolated", "--line-length", "120"]


def ruff(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize("name", GOLDEN_OPS)
def test_golden_files_are_formatted(name):
    """A second pass of the formatter changes nothing, and ruff finds nothing to format or fix."""
    for path in (f"{name}.py", f"test_{name}.py"):
        text = (GOLDEN / path).read_text(encoding="utf-8")
        assert format_source(text, path, modules={name: f"{name}.py"}) == text, f"{path} changes when formatted again"
    files = [f"{name}.py", f"test_{name}.py"]
    formatted = ruff("format", "--check", *STANDALONE_RUFF, *files, cwd=GOLDEN)
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr
    checked = ruff("check", *STANDALONE_RUFF, "--extend-select", "W,I", *files, cwd=GOLDEN)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_generated_code_passes_ruff(tmp_path):
    """Every generated file is as ``ruff format`` leaves it and ``ruff check`` finds nothing in it."""
    for spec_file in sorted(SPECS.glob("*.toml")):
        write_files(generate_op(load_spec(spec_file)), tmp_path)
    formatted = ruff("format", "--check", *STANDALONE_RUFF, ".", cwd=tmp_path)
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr
    checked = ruff("check", *STANDALONE_RUFF, "--extend-select", "W,I", ".", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


#: The specs whose compile checks run as users run them, with inductor (generating C++ on the CPU, seconds an op):
#: a learnable parameter and a Module, and several outputs. The others' trace with aot_eager.
INDUCTOR_SPECS = ("swish", "split_and_transform")


def _every_spec(folder: Path) -> dict[str, GeneratedRun]:
    for spec_file in sorted(SPECS.glob("*.toml")):
        backend = "inductor" if spec_file.stem in INDUCTOR_SPECS else "aot_eager"
        write_files(generate_op(load_spec(spec_file)), folder / backend)
    return {backend: GeneratedRun(folder / backend, compile_backend=backend) for backend in ("inductor", "aot_eager")}


@background_run(_every_spec)
def test_generated_tests_pass(background_results):
    for result in background_results.values():
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        assert " passed" in result.stdout
        # Torch's own deprecation notices (torch.func's use of torch.jit.script) do not reach the user.
        assert "warning" not in result.stdout.lower(), result.stdout[-3000:]


def test_generation_does_not_import_torch():
    code = (
        "import sys, scaffold\n"
        f"scaffold.generate_op(scaffold.load_spec({str(SPECS / 'swish.toml')!r}))\n"
        "assert 'torch' not in sys.modules, 'generation imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_saves_exactly_what_backward_reads():
    from scaffold import compile_op
    from scaffold.spec import spec_from_flags

    def saved(forward, *tensors):
        return compile_op(spec_from_flags("op", forward, list(tensors))).plan.saved

    assert saved("exp(x)", "x") == ("out",)  # d/dx exp(x) is the output itself
    assert saved("x + y", "x", "y") == ()  # gradients are grad_output alone
    assert saved("x * y", "x", "y") == ("x", "y")
    assert saved("a * x**2 + b * x + c", "x", "a", "b", "c") == ("x", "a", "b")
    assert saved("Max(x, 0) * y", "x", "y") == ("x", "y")


def test_written_files_follow_the_umask_and_keep_their_own_mode(tmp_path):
    # mkstemp's temporary files are 0600: moved into place as they are, generated files (and a user's
    # file that an update rewrites) would become unreadable to group and others.
    old = os.umask(0o022)
    try:
        write_files({"a.py": "x = 1\n", "b.py": "y = 1\n"}, tmp_path)
        assert (tmp_path / "a.py").stat().st_mode & 0o777 == 0o644
        (tmp_path / "b.py").chmod(0o640)
        write_files({"b.py": "y = 2\n"}, tmp_path, force=True)
        assert (tmp_path / "b.py").stat().st_mode & 0o777 == 0o640
        assert (tmp_path / "b.py").read_text() == "y = 2\n"
        os.umask(0o077)
        write_files({"c.py": "z = 1\n"}, tmp_path)
        assert (tmp_path / "c.py").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_refusing_to_overwrite_names_the_cli_flag_and_the_keyword(tmp_path):
    from scaffold.errors import WriteError

    write_files({"a.py": "x = 1\n"}, tmp_path)
    with pytest.raises(WriteError) as caught:
        write_files({"a.py": "x = 2\n"}, tmp_path)
    assert "--force" in caught.value.hint and "force=True" in caught.value.hint


@pytest.mark.parametrize(
    "forward", ["x / (1 + Abs(x))", "log(x) * sqrt(x)", "Piecewise((x**2 / 2, Abs(x) < 1), (Abs(x) - 1 / 2, True))"]
)
def test_a_one_tensor_ops_test_file_is_short(forward):
    # The checks live in scaffold.testing; the file holds the op's particulars and one line per check.
    text = generate_op(make_spec("op", forward, {"x": {}}))["test_op.py"]
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) <= 70, text


def test_text_reaches_ruff_and_back_as_utf8_whatever_the_locale(monkeypatch):
    import locale

    monkeypatch.setattr(locale, "getpreferredencoding", lambda do_setlocale=True: "ascii")
    monkeypatch.setattr(locale, "getencoding", lambda: "ascii", raising=False)
    spec = make_spec("double", "2 * x", doc="Doubles x: «exactly» 2·x ≤ ∞.")
    files = generate_op(spec, time_limit=None)
    assert "Doubles x: «exactly» 2·x ≤ ∞." in files["double.py"]


def test_a_plain_call_runs_the_functions_twin_whose_forward_takes_ctx(tmp_path, monkeypatch):
    """Function.apply binds the arguments to forward's signature (inspect's Python, tens of microseconds
    after a large kernel) for a Function with setup_context, on every call. The op's own calls run a twin
    whose forward takes ctx, which it does not bind; torch.func transforms, which need setup_context, get
    the Function itself."""
    import torch

    tensors = {"x": {}, "beta": {"shape": [], "learnable": True, "init": 1.0}}
    module = import_generated(tmp_path, make_spec("swish_direct", "x / (1 + exp(-beta*x))", tensors))
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    beta = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    bound = []
    bind = inspect.Signature.bind
    monkeypatch.setattr(inspect.Signature, "bind", lambda self, *a, **k: bound.append(self) or bind(self, *a, **k))

    out = module.swish_direct(x, beta)
    assert type(out.grad_fn).__name__ == "_SwishDirectFunctionDirectBackward" and not bound
    grads = torch.autograd.grad(out.sum(), (x, beta))
    expected = torch.autograd.grad(module.SwishDirectFunction.apply(x, beta).sum(), (x, beta))
    torch.testing.assert_close(grads, expected, rtol=0, atol=0)
    # forward mode outside torch.func: the twin's jvp, from what its forward saved for it
    tangent = torch.randn(5, dtype=torch.float64)
    with torch.autograd.forward_ad.dual_level():
        dual = module.swish_direct(torch.autograd.forward_ad.make_dual(x.detach(), tangent), beta.detach())
        jvp = torch.autograd.forward_ad.unpack_dual(dual).tangent
    _, expected_jvp = torch.func.jvp(lambda x: module.swish_direct(x, beta.detach()), (x.detach(),), (tangent,))
    torch.testing.assert_close(jvp, expected_jvp)
    # inside torch.func transforms, the Function itself (its forward's signature bound by Function.apply)
    grad_x = torch.func.grad(lambda x: module.swish_direct(x, beta).sum())(x)
    torch.testing.assert_close(grad_x, grads[0])
    assert bound


def _jvp(function, primals, tangents):
    """Forward mode outside torch.func: the tangent of ``function``'s output, where only the inputs whose
    tangent is not None are dual (jvp gets zeros for the others, autograd's default)."""
    from torch.autograd import forward_ad

    with forward_ad.dual_level():
        args = [p if t is None else forward_ad.make_dual(p, t) for p, t in zip(primals, tangents)]
        return forward_ad.unpack_dual(function(*args)).tangent


def test_one_outputs_jvp_is_one_sum_of_each_tangent_times_its_partial(tmp_path):
    """A Function that keeps autograd's default ctx.set_materialize_grads(True) gets zeros in jvp for an
    input without a tangent (torch.func's jvp and jacfwd give every input one): one output's jvp is one sum,
    without None checks, lists or broadcasting (every tensor input is in the forward, and its tangent has
    its shape), and setup_context keeps no output shape for it."""
    import torch

    tensors = {"x": {"shape": [3, 4]}, "beta": {"shape": [4]}}
    module = import_generated(tmp_path, make_spec("swish_sum", "x / (1 + exp(-beta*x))", tensors))
    jvp = inspect.getsource(module.SwishSumFunction.jvp)
    assert "x_tangent * (" in jvp and "terms" not in jvp and "None" not in jvp and "broadcast" not in jvp
    assert "output_shape" not in inspect.getsource(module)
    x, beta = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    for tangents in [(torch.randn_like(x), None), (None, torch.randn_like(beta)), (x.sin(), beta.cos())]:
        given = [torch.zeros_like(p) if t is None else t for p, t in zip((x, beta), tangents)]
        _, expected = torch.func.jvp(lambda x, beta: x * torch.sigmoid(beta * x), (x, beta), tuple(given))
        torch.testing.assert_close(_jvp(module.swish_sum, (x, beta), tangents), expected)


def test_a_jvp_without_a_flat_arguments_term_broadcasts_and_one_of_a_lone_tangent_is_a_view(tmp_path):
    """Where a term is zero (flat in x away from the jump) the sum leaves it out (the other term has the
    output's shape); where the output is an input itself (returned as a view of it), jvp returns a view of its
    tangent, as autograd requires of a Function whose forward returns a view."""
    import torch

    tensors = {"x": {"shape": [3, 4]}, "y": {"shape": [4]}}
    flat = import_generated(tmp_path / "flat", make_spec("flat_in_x", "sign(x) * y", tensors))
    assert "return y_tangent * torch.sign(x)" in inspect.getsource(flat.FlatInXFunction.jvp)
    x, y = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    tangent = torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(_jvp(flat.flat_in_x, (x, y), (None, tangent)), torch.sign(x) * tangent)
    torch.testing.assert_close(_jvp(flat.flat_in_x, (x, y), (x.cos(), None)), torch.zeros(3, 4, dtype=torch.float64))

    same = import_generated(tmp_path / "same", make_spec("same_x", "x", {"x": {}}))
    assert "return x_tangent.view_as(x_tangent)" in inspect.getsource(same.SameXFunction.jvp)
    torch.testing.assert_close(_jvp(same.same_x, (x,), (x.cos(),)), x.cos())


def test_backward_reads_a_saved_inputs_shape_from_it_and_keeps_only_the_others_on_ctx():
    """setup_context keeps on ctx the shape of a tensor input that is not saved; a saved one's backward
    reads from the tensor itself."""
    swish = (GOLDEN / "swish.py").read_text()
    assert "_shape = " not in swish
    assert "return _gradients(ctx.needs_input_grad, grad_output, x, beta, beta.shape)" in swish  # x's: the output's
    quadratic = (GOLDEN / "quadratic.py").read_text()  # c is not saved: backward's gradient of it is grad_output's
    assert "ctx.c_shape = c.shape" in quadratic and "ctx.x_shape" not in quadratic
    assert "x, a, b, x.shape, a.shape, b.shape, ctx.c_shape)" in quadratic


def test_a_second_derivative_skips_the_terms_of_a_gradient_nothing_differentiates(tmp_path):
    """_NAMEBackward gets None for a gradient that nothing differentiates (grad_y, below) and skips its
    terms, where zeros would multiply its partials: 0 * inf is nan where one is infinite (the partial of
    grad_y in x, x / sqrt(y) at y = 0), in a gradient that is differentiated (x's)."""
    import torch

    module = import_generated(tmp_path, make_spec("sqrt_scaled", "x**2 * sqrt(y)", {"x": {}, "y": {}}))
    assert "terms += [grad_grad_y * " in inspect.getsource(module._SqrtScaledBackward.backward)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0.0, 4.0], dtype=torch.float64, requires_grad=True)
    (grad_x,) = torch.autograd.grad(module.sqrt_scaled(x, y).sum(), x, create_graph=True)
    (second,) = torch.autograd.grad(grad_x.sum(), x)
    torch.testing.assert_close(second, 2 * torch.sqrt(y.detach()), rtol=0, atol=0)


def test_a_jvp_term_with_a_minus_is_subtracted(tmp_path):
    import torch

    module = import_generated(tmp_path, make_spec("minus", "x - y**2", {"x": {}, "y": {}}))
    assert "return x_tangent - 2 * y * y_tangent" in inspect.getsource(module.MinusFunction.jvp)
    x, y = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    tangents = (torch.randn_like(x), torch.randn_like(y))
    torch.testing.assert_close(_jvp(module.minus, (x, y), tangents), tangents[0] - 2 * y * tangents[1])
