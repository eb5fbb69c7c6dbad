# ruff: noqa: N812 (torch.nn.functional as F, as torch code writes it)
"""Check the corpus by hand, with plain torch and no scaffold: run each case's Function through the checks of
`scaffold check` as written here (a torch reference per spec name below) and compare the verdicts with the
case's `fails`, `warns` and `unsure`.

    python tests/check_corpus/by_hand.py [NAME_SUBSTRING ...] [-v]

Prints one line per case and check (pass / warn / fail / skip) and a mismatch line where the verdict is not
the case's; exits 1 on any mismatch. It is a cross-check of the corpus, not the command's test.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings

import tomllib
import torch
import torch.nn.functional as F
from torch.autograd.gradcheck import GradcheckError

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from cases import CASES, CHECKS, Case  # noqa: E402

warnings.filterwarnings("ignore")
# CORPUS_SEED draws other inputs; CORPUS_COMPILE_BACKEND=inductor compiles for real (slow on CPU).
SEED = int(os.environ.get("CORPUS_SEED", "0"))
COMPILE_BACKEND = os.environ.get("CORPUS_COMPILE_BACKEND", "aot_eager")

# A torch reference per spec name: the math, evaluated in float64.
REFERENCE = {
    "swish": lambda x, beta: x * torch.sigmoid(beta * x),
    "logsumexp": lambda x: torch.logsumexp(x, dim=-1),
    "linear_relu": lambda x, w, b: torch.relu(x @ w.transpose(0, 1) + b),
    "linear": lambda x, w, b: x @ w.transpose(0, 1) + b,
    "quadratic": lambda x, a, b, c: a * x**2 + b * x + c,
    "power": lambda x, n: x**n,
    "scaled_activation": lambda x, scale, use_relu: scale * (torch.relu(x) if use_relu else torch.tanh(x)),
    "stable_logsumexp": lambda x: torch.logsumexp(x.reshape(-1), dim=0),
    "smooth_l1": lambda x, beta: torch.where(x.abs() < beta, 0.5 * x**2 / beta, x.abs() - 0.5 * beta),
    "smooth_l1_loss": lambda p, t: F.smooth_l1_loss(p, t, beta=1.0),
    "clipped_relu": lambda x, clip_val: x.clamp(0, clip_val),
    "clip_gradient": lambda x, clip_val: x * 1,
    "silu": lambda x: x * torch.sigmoid(x),
    "mish": lambda x: x * torch.tanh(F.softplus(x)),
    "rms_norm": lambda x, w, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w,
    "bias_gelu": lambda x, b: F.gelu(x + b, approximate="tanh"),
    "soft_dice": lambda x, y, smooth: (
        1 - (2 * (torch.sigmoid(x) * y).sum(-1) + smooth) / ((torch.sigmoid(x) ** 2 + y).sum(-1) + smooth)
    ),
    "sigmoid_focal_loss": lambda x, y, alpha: (
        (y - torch.sigmoid(x)) ** 2 * -(alpha * y * F.logsigmoid(x) + (1 - alpha) * (1 - y) * F.logsigmoid(-x))
    ),
    "gelu_mul": lambda a, b: F.gelu(a, approximate="tanh") * b,
    "cosine_similarity": lambda a, b: (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)),
    "scale": lambda x, w: x * w,
    "leaky_relu": lambda x, negative_slope: torch.where(x > 0, x, negative_slope * x),
    "sigmoid": torch.sigmoid,
    "bias_add": lambda x, b: x + b,
    "channel_scale": lambda x, w: x * w,
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "relu": torch.relu,
    "softplus": F.softplus,
    "gelu": lambda x: F.gelu(x),
    "log": torch.log,
    "bce_with_logits": lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction="none"),
    "bce_with_logits_constant_target": lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction="none"),
}
# Custom gradients ([gradients] in the spec): the vector-Jacobian products the reference's backward returns.
CUSTOM_GRADIENT = {
    "clip_gradient": lambda g, x, clip_val: (g.clamp(-clip_val, clip_val),),
    "bce_with_logits_constant_target": lambda g, x, t: (g * (torch.sigmoid(x) - t), None),
}
# Kinks the inputs keep away from.
KINKS = {
    "clipped_relu": (0.0, 2.0),
    "smooth_l1": (-1.0, 1.0),
    "leaky_relu": (0.0,),
    "relu": (0.0,),
}


class Spec:
    def __init__(self, text: str):
        data = tomllib.loads(text)
        self.name = data["name"]
        self.tensors = {k: (tuple(v.get("shape", [4, 5])), v.get("domain")) for k, v in data.get("tensors", {}).items()}
        self.scalars = {k: v["default"] for k, v in data.get("scalars", {}).items()}
        self.custom = set(data.get("gradients", {}))

    def inputs(self, dtype=torch.float64, shapes=None, extreme=None):
        out = {}
        for i, (name, (shape, domain)) in enumerate(self.tensors.items()):
            shape = shapes[name] if shapes else shape
            low, high = domain or (-3.0, 3.0)
            t = torch.rand(shape, dtype=torch.float64) * (high - low) + low
            for k in KINKS.get(self.name, ()):
                near = (t - k).abs() < 0.05
                t = torch.where(near, t + 0.1 * torch.sign(t - k + 1e-12), t)
            if extreme is not None and i == 0:
                t = torch.full(shape, extreme, dtype=torch.float64) * torch.where(
                    torch.rand(shape) < 0.5, 1.0, 1.0 if domain else -1.0
                )
            out[name] = t.to(dtype)
        return out

    def reference(self, tensors):
        return REFERENCE[self.name](*tensors.values(), *self.scalars.values())


def load(case: Case):
    spec = importlib.util.spec_from_file_location(f"corpus_{case.file[:-3]}", case.path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def functions_in(module):
    return [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, torch.autograd.Function) and v is not torch.autograd.Function
    ]


def make_call(case: Case, module, spec: Spec):
    target = getattr(module, case.target)
    args = [*spec.tensors, *spec.scalars]
    expr = case.call
    if expr is None:
        head = f"{case.target}.apply" if isinstance(target, type) else case.target
        expr = f"{head}({', '.join(args)})"

    def call(tensors):
        return eval(expr, dict(vars(module)), {**tensors, **spec.scalars})

    return call


def close(a, b, rtol=1e-6, atol=1e-8):
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=False)


def reference_grads(spec: Spec, tensors, g):
    leaves = {k: v.detach().requires_grad_() for k, v in tensors.items()}
    if spec.name in CUSTOM_GRADIENT:
        return CUSTOM_GRADIENT[spec.name](g, *leaves.values(), *spec.scalars.values())
    out = spec.reference(leaves)
    return torch.autograd.grad(out, list(leaves.values()), g, allow_unused=True)


def run_grads(call, tensors, g, **kw):
    leaves = {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}
    out = call(leaves)
    return out, torch.autograd.grad(out, list(leaves.values()), g, allow_unused=True, **kw)


def values_and_grads_match(case, spec, call, tensors, rtol=1e-6, atol=1e-8):
    ref = spec.reference(tensors)
    g = torch.randn_like(ref)
    out, grads = run_grads(call, tensors, g)
    if not close(out, ref, rtol, atol):
        return "fail", "values differ"
    return grads_match(tensors, grads, reference_grads(spec, tensors, g), rtol, atol)


def grads_match(tensors, grads, expected, rtol=1e-6, atol=1e-8):
    """None stands for zeros (a spec that takes an input as a constant declares its gradient "0")."""
    for name, a, b in zip(tensors, grads, expected):
        if a is None and b is not None and b.abs().max() > 0:
            return "fail", f"no gradient for {name}, where the math has one"
        if a is not None and b is None and a.abs().max() > 0:
            return "fail", f"a gradient for {name}, where the spec declares it 0"
        if a is not None and b is not None and not close(a, b, rtol, atol):
            return "fail", f"gradient of {name} differs"
    return "pass", ""


# --- the checks ----------------------------------------------------------------------------------


def check_forward(case, spec, call, module):
    tensors = spec.inputs()
    out = call({k: v.clone() for k, v in tensors.items()})
    return ("pass", "") if close(out, spec.reference(tensors)) else ("fail", "values differ")


def check_gradients(case, spec, call, module):
    return values_and_grads_match(case, spec, call, spec.inputs())


def _tensor_fn(spec, call, fixed=None):
    names = [n for n in spec.tensors if n not in (fixed or {})]
    return lambda *ts: call({**(fixed or {}), **dict(zip(names, ts))})


def _finite_difference_inputs(spec):
    """The tensors whose gradient the math derives: finite differences say nothing of a custom gradient."""
    tensors = spec.inputs()
    fixed = {k: v for k, v in tensors.items() if k in spec.custom}
    return fixed, tuple(v.requires_grad_() for k, v in tensors.items() if k not in fixed)


def check_gradcheck(case, spec, call, module):
    fixed, inputs = _finite_difference_inputs(spec)
    if not inputs:
        return "skip", "every gradient is custom"
    torch.autograd.gradcheck(_tensor_fn(spec, call, fixed), inputs)
    return "pass", ""


def check_gradgradcheck(case, spec, call, module):
    """A wrong second derivative is 'not twice differentiable', a warning (the issue: a failure only with
    --strict); a double backward that raises is a failure."""
    fixed, inputs = _finite_difference_inputs(spec)
    if not inputs:
        return "skip", "every gradient is custom"
    try:
        torch.autograd.gradgradcheck(_tensor_fn(spec, call, fixed), inputs)
    except GradcheckError as e:
        return "warn", f"not twice differentiable: {str(e).splitlines()[0]}"
    return "pass", ""


class Recorder:
    """Wraps the module's Functions: records what backward returns, and save_for_backward calls per ctx."""

    def __init__(self, module):
        self.functions = functions_in(module)
        self.returns, self.saves = [], {}

    def __enter__(self):
        self.old = [(f, f.__dict__.get("backward")) for f in self.functions]
        for f, backward in self.old:
            if backward is None:
                continue

            def wrapped(ctx, *grads, _backward=backward.__func__):
                result = _backward(ctx, *grads)
                self.returns.append((ctx, result if isinstance(result, tuple) else (result,)))
                return result

            f.backward = staticmethod(wrapped)
        self.old_save = torch.autograd.function.FunctionCtx.save_for_backward

        def save(ctx, *tensors, _save=self.old_save):
            self.saves[id(ctx)] = self.saves.get(id(ctx), 0) + 1
            return _save(ctx, *tensors)

        torch.autograd.function.FunctionCtx.save_for_backward = save
        return self

    def __exit__(self, *exc):
        for f, backward in self.old:
            if backward is not None:
                f.backward = backward
        torch.autograd.function.FunctionCtx.save_for_backward = self.old_save


