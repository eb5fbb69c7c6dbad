"""Stage 6a: a long statement's large parts are assigned to named temporaries first; short ones stay."""

from __future__ import annotations

import ast
import math
import re
import textwrap

import torch

from scaffold import generate_op, write_files
from scaffold.temporaries import LIMIT, name_parts

from .conftest import GeneratedRun, background_run, make_spec

#: A where whose branches are a series and a product of transcendentals (found_26's gradient, printed).
SERIES = (
    "-1382 / 58046625 * x ** 10 + 2 / 10395 * x ** 8 - 1 / 675 * x ** 6 + 2 / 189 * x ** 4 - 1 / 15 * x ** 2 + 1 / 3"
)
FAR = "-4 * torch.tanh(x) ** (-2) * torch.sigmoid(2 * x) * torch.sigmoid(-2 * x) + x ** (-2)"
LONG = f"(torch.where(x.abs() < 0.05, {SERIES}, {FAR}) * grad_output).sum_to_size(x.shape)"


def _split(body: str, params: str = "x, grad_output", **returned: str) -> str:
    source = f"def f({params}):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    return textwrap.dedent(name_parts(source, returned).split("\n", 1)[1])


def _run(body: str, params: str = "x, grad_output", **arguments):
    namespace = {"torch": torch, "math": math}
    exec(f"def f({params}):\n" + textwrap.indent(textwrap.dedent(body), "    "), namespace)
    return namespace["f"](**arguments)


def test_a_long_where_reads_its_branches_from_temporaries():
    out = _split(f"grad_x = {LONG}\n")
    assert out == (
        f"grad_x_then = {ast.unparse(ast.parse(SERIES))}\n"
        f"grad_x_else = {ast.unparse(ast.parse(FAR))}\n"
        "grad_x = (torch.where(x.abs() < 0.05, grad_x_then, grad_x_else) * grad_output).sum_to_size(x.shape)\n"
    )
    x, g = torch.linspace(-0.2, 0.2, 9, dtype=torch.float64), torch.rand(9, dtype=torch.float64)
    assert torch.equal(_run(out + "return grad_x\n", x=x, grad_output=g), _run(f"return {LONG}\n", x=x, grad_output=g))


def test_a_short_statement_stays_as_printed():
    body = f"grad_x = torch.where(x > 0, {FAR}, 0) * grad_output\n"
    assert _split(body) == body


def test_a_long_sum_names_its_large_terms_and_keeps_the_small_ones():
    big = [f"torch.exp(x * {k}) * torch.sin(x + {k}) / (1 + x ** 2)" for k in range(1, 4)]
    out = _split(f"return 2 * x + {' + '.join(big)}\n", f="out_tangent")
    assert out.splitlines() == [
        *(f"out_tangent_term{k} = {ast.unparse(ast.parse(t))}" for k, t in enumerate(big)),
        "return 2 * x + out_tangent_term0 + out_tangent_term1 + out_tangent_term2",
    ]


def test_names_are_unique_and_never_shadow_a_name_of_the_module():
    body = f"""\
        grad_x_then = x
        grad_x = {LONG} + grad_x_then
        terms = []
        terms.append({LONG})
        terms.append({LONG})
        return grad_x
    """
    out = _split(body)
    assigned = [line.split(" = ")[0] for line in out.splitlines() if " = " in line]
    assert len(assigned) == len(set(assigned)) == 9
    assert {"grad_x_then1", "part_then", "part_else", "part1_then", "part1_else"} <= set(assigned)
    x, g = torch.linspace(-0.2, 0.2, 9, dtype=torch.float64), torch.rand(9, dtype=torch.float64)
    assert torch.equal(_run(out, x=x, grad_output=g), _run(body, x=x, grad_output=g))


def test_conditional_code_is_not_split():
    body = f"grad_x = ({LONG}) if grad_output is not None else None\n"
    assert _split(body) == body
    body = f"grads = [{LONG} for _ in range(2)]\n"
    assert _split(body) == body


def test_a_comment_and_the_block_stay_with_the_statement():
    out = _split(f"if x is not None:\n    grad_x = {LONG}  # the gradient\n")
    assert out.splitlines()[0] == "if x is not None:"
    assert out.splitlines()[-1].endswith("grad_x_else) * grad_output).sum_to_size(x.shape)  # the gradient")
    assert all(line.startswith("    ") for line in out.splitlines()[1:])


def _statements(source: str) -> list[ast.stmt]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assign | ast.Return | ast.Expr)]


#: found_26's forward: its gradient was one 20-line statement, a where of a series and a tanh/sigmoid product.
COTH_MINUS = make_spec("coth_minus", "1/tanh(x) - 1/x", {"x": {"shape": [4, 5]}})


def _coth_minus(folder):
    write_files(generate_op(COTH_MINUS), folder)
    return GeneratedRun(folder, ("-k", "not cuda"))


def test_a_long_generated_op_reads_in_parts():
    module = generate_op(COTH_MINUS)["coth_minus.py"]
    spans = [s.end_lineno - s.lineno + 1 for s in _statements(module) if not isinstance(s.value, ast.Constant)]
    assert max(spans) <= 10, max(spans)
    assert "grad_x = torch.where(tmp1, grad_x_then, grad_x_else).mul_(grad_output)\n" in module
    assert "return x_tangent * torch.where(tmp1, out_tangent_then, out_tangent_else)" in module
    # the in-place stage still overwrites the named branches' own temporaries
    assert "grad_x_then = (\n        (tmp2**10)\n        .mul_(" in module


@background_run(_coth_minus)
def test_a_long_generated_op_passes_its_tests(background_results):
    """Gradients, double backward, torch.func transforms and torch.compile, with the named parts."""
    result = background_results
    assert result.returncode == 0, result.stdout[-3000:]
    assert re.search(r"\b[1-9]\d* passed", result.stdout), result.stdout[-3000:]


def test_the_limit_is_what_splits():
    """Just over the limit is split, at it not: the threshold is the one documented."""
    term = "torch.exp(x) * torch.sin(x) * torch.cos(x)"  # 5 operations, a large part (PART is 4)
    assert LIMIT == 15
    at_limit = f"y = {term} + {term} + x * x * x * x\n"  # 5 + 5 + 3, and two sums: 15 operations
    assert _split(at_limit) == at_limit
    over = f"y = {term} + {term} + x * x * x * x * x\n"  # 16: the large terms are named, x**5 stays
    assert _split(over).splitlines() == [
        f"y_term0 = {term}",
        f"y_term1 = {term}",
        "y = y_term0 + y_term1 + x * x * x * x * x",
    ]


def test_a_where_names_its_condition_and_both_branches_together():
    """found_9's forward: a where of a long condition, a short branch and a longer one."""
    condition = "torch.where(x > 0, delta >= torch.abs(x - t), delta >= torch.abs(torch.expm1(x) * alpha - t))"
    body = f"return torch.where({condition}, (x - t) ** 2 / 2, delta * (torch.abs(t - x) - delta / 2))\n"
    out = _split(body, "x, t, alpha, delta", f="out")
    assert out.splitlines() == [
        f"out_mask = {condition}",
        "out_then = (x - t) ** 2 / 2",
        "out_else = delta * (torch.abs(t - x) - delta / 2)",
        "return torch.where(out_mask, out_then, out_else)",
    ]
