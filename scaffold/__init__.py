"""scaffold: custom torch.autograd.Functions derived from their math.

The pipeline, one module per stage: :mod:`~scaffold.spec` -> :mod:`~scaffold.expression` ->
:mod:`~scaffold.derivation` -> :mod:`~scaffold.plan` -> :mod:`~scaffold.printing` ->
:mod:`~scaffold.render` -> :mod:`~scaffold.write`. Generating code imports sympy and jinja2, never torch.
"""

from ._version import __version__
from .api import CompiledOp, compile_op, generate_op
from .errors import ScaffoldError
from .spec import OpSpec, ScalarArg, TensorArg, load_spec, spec_from_flags, spec_from_mapping
from .write import write_files

__all__ = [
    "CompiledOp", "OpSpec", "ScaffoldError", "ScalarArg", "TensorArg", "__version__", "compile_op",
    "generate_op", "load_spec", "spec_from_flags", "spec_from_mapping", "write_files",
]  # fmt: skip