def check_needs_input_grad(case, spec, call, module):
    names = list(spec.tensors)
    if len(names) < 2:
        return "skip", "one tensor input"
    if not isinstance(getattr(module, case.target), type):
        return "skip", "the target is not the Function (its inputs need not be the spec's tensors)"
    notes = []
    for only in names:
        tensors = {k: v.requires_grad_(k == only) for k, v in spec.inputs().items()}
        with Recorder(module) as rec:
            out = call(tensors)
            out.backward(torch.randn_like(out))
        expected = reference_grads(spec, tensors, torch.ones_like(out))
        for _ctx, result in rec.returns:
            for name, grad, ref in zip(names, result, expected):
                if name != only and grad is not None:
                    notes.append(f"returns a gradient for {name} with only {only} requiring one")
                if name == only and grad is None and ref is not None and ref.abs().max() > 0:
                    return "fail", f"returns None for {name}, whose gradient is needed"
    return ("warn", "; ".join(sorted(set(notes)))) if notes else ("pass", "")


def _tensors_in(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors_in(v)


def check_ctx(case, spec, call, module):
    tensors = {k: v.requires_grad_() for k, v in spec.inputs().items()}
    with Recorder(module) as rec:
        out = call(tensors)
        fn = out.grad_fn
        # walk to the custom Function's node (a Module or wrapper may add nodes after it)
        seen, stack, nodes = set(), [fn], []
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if isinstance(node, torch.autograd.function.BackwardCFunction):
                nodes.append(node)
            stack.extend(n for n, _ in node.next_functions)
        fails, warns = [], []
        io = [*tensors.values(), out]
        for node in nodes:
            for attr, value in vars(node).items():
                for t in _tensors_in(value):
                    if any(t is x for x in io):
                        fails.append(f"input/output kept as ctx.{attr}")
                    else:
                        warns.append(f"intermediate tensor kept as ctx.{attr}")
            if rec.saves.get(id(node), 0) > 1:
                fails.append(f"save_for_backward called {rec.saves[id(node)]} times")
        try:
            out.backward(torch.randn_like(out))
        except RuntimeError as e:
            if "incorrect number of gradients" in str(e):
                fails.append(str(e).splitlines()[0])
            else:
                raise
    if fails:
        return "fail", "; ".join(fails + warns)
    return ("warn", "; ".join(warns)) if warns else ("pass", "")


def check_retain_graph(case, spec, call, module):
    tensors = spec.inputs()
    leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}
    out = call(leaves)
    g = torch.randn_like(out)
    first = torch.autograd.grad(out, list(leaves.values()), g, retain_graph=True, allow_unused=True)
    first = [None if t is None else t.clone() for t in first]
    second = torch.autograd.grad(out, list(leaves.values()), g, allow_unused=True)
    for name, a, b in zip(leaves, first, second):
        if not close(a, b, 0, 0):
            diff = (a - b).abs().max().item()
            return "fail", f"second backward differs for {name} by {diff:.2g}"
    return "pass", ""


