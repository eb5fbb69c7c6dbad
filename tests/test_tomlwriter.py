"""The one TOML writer: what it writes reads back as the document it was given."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from scaffold.spec import spec_to_toml
from scaffold.tomlwriter import dumps

from .conftest import make_spec

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

_PLAIN = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(),
)
_VALUES = st.one_of(_PLAIN, st.lists(st.one_of(st.floats(allow_nan=False), st.integers(-5, 5)), max_size=4))
_TABLES = st.recursive(
    st.dictionaries(st.text(min_size=1), _VALUES, max_size=4),
    lambda tables: st.dictionaries(st.text(min_size=1), st.one_of(_VALUES, tables), max_size=4),
    max_leaves=12,
)


@given(_TABLES)
def test_what_dumps_writes_reads_back(document):
    assert tomllib.loads(dumps(document)) == document


def test_layout_plain_keys_then_tables_and_comments():
    text = dumps(
        {"tensors": {"x": {"shape": [4, 5]}}, "name": "op", "files": {"src/a.py": "a.py.base"}}, comments=["c"]
    )
    assert text == '# c\nname = "op"\n\n[tensors.x]\nshape = [4, 5]\n\n[files]\n"src/a.py" = "a.py.base"\n'


def test_non_finite_floats():
    assert tomllib.loads(dumps({"a": math.inf, "b": -math.inf}))["b"] == -math.inf
    assert math.isnan(tomllib.loads(dumps({"n": math.nan}))["n"])


def test_a_spec_is_written_as_before():
    spec = make_spec("op", "x * a", {"x": {"shape": [3], "domain": [0.0, 1.0]}}, {"a": {"type": "int", "default": 2}})
    assert spec_to_toml(spec) == (
        'name = "op"\nforward = "x * a"\n\n[tensors.x]\nshape = [3]\ndomain = [0.0, 1.0]\n\n'
        '[scalars.a]\ntype = "int"\ndefault = 2\n'
    )
