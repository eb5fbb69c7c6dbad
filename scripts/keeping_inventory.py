"""What backward keeps: the elementwise plan against the structured path's, op by op (issue 33's inventory).

    python scripts/keeping_inventory.py                          # the catalogue and the realistic corpus
    python scripts/keeping_inventory.py --ops swish,mse --all    # every op named, not only the differing ones

Issue 33 ports every op to the structured path (rules -> dataflow -> templates/program_op.py.j2); one
planner must then save no more than today's elementwise one (plan.make_plan). For each op of the catalogue
and the realistic corpus, under the policies "memory" and "time", this script plans the op both ways in this
process: ``compile_op(spec).plan`` (the elementwise BackwardPlan), then forced through the structured path
as scripts/one_pipeline_probe.py forces it (the ProgramPlan: ``saved``, ``masks``, ``recomputed`` and
``parameter_shapes``). A saved tensor costs four bytes an element (float32), a mask one. It prints the ops
where the structured path keeps more bytes, grouped by a cause read off the two plans:

* ``hoisted``: the structured path keeps a part hoisted out of a formula (:mod:`scaffold.program`: ``1/c``
  of a shape smaller than the output's), and no more than the elementwise plan besides;
* ``mask``: the elementwise plan saves a bool mask where the structured one keeps a float tensor;
* ``output``: the elementwise plan reads an output where the structured one keeps something else;
* ``intermediate``: the elementwise plan keeps an intermediate (``input - target``) the structured one does not;
* ``other``: none of those;

then the counts. It also lists, under "recomputes more", the ops whose structured backward computes an
intermediate again where the elementwise plan reads an output instead. The exit status is 0; it measures.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
import warnings
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from one_pipeline_probe import add_selection, selected, structured_path  # noqa: E402

from scaffold import compile_op, spec_from_mapping  # noqa: E402
from scaffold.errors import ScaffoldError  # noqa: E402
from scaffold.plan import BackwardPlan  # noqa: E402
from scaffold.program import broadcast  # noqa: E402

POLICIES = ("memory", "time")
FLOAT, BOOL = 4, 1  # bytes an element


def elementwise_kept(plan: BackwardPlan, prog) -> dict[str, tuple[int, int]]:
    """What the elementwise ``plan`` saves: name -> (elements, bytes an element)."""
    shapes = {n: prog.value(n).shape for n in prog.tensor_names}
    outputs = {o.value: o for o in plan.outputs}
    masks = {m.name: m for m in plan.masks}
    kept = {}
    for name in plan.saved:
        if name in masks:
            tensors = [shapes[s.name] for s in masks[name].condition.free_symbols if s.name in shapes]
            kept[name] = (math.prod(broadcast(tensors)), BOOL)
        elif name in shapes:
            kept[name] = (math.prod(shapes[name]), FLOAT)
        else:
            kept[name] = (_output_elements(plan, prog, outputs[name], shapes), FLOAT)
    return kept


def _output_elements(plan: BackwardPlan, prog, output, shapes) -> int:
    """Elements of an output, or of a hidden intermediate (the broadcast of the tensors it reads)."""
    if not output.hidden:
        return math.prod(prog.outputs[plan.outputs.index(output)].shape)
    expr = plan.forward_exprs[plan.outputs.index(output)]
    steps = {s.name: s.expr for s in plan.forward_steps}
    names = {s.name for s in expr.free_symbols}
    while names & set(steps):
        names = {n for name in names for n in ([s.name for s in steps[name].free_symbols] if name in steps else [name])}
    return math.prod(broadcast([shapes[n] for n in names if n in shapes]))


def structured_kept(plan, prog) -> dict[str, tuple[int, int]]:
    """What the structured ``plan`` (a ProgramPlan) saves: name -> (elements, bytes an element); a mask has
    the shape of the values its condition (its forward statement) reads."""
    shapes = dict(plan.parameter_shapes)
    values = {v.name: v.shape for v in prog.values}
    for line in plan.forward:
        name, _, condition = line.partition(" = ")
        if name in plan.masks:
            shapes[name] = broadcast([values[n] for n in re.findall(r"\b\w+\b", condition) if n in values])
    return {n: (math.prod(shapes[n]), BOOL if n in plan.masks else FLOAT) for n in plan.saved}


def _bytes(kept: dict[str, tuple[int, int]]) -> int:
    return sum(elements * size for elements, size in kept.values())


def cause(elementwise: dict, structured: dict, plan: BackwardPlan, hoisted: frozenset[str]) -> str:
    """Why the structured path keeps more (see the module docstring)."""
    if _bytes({n: k for n, k in structured.items() if n not in hoisted}) <= _bytes(elementwise):
        return "hoisted"
    masks = {m.name for m in plan.masks}
    if len(masks) > sum(size == BOOL for _, size in structured.values()):
        return "mask"
    if any(o.value in elementwise for o in plan.outputs if o.hidden):
        return "intermediate"
    if any(o.value in elementwise and o.value not in structured for o in plan.visible):
        return "output"
    return "other"


def _plans(mapping: dict, policy: str, forced: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = spec_from_mapping({**mapping, "policy": policy}, source=f"{mapping['name']}.toml")
        with structured_path() if forced else contextlib.nullcontext():
            return compile_op(spec)


def inventory(mappings: list[dict], policy: str) -> tuple[dict, list, list, int]:
    """By cause, the ops whose structured plan keeps more bytes; those that recompute more; refusals; the
    number compared."""
    more, recomputes, refused, compared = defaultdict(list), [], [], 0
    for mapping in mappings:
        try:
            elementwise_op = _plans(mapping, policy, forced=False)
            structured_op = _plans(mapping, policy, forced=True)
        except ScaffoldError as exc:
            refused.append(f"{mapping['name']}: {exc.message}")
            continue
        if not isinstance(elementwise_op.plan, BackwardPlan):
            continue  # structured as written: nothing to compare
        compared += 1
        plan = elementwise_op.plan
        ours = elementwise_kept(plan, elementwise_op.program)
        theirs = structured_kept(structured_op.plan, structured_op.program)
        line = f"{mapping['name']}: {_describe(ours)} ({_bytes(ours)} B) vs {_describe(theirs)} ({_bytes(theirs)} B)"
        if _bytes(theirs) > _bytes(ours):
            more[cause(ours, theirs, plan, structured_op.program.hoisted)].append(line)
        read_outputs = [o.value for o in plan.visible if o.value in ours]
        if read_outputs and structured_op.plan.recomputed and not set(read_outputs) & set(theirs):
            recomputes.append(f"{mapping['name']}: recomputes {', '.join(structured_op.plan.recomputed)}")
    return more, recomputes, refused, compared


def _describe(kept: dict[str, tuple[int, int]]) -> str:
    return "[" + ", ".join(f"{n}:{e}{'b' if s == BOOL else ''}" for n, (e, s) in kept.items()) + "]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_selection(parser)
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated: memory, time")
    args = parser.parse_args(argv)
    mappings = [m for chosen in selected(parser, args).values() for m in chosen]
    for policy in [p for p in args.policies.split(",") if p]:
        more, recomputes, refused, compared = inventory(mappings, policy)
        total = sum(map(len, more.values()))
        print(f"policy {policy}: {compared} elementwise ops compared; the structured path keeps more for {total}")
        for name in sorted(more):
            print(f"  {name}: {len(more[name])}")
            for line in more[name]:
                print(f"    {line}")
        print(f"  recomputes more: {len(recomputes)}")
        for line in recomputes:
            print(f"    {line}")
        for line in refused:
            print(f"  refused {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
