"""Hostile specs: nothing the user writes runs, at generation or when the generated code is imported.

Each attempt either is refused with a clear message or ends up as inert text in the generated files. A
canary file proves nothing ran: every payload would create it.
"""

from __future__ import annotations

import ast
import importlib.util

import pytest

from scaffold import generate_op, load_spec, spec_from_mapping, write_files
from scaffold.errors import ScaffoldError

CANARY = "scaffold_canary"


def _payload(tmp_path) -> str:
    return f"__import__('pathlib').Path({str(tmp_path / CANARY)!r}).touch()"


FORWARDS = [
    "{payload}",
    "x + {payload}",
    "exp(x) if {payload} else x",
    "[x for _ in {payload}]",
    "(lambda: {payload})()",
    "x.__class__.__base__.__subclasses__()",
    "getattr(x, 'real')",
    "eval('1') * x",
    "Symbol('x')",
    "sympify('x')",
    "Piecewise((x, {payload}), (0, True))",
    "exp(x, **{{'evaluate': {payload}}})",
]


@pytest.mark.parametrize("forward", FORWARDS)
def test_hostile_forwards_are_refused_without_running(forward, tmp_path):
    spec_file = tmp_path / "op.toml"
    text = forward.format(payload=_payload(tmp_path))
    spec_file.write_text(f'name = "op"\nforward = {text!r}\n[tensors.x]\n', encoding="utf-8")
    with pytest.raises(ScaffoldError) as info:
        generate_op(load_spec(spec_file))
    assert info.value.message
    assert not (tmp_path / CANARY).exists()


def test_text_fields_are_inert_in_the_generated_files(tmp_path):
    """The doc string and the forward's text reach the generated docstrings: escaped, never code."""
    payload = _payload(tmp_path)
    doc = f'"""\n{payload}\n"""  \\ \' {payload} #'
    spec = spec_from_mapping(
        {"name": "op", "doc": doc, "forward": f"x * 2  # {payload}", "tensors": {"x": {}}}, source="op.toml"
    )
    write_files(generate_op(spec), tmp_path / "out")
    module_path = tmp_path / "out" / "op.py"
    tree = ast.parse(module_path.read_text(encoding="utf-8"))
    assert payload in ast.get_docstring(tree)  # there, as text
    module_spec = importlib.util.spec_from_file_location("hostile_op", module_path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    assert not (tmp_path / CANARY).exists()
    # the forward's text, its comment included, is the module docstring's formula; the Function's docstring,
    # derived math, is intact after it
    assert "op(x) = x * 2 #" in module.__doc__ and module.__doc__.count(payload) == 3  # wrapped after the #
    assert module.OpFunction.__doc__.startswith("Op's forward and its derived backward and jvp.")
    assert "d out / d x = 2" in module.OpFunction.__doc__


@pytest.mark.parametrize(
    "table",
    [
        '[tensors."x = 1\\nimport os"]',
        '[tensors."x): pass\\n#"]',
        "[scalars.alpha]\ndefault = \"__import__('os')\"",
    ],
)
def test_hostile_names_and_defaults_are_refused(table, tmp_path):
    spec_file = tmp_path / "op.toml"
    spec_file.write_text(f'name = "op"\nforward = "x"\n[tensors.x]\n{table}\n', encoding="utf-8")
    with pytest.raises(ScaffoldError):
        generate_op(load_spec(spec_file))
    assert not (tmp_path / CANARY).exists()
