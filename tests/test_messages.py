"""Messages that suggest the fix: the full list of functions, hints for Python forms the language refuses
(``%``, ``.T``, methods, ``if ... else``), did-you-mean for spec keys and flags, and ``--domain``."""

from __future__ import annotations

import ast
import inspect
import keyword

import pytest

from scaffold import cli, expression, functions, structural
from scaffold.api import generate_op
from scaffold.errors import ExpressionError, SpecError
from scaffold.expression import parse_forward
from scaffold.spec import load_spec, spec_from_flags, spec_with_flags
from scaffold.write import write_files

from .conftest import WITHOUT_COMPILE, GeneratedRun, background_run, make_spec


def _refusal(forward: str, **scalars) -> str:
    with pytest.raises(ExpressionError) as raised:
        parse_forward(make_spec("m", forward, {"x": {}, "y": {}}, scalars or None))
    return str(raised.value)


def _hinted_functions() -> set[str]:
    return set(_refusal("nope(x)").split("supported: ")[1].split(", "))


def _taken_as_a_call(name: str) -> bool:
    try:
        parse_forward(make_spec("m", f"{name}(x)"))
    except ExpressionError as exc:
        return "unknown function" not in str(exc)
    return True


def test_the_hint_names_every_function_the_registries_and_the_parser_take():
    hinted = _hinted_functions()
    registries = {*functions.spellings(), *structural.SPELLINGS, "Piecewise", "where"}
    assert registries <= hinted, sorted(registries - hinted)
    # Every name the parser's source spells that it takes as a call is hinted: a spelling dispatched on
    # there (``if name == "foo"``) cannot be left out of the list.
    source = ast.parse(inspect.getsource(expression))
    spelt = {
        n.value
        for n in ast.walk(source)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier()
    }
    taken = {name for name in spelt - {"x"} if not keyword.iskeyword(name) and _taken_as_a_call(name)}
    assert taken <= hinted, sorted(taken - hinted)
    # and every hinted name is one the parser takes as a call
    assert {name for name in hinted if not _taken_as_a_call(name)} == set()


@pytest.mark.parametrize(
    ("forward", "meant"), [("sigmod(x)", "sigmoid"), ("sofmax(x, dim=-1)", "softmax"), ("tanhh(x)", "tanh")]
)
def test_misspelt_functions_get_did_you_mean(forward, meant):
    assert f"hint: did you mean {meant!r}? supported: " in _refusal(forward)


@pytest.mark.parametrize(
    ("forward", "message", "hint"),
    [
        (
            "x % 2",
            "the operator '%' is not allowed",
            "write x - 2*floor(x/2) for the remainder; floor's derivative is 0",
        ),
        ("(x + 1) // y", "the operator '//' is not allowed", "write floor((x + 1)/y); floor's derivative is 0"),
        ("x.T", "attribute access ('.') is not allowed", "write transpose(x, -2, -1)"),
        ("x.t()", "only functions can be called", "write transpose(x, -2, -1)"),
        ("x.transpose(0, 1)", "only functions can be called", "write transpose(x, 0, 1)"),
        ("x.exp()", "only functions can be called", "write exp(x)"),
        ("x.sum(-1)", "only functions can be called", "write sum(x, dim=-1)"),
        ("(x * y).sum(-1, keepdim=True)", "only functions can be called", "write sum(x * y, dim=-1, keepdim=True)"),
        ("x.clamp(min=0)", "only functions can be called", "write clamp(x, min=0)"),
        ("x.pow(2)", "only functions can be called", "write x**2"),
        ("torch.exp(x)", "only functions can be called", "write exp(x), without 'torch.'"),
        ("F.softmax(x, dim=-1)", "only functions can be called", "write softmax(x, dim=-1), without 'F.'"),
        ("x.grad", "attribute access ('.') is not allowed", "use numbers, argument names"),
    ],
)
def test_refused_python_forms_hint_what_to_write(forward, message, hint):
    text = _refusal(forward)
    assert message in text
    assert f"hint: {hint}" in text


def test_if_else_hints_piecewise_with_a_bool_scalar_and_where():
    text = _refusal("x if flag else -x", flag={"default": True})
    assert "an 'if ... else' expression is not allowed" in text
    assert "Piecewise((x, flag), (-x, True))" in text
    assert "--scalar flag=true" in text
    assert "where(flag, x, -x)" in text
    # the form the hint names is one the parser takes
    parse_forward(make_spec("m", "Piecewise((x, flag), (-x, True))", scalars={"flag": {"default": True}}))