def check_inputs_unchanged(case, spec, call, module):
    tensors = {k: v.requires_grad_() for k, v in spec.inputs().items()}
    before = {k: v.detach().clone() for k, v in tensors.items()}
    out = call(tensors)
    for k, v in tensors.items():
        if not torch.equal(v.detach(), before[k]):
            return "fail", f"forward changed {k}"
    g = torch.randn_like(out)
    g0 = g.clone()
    torch.autograd.grad(out, list(tensors.values()), g, allow_unused=True)
    for k, v in tensors.items():
        if not torch.equal(v.detach(), before[k]):
            return "fail", f"backward changed {k}"
    if not torch.equal(g, g0):
        return "fail", "backward changed the upstream gradient"
    return "pass", ""


def _other_shapes(spec):
    first = next(iter(spec.tensors.values()))[0]
    batched = {k: ((2, *s) if s == first else s) for k, (s, _) in spec.tensors.items()}
    resized = {k: tuple(d if d == 1 else d + 3 for d in s) for k, (s, _) in spec.tensors.items()}
    return {"extra batch dimension": batched, "other sizes": resized}


def check_second_shape(case, spec, call, module):
    warned = ""
    for what, shapes in _other_shapes(spec).items():
        tensors = spec.inputs(shapes=shapes)
        try:
            call({k: v.clone() for k, v in tensors.items()})
        except Exception as e:  # noqa: BLE001
            # A forward that refuses a shape is a limitation, not a wrong result.
            warned = warned or f"{what} {shapes}: forward raises {type(e).__name__}: {str(e).splitlines()[0][:100]}"
            continue
        try:
            verdict, note = values_and_grads_match(case, spec, call, tensors)
        except Exception as e:  # noqa: BLE001
            return "fail", f"{what} {shapes}: raises {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        if verdict == "fail":
            return verdict, f"{what} {shapes}: {note}"
        if verdict == "warn":
            warned = warned or f"{what} {shapes}: {note}"
    return ("warn", warned) if warned else ("pass", "")


