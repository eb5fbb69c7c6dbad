"""Compile generated ops' Triton row kernels for an H100 (sm_90) on a machine without a GPU: Triton's own
compiler, down to a cubin (its wheel carries ptxas), which checks what the interpreter lets pass (types of
loop-carried values, constexpr branches, casts). Run by tests/test_rows.py in a process of its own, without
TRITON_INTERPRET (triton.language is made for the interpreter or for the GPU when it is imported).

    python tests/rows_compile.py FOLDER DESCRIPTION.json

DESCRIPTION maps each op's module name to {"int64": [tensor names], "scalars": {name: "float"|"int"|"bool"}}.
Each kernel compiles twice: bfloat16 tensors computed in float32, and float64 tensors computed in float64.
Prints one line per kernel and variant; exits 1 on the first failure, naming it.
"""

from __future__ import annotations

import importlib
import json
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

H100 = GPUTarget("cuda", 90, 32)
SCALARS = {"float": "fp32", "int": "i64", "bool": "i1"}
#: (name, the tensors' pointer type, the accumulation constexpr)
VARIANTS = (("bfloat16", "*bf16", tl.float32), ("float64", "*fp64", tl.float64))


def _signature(kernel: JITFunction, op: dict, tensor: str, acc) -> tuple[dict, dict]:
    """Each parameter's type, from its name (scaffold/rows.py names them by what they hold)."""
    signature, constants = {}, {}
    for param in kernel.params:
        name = param.name
        if param.is_constexpr:
            signature[name] = "constexpr"
            constants[(kernel.arg_names.index(name),)] = {"ACC": acc, "BLOCK": 1024}.get(name, True)
        elif name.startswith("p_part_") or (name.startswith("p_d_") and name[4:] not in op["tensors"]):
            signature[name] = "*fp64" if acc == tl.float64 else "*fp32"  # a total's parts and gradient
        elif name.startswith("p_d_") and name[4:] in op["summed"]:
            signature[name] = "*fp64" if acc == tl.float64 else "*fp32"  # a weight's per-program sums
        elif name.startswith("p_"):
            signature[name] = "*i64" if name[2:] in op["int64"] else tensor
        elif name.startswith("v_"):
            signature[name] = SCALARS[op["scalars"][name[2:]]]
        else:
            signature[name] = "i32"  # n_rows, n_cols, rows_per_program
    return signature, constants


def main(folder: str, description: str) -> int:
    sys.path.insert(0, folder)
    ops = json.loads(open(description, encoding="utf-8").read())
    for module_name, op in ops.items():
        module = importlib.import_module(module_name)
        for kernel_name in ("_forward_kernel", "_backward_kernel"):
            kernel = JITFunction(getattr(module, kernel_name))
            for variant, tensor, acc in VARIANTS:
                signature, constants = _signature(kernel, op, tensor, acc)
                try:
                    compiled = triton.compile(ASTSource(kernel, signature, constants), target=H100)
                except Exception as exc:  # noqa: BLE001 - report which kernel, then fail
                    print(f"FAILED {module_name}.{kernel_name} {variant}: {type(exc).__name__}: {exc}")
                    return 1
                print(f"compiled {module_name}.{kernel_name} {variant}: {len(compiled.asm['cubin'])} bytes of cubin")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