def test_the_readme_writes_no_if_else_the_parser_refuses():
    readme = (expression.__file__.rsplit("/scaffold/", 1)[0]) + "/README.md"
    assert "x if flag else -x" not in open(readme, encoding="utf-8").read()


# --- did you mean: spec keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "message", "hint"),
    [
        ('name = "op"\nforwrd = "x"\n[tensors.x]\n', "op.toml: unknown key 'forwrd'", "did you mean 'forward'?"),
        ('name = "op"\nforward = "x"\n[tensor.x]\n', "op.toml: unknown key 'tensor'", "did you mean 'tensors'?"),
        (
            'name = "op"\nforward = "x"\n[tensors.x]\nshpe = [3]\ndomian = [1, 2]\n',
            "op.toml: tensors.x: unknown keys 'domian', 'shpe'",
            "did you mean 'domain' for 'domian', 'shape' for 'shpe'?",
        ),
        (
            'name = "op"\nforward = "a*x"\n[tensors.x]\n[scalars.a]\ndefualt = 1.0\n',
            "op.toml: scalars.a: unknown key 'defualt'",
            "did you mean 'default'?",
        ),
        ('name = "op"\nforward = "x"\ncolour = 1\n[tensors.x]\n', "unknown key 'colour'", "allowed keys here: doc,"),
    ],
)
def test_unknown_spec_keys_suggest_the_nearest(tmp_path, toml, message, hint):
    (tmp_path / "op.toml").write_text(toml)
    with pytest.raises(SpecError) as raised:
        load_spec(tmp_path / "op.toml")
    text = str(raised.value)
    assert message in text
    assert f"hint: {hint}" in text
    assert "allowed keys here: " in text


# --- did you mean: command-line flags ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "unknown", "hint"),
    [
        (["new", "op", "t", "--forwad", "x", "--tensor", "x"], "--forwad x", "did you mean --forward?"),
        (["new", "op", "t", "--forward", "x", "--tensr", "x"], "--tensr x", "did you mean --tensor?"),
        (
            ["new", "op", "t", "--forwad", "x", "--tensr", "x"],
            "--forwad x --tensr x",
            "did you mean --forward for --forwad, --tensor for --tensr?",
        ),
        (["check", "a.py:F", "--forwrd", "x", "--tensor", "x"], "--forwrd x", "did you mean --forward?"),
        (["update", "op", "t", "--domian", "x=1,2"], "--domian x=1,2", "did you mean --domain?"),
    ],
)
def test_unknown_flags_suggest_the_nearest(capsys, args, unknown, hint):
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    assert exited.value.code == 2  # argparse's usage error, as before
    err = capsys.readouterr().err
    assert f"error: unrecognized arguments: {unknown}\n  hint: {hint}" in err
    assert err.startswith("usage: scaffold " + " ".join(a for a in args[:2] if not a.startswith("a.py")).strip())