def check_extreme_inputs(case, spec, call, module):
    names = list(spec.tensors)
    domain = spec.tensors[names[0]][1]
    values = domain if domain else (100.0, -100.0, 1e-4)
    for value in values:
        t64 = spec.inputs(extreme=value)
        t32 = {k: v.float() for k, v in t64.items()}
        ref = spec.reference(t64)
        if not torch.isfinite(ref).all():
            continue
        g = torch.randn_like(ref)
        out, grads = run_grads(call, t32, g.float())
        if not torch.isfinite(out).all() or not torch.allclose(out.double(), ref, rtol=1e-3, atol=1e-4):
            return "fail", f"float32 values at {names[0]} = {value}: {out.flatten()[:3].tolist()}"
        for name, a, b in zip(names, grads, reference_grads(spec, t64, g)):
            if a is None or b is None:
                continue
            if not torch.isfinite(a).all() or not torch.allclose(a.double(), b, rtol=1e-3, atol=1e-4):
                return "fail", f"float32 gradient of {name} at {names[0]} = {value}"
    return "pass", ""


def check_compile(case, spec, call, module):
    torch._dynamo.reset()
    compiled = torch.compile(_tensor_fn(spec, call), backend=COMPILE_BACKEND, fullgraph=False)
    tensors = spec.inputs()
    ref = spec.reference(tensors)
    g = torch.randn_like(ref)
    leaves = [v.clone().requires_grad_() for v in tensors.values()]
    out = compiled(*leaves)
    grads = torch.autograd.grad(out, leaves, g, allow_unused=True)
    if not close(out, ref):
        return "fail", "compiled values differ"
    return grads_match(tensors, grads, reference_grads(spec, tensors, g))


