"""The one TOML writer: specs (``spec_to_toml``) and scaffold's records are written by :func:`dumps`.

tomllib reads TOML but does not write it; the documents scaffold writes are small (strings, booleans,
numbers, flat lists of them, and tables of those), so this writes exactly that, in a stable layout: a
table's plain keys first, in order, then its sub-tables, each after a blank line under its dotted header.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}


def dumps(document: Mapping[str, Any], *, comments: Sequence[str] = ()) -> str:
    """``document`` as TOML, after ``comments`` (one ``# ...`` line each). A table that holds only tables
    gets no header of its own (``[tensors.x]``, not ``[tensors]`` then ``[tensors.x]``)."""
    lines = [f"# {comment}" for comment in comments]
    _table(document, (), lines)
    return "\n".join(lines) + "\n"


def _table(table: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    plain = {k: v for k, v in table.items() if not isinstance(v, Mapping)}
    if path and (plain or not table):
        if lines:
            lines.append("")
        lines.append(f"[{'.'.join(_key(k) for k in path)}]")
    lines += [f"{_key(k)} = {_value(v)}" for k, v in plain.items()]
    for key, value in table.items():
        if isinstance(value, Mapping):
            _table(value, (*path, key), lines)


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("-inf" if value < 0 else "inf")
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as TOML")


def _string(text: str) -> str:
    escaped = "".join(_ESCAPES.get(c, f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c) for c in text)
    return f'"{escaped}"'