def test_unknown_flags_with_nothing_near_keep_argparse_s_message(capsys, tmp_path):
    with pytest.raises(SystemExit) as exited:
        cli.main(["new", "op", "t", "--forward", "x", "--tensor", "x", "--zzzzz", "-o", str(tmp_path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "error: unrecognized arguments: --zzzzz\n" in err
    assert "hint" not in err
    assert not list(tmp_path.iterdir())


def test_abbreviated_flags_still_work(capsys, tmp_path):
    assert cli.main(["new", "op", "t", "--forw", "x * 2", "--tens", "x", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "t.py").is_file()


# --- --domain ------------------------------------------------------------------------------------------------


def test_domain_flag_sets_the_tensor_s_domain():
    spec = spec_from_flags("op", "log(x) * w", ["x", "w"], domains=["x=0.5,4"])
    assert {t.name: t.domain for t in spec.tensors} == {"x": (0.5, 4.0), "w": None}
    spec = spec_from_flags("op", "log(x) * w", ["x"], learnable=["w"], domains=["w=-1,1"])
    assert {t.name: t.domain for t in spec.tensors} == {"x": None, "w": (-1.0, 1.0)}


def test_domain_flag_on_update_changes_only_the_domain():
    spec = spec_from_flags("op", "log(x) * w", ["x=1,5", "w"], domains=["x=0.5,4"])
    updated = spec_with_flags(spec, domains=["x=[1, 2]"])
    assert {t.name: (t.domain, t.shape) for t in updated.tensors} == {"x": ((1.0, 2.0), (1, 5)), "w": (None, (4, 5))}


@pytest.mark.parametrize(
    ("domains", "message", "hint"),
    [
        (["y=1,2"], "--domain y=1,2: 'y' is not a tensor argument (tensors: x)", "declare it with --tensor y"),
        (["xx=1,2"], "--domain xx=1,2: 'xx' is not a tensor argument (tensors: x)", "did you mean 'x'?"),
        (["x=1"], "--domain x=1: cannot read the domain 'x=1'", "write T=LOW,HIGH, two finite numbers"),
        (["x"], "--domain x: cannot read the domain 'x'", "write T=LOW,HIGH"),
        (["x=a,b"], "cannot read the domain 'x=a,b'", "write T=LOW,HIGH"),
        (["x=1,inf"], "cannot read the domain 'x=1,inf'", "write T=LOW,HIGH"),
        (["x=3,1"], "the domain's low end 3 is not below its high end 1", "write the lower end first: --domain x=1,3"),
        (["x=1,1"], "the domain's low end 1 is not below its high end 1", "give two different ends"),
        (["x=1,2", "x=2,3"], "--domain x is given twice", "give each argument once"),
    ],
)
def test_bad_domain_flags_say_what_is_wrong(domains, message, hint):
    with pytest.raises(SpecError) as raised:
        spec_from_flags("op", "sqrt(x)", ["x"], domains=domains)
    text = str(raised.value)
    assert message in text
    assert f"hint: {hint}" in text


#: Real nowhere scaffold looks for test inputs by itself: it needs a declared domain.
SHIFTED = "sqrt(sin(x) + x - 10)"


def test_the_domain_hint_can_be_followed_on_the_command_line(tmp_path, capsys):
    """The hint names --domain, which fixes it: the generated tests draw x there."""
    args = ["new", "op", "shifted", "--forward", SHIFTED, "--tensor", "x", "-o", str(tmp_path)]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert "--domain x=1.0,2.0 on the command line" in err
    assert "domain = [1.0, 2.0] in the spec's [tensors.x]" in err
    assert cli.main([*args, "--domain", "x=11,12"]) == 0, capsys.readouterr().err
    assert "x: uniform in [11.0, 12.0] (declared in the spec)" in (tmp_path / "test_shifted.py").read_text()


def _shifted(folder):
    write_files(generate_op(spec_from_flags("shifted", SHIFTED, ["x"], domains=["x=11,12"])), folder)
    return GeneratedRun(folder, WITHOUT_COMPILE)


@background_run(_shifted)
def test_an_op_given_a_domain_by_flag_passes_its_generated_tests(background_results):
    assert background_results.returncode == 0, background_results.stdout[-3000:]


def test_domain_with_a_spec_file_is_refused(tmp_path, capsys):
    (tmp_path / "op.toml").write_text('name = "op"\nforward = "log(x)"\n[tensors.x]\n')
    args = ["new", "op", "--spec", str(tmp_path / "op.toml"), "--domain", "x=1,2", "-o", str(tmp_path)]
    assert cli.main(args) == 1
    assert "--spec cannot be combined with --domain" in capsys.readouterr().err


def test_update_op_takes_domain_into_the_spec_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new", "project", "demo", "--defaults", "--data", "project_name=demo-ops"]) == 0
    monkeypatch.chdir(tmp_path / "demo")
    assert cli.main(["new", "op", "lg", "--forward", "log(x)", "--tensor", "x", "--domain", "x=0.5,3"]) == 0
    assert "domain = [0.5, 3.0]" in (tmp_path / "demo" / "specs" / "lg.toml").read_text()
    assert cli.main(["update", "op", "lg", "--domain", "x=1,2"]) == 0, capsys.readouterr().err
    spec = (tmp_path / "demo" / "specs" / "lg.toml").read_text()
    assert "domain = [1.0, 2.0]" in spec and "0.5" not in spec
    assert cli.main(["update", "op", "lg", "--domain", "w=1,2"]) == 1
    assert "--domain w=1,2: 'w' is not a tensor argument (tensors: x)" in capsys.readouterr().err