def check_torch_func(case, spec, call, module):
    fns = functions_in(module)
    target = getattr(module, case.target)
    used = [target] if target in fns else fns
    if not all(f.setup_context is not torch.autograd.Function.setup_context for f in used):
        return "skip", "forward(ctx, ...) style"
    names = list(spec.tensors)
    tensors = spec.inputs()
    first = names[0]

    def f(x):
        return call({**tensors, first: x}).sum()

    g = torch.func.grad(f)(tensors[first])
    ref = reference_grads(spec, tensors, torch.ones_like(spec.reference(tensors)))[0]
    if not close(g, ref):
        return "fail", "torch.func.grad differs"
    if all(getattr(fn, "generate_vmap_rule", False) or "vmap" in fn.__dict__ for fn in used):
        batched = torch.stack([tensors[first], tensors[first] * 0.5 + 1])
        try:
            ys = torch.func.vmap(lambda x: call({**tensors, first: x}))(batched)
        except Exception as e:  # noqa: BLE001
            return "fail", f"vmap raises {type(e).__name__}: {str(e).splitlines()[0][:100]}"
        if not close(ys[0], call(tensors)):
            return "fail", "vmap differs"
    if all("jvp" in fn.__dict__ for fn in used):
        t = torch.randn_like(tensors[first])
        _, jv = torch.func.jvp(lambda x: call({**tensors, first: x}), (tensors[first],), (t,))
        _, ref_jv = torch.func.jvp(lambda x: spec.reference({**tensors, first: x}), (tensors[first],), (t,))
        if not close(jv, ref_jv):
            return "fail", "jvp differs"
    return "pass", ""


def run_case(case: Case, verbose=False):
    spec = Spec(case.spec)
    module = load(case)
    call = make_call(case, module, spec)
    mismatches = []
    for check in CHECKS:
        torch.manual_seed(SEED + CHECKS.index(check))
        try:
            verdict, note = globals()[f"check_{check}"](case, spec, call, module)
        except Exception as e:  # noqa: BLE001
            verdict, note = "fail", f"raises {type(e).__name__}: {str(e).strip().splitlines()[0][:140]}"
        expected = "fail" if check in case.fails else "warn" if check in case.warns else "pass"
        ok = (
            check in case.unsure
            or verdict == expected
            or (verdict == "skip" and expected == "pass")
            or (verdict == "pass" and expected == "warn")
        )
        if verbose or not ok:
            print(f"  {case.name:48} {check:17} {verdict:5} {'' if ok else 'MISMATCH (case: ' + expected + ')'} {note}")
        if not ok:
            mismatches.append((case.name, check))
    return mismatches


def main(argv):
    verbose = "-v" in argv
    wanted = [a for a in argv if not a.startswith("-")]
    mismatches = []
    for case in CASES:
        if wanted and not any(w in case.name + case.spec for w in wanted):
            continue
        print(f"{case.name}  fails={sorted(case.fails)} warns={list(case.warns)}")
        mismatches += run_case(case, verbose)
    print(f"{len(mismatches)} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
