"""The corpus: each hand-written Function in this folder, the math it claims (a scaffold op spec) and what
`scaffold check` must say about it.

A Case's `fails` are the check ids that MUST fail; `warns` are ids that are expected (allowed) to warn but not
fail; `unsure` are ids whose verdict depends on how the check is built (pass, warn or fail are all acceptable,
see `why`). Every id in none of the three must pass (or be skipped). `call` maps the spec's arguments (tensors
in declaration order, then scalars) onto the target when the plain order does not fit. by_hand.py verifies the
verdicts with plain torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent

CHECKS = (
    "forward",
    "gradients",
    "gradcheck",
    "gradgradcheck",
    "needs_input_grad",
    "ctx",
    "retain_graph",
    "inputs_unchanged",
    "second_shape",
    "extreme_inputs",
    "compile",
    "torch_func",
)


@dataclass(frozen=True)
class Case:
    file: str
    target: str
    spec: str
    fails: frozenset[str] | set[str]
    warns: tuple[str, ...] = ()
    call: str | None = None
    why: str = ""
    unsure: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return HERE / self.file

    @property
    def name(self) -> str:
        return f"{self.file[:-3]}:{self.target}"

    def __post_init__(self):
        object.__setattr__(self, "fails", frozenset(self.fails))
        for check in (*self.fails, *self.warns, *self.unsure):
            assert check in CHECKS, f"{self.name}: unknown check id {check!r}"


# --- specs ------------------------------------------------------------------------------------------

SWISH = """
name = "swish"
forward = "x * sigmoid(beta * x)"
[tensors.x]
shape = [4, 5]
[tensors.beta]
shape = []
"""

LOGSUMEXP_DIM = """
name = "logsumexp"
forward = "logsumexp(x, dim=-1)"
[tensors.x]
shape = [4, 5]
"""

LINEAR_RELU = """
name = "linear_relu"
forward = "Max(x @ transpose(w, 0, 1) + b, 0)"
[tensors.x]
shape = [6, 5]
[tensors.w]
shape = [3, 5]
[tensors.b]
shape = [3]
"""

LINEAR = """
name = "linear"
forward = "x @ transpose(w, 0, 1) + b"
[tensors.x]
shape = [6, 5]
[tensors.w]
shape = [3, 5]
[tensors.b]
shape = [3]
"""

QUADRATIC = """
name = "quadratic"
forward = "a * x**2 + b * x + c"
[tensors.x]
shape = [4, 5]
[tensors.a]
shape = []
[tensors.b]
shape = []
[tensors.c]
shape = []
"""

POWER = """
name = "power"
forward = "x**n"
[tensors.x]
shape = [4, 5]
[scalars.n]
type = "int"
default = 3
"""

SCALED_ACTIVATION = """
name = "scaled_activation"
forward = "scale * Piecewise((Max(x, 0), use_relu), (tanh(x), True))"
[tensors.x]
shape = [4, 5]
[scalars.scale]
default = 2.0
[scalars.use_relu]
default = false
"""

LOGSUMEXP_ALL = """
name = "stable_logsumexp"
forward = "log(sum(exp(x)))"
[tensors.x]
shape = [5]
"""

SMOOTH_L1 = """
name = "smooth_l1"
forward = "Piecewise((0.5 * x**2 / beta, Abs(x) < beta), (Abs(x) - 0.5 * beta, True))"
[tensors.x]
shape = [4, 5]
[scalars.beta]
default = 1.0
"""

SMOOTH_L1_LOSS = """
name = "smooth_l1_loss"
forward = "mean(Piecewise((0.5 * (p - t)**2, Abs(p - t) < 1), (Abs(p - t) - 0.5, True)))"
[tensors.p]
shape = [4, 5]
[tensors.t]
shape = [4, 5]
"""

CLIPPED_RELU = """
name = "clipped_relu"
forward = "Min(Max(x, 0), clip_val)"
[tensors.x]
shape = [4, 5]
[scalars.clip_val]
default = 2.0
"""

CLIP_GRADIENT = """
name = "clip_gradient"
forward = "x"
[tensors.x]
shape = [4, 5]
[scalars.clip_val]
default = 0.5
[gradients]
x = "Min(Max(grad, -clip_val), clip_val)"
"""

SWISH1 = """
name = "silu"
forward = "x * sigmoid(x)"
[tensors.x]
shape = [4, 5]
"""

MISH = """
name = "mish"
forward = "x * tanh(softplus(x))"
[tensors.x]
shape = [4, 5]
"""

RMS_NORM = """
name = "rms_norm"
forward = "x / sqrt(mean(x**2, dim=-1, keepdim=True) + eps) * w"
[tensors.x]
shape = [4, 8]
[tensors.w]
shape = [8]
[scalars.eps]
default = 1e-6
"""

BIAS_GELU = """
name = "bias_gelu"
forward = "(x + b) * 0.5 * (1 + tanh(0.79788456 * (x + b) * (1 + 0.044715 * (x + b)**2)))"
[tensors.x]
shape = [4, 5]
[tensors.b]
shape = [5]
"""

SOFT_DICE = """
name = "soft_dice"
forward = "1 - (2 * sum(sigmoid(x) * y, dim=-1) + smooth) / (sum(sigmoid(x)**2 + y, dim=-1) + smooth)"
[tensors.x]
shape = [1, 16]
[tensors.y]
shape = [1, 16]
domain = [0.0, 1.0]
[scalars.smooth]
default = 1.0
"""

FOCAL = """
name = "sigmoid_focal_loss"
forward = "(y - sigmoid(x))**2 * (alpha * y * softplus(-x) + (1 - alpha) * (1 - y) * softplus(x))"
[tensors.x]
shape = [4, 5]
[tensors.y]
shape = [4, 5]
domain = [0.0, 1.0]
[scalars.alpha]
default = 0.25
"""

GELU_MUL = """
name = "gelu_mul"
forward = "0.5 * a * (1 + tanh(sqrt(2 / pi) * (a + 0.044715 * a**3))) * b"
[tensors.a]
shape = [4, 5]
[tensors.b]
shape = [4, 5]
"""

COSINE = """
name = "cosine_similarity"
forward = "sum(a * b, dim=-1) / (sqrt(sum(a**2, dim=-1)) * sqrt(sum(b**2, dim=-1)))"
[tensors.a]
shape = [3, {n}]
[tensors.b]
shape = [3, {n}]
"""

SCALE = """
name = "scale"
forward = "x * w"
[tensors.x]
shape = [4, 5]
[tensors.w]
shape = [5]
"""

LEAKY_RELU = """
name = "leaky_relu"
forward = "Piecewise((x, x > 0), (negative_slope * x, True))"
[tensors.x]
shape = [4, 5]
[scalars.negative_slope]
default = 0.01
"""

SIGMOID = """
name = "sigmoid"
forward = "sigmoid(x)"
[tensors.x]
shape = [4, 5]
"""

BIAS_ADD = """
name = "bias_add"
forward = "x + b"
[tensors.x]
shape = [4, 5]
[tensors.b]
shape = [5]
"""

CHANNEL_SCALE = """
name = "channel_scale"
forward = "x * w"
[tensors.x]
shape = [2, 3, 4, 4]
[tensors.w]
shape = [3, 1, 1]
"""

SOFTMAX = """
name = "softmax"
forward = "softmax(x, dim=-1)"
[tensors.x]
shape = [4, 5]
"""

RELU = """
name = "relu"
forward = "Max(x, 0)"
[tensors.x]
shape = [4, 5]
"""

SOFTPLUS = """
name = "softplus"
forward = "softplus(x)"
[tensors.x]
shape = [4, 5]
"""

GELU = """
name = "gelu"
forward = "x * (1 + erf(x / sqrt(2))) / 2"
[tensors.x]
shape = [4, 5]
"""

BCE = """
name = "bce_with_logits"
forward = "(1 - t) * x + softplus(-x)"
[tensors.x]
shape = [4, 5]
[tensors.t]
shape = [4, 5]
domain = [0.0, 1.0]
"""

BCE_CONSTANT_TARGET = """
name = "bce_with_logits_constant_target"
forward = "(1 - t) * x + softplus(-x)"
[tensors.x]
shape = [4, 5]
[tensors.t]
shape = [4, 5]
domain = [0.0, 1.0]
[gradients]
t = "0"
"""

LOG = """
name = "log"
forward = "log(x)"
[tensors.x]
shape = [4, 5]
domain = [0.1, 10.0]
"""


# --- cases ------------------------------------------------------------------------------------------

# Checks that run the backward: all fail for a backward that raises on every call.
_BACKWARD_CHECKS = {"gradients", "gradcheck", "gradgradcheck", "needs_input_grad", "retain_graph", "second_shape"}
# Checks that may run the backward, or may stop at forward, as the command builds them.
_ALSO_RUN_BACKWARD = ("ctx", "inputs_unchanged", "extreme_inputs", "compile")
# Checks that compare values or gradients with the spec again: a Function wrong at the example is wrong there too.
_COMPARE_AGAIN = ("second_shape", "extreme_inputs", "compile")

CASES: list[Case] = [
    # --- right: the reference documents ---
    Case(
        "swish_long_guide.py",
        "SwishFunction",
        SWISH,
        fails={"ctx"},
        warns=("gradgradcheck",),
        why="the long guide's Swish as written: save_for_backward called twice in forward; it saves "
        "sigmoid(beta*x), an intermediate, so its double backward is wrong (not twice differentiable)",
    ),
    Case(
        "swish_saved_once.py",
        "SwishFunction",
        SWISH,
        fails=set(),
        warns=("gradgradcheck",),
        why="the long guide's Swish with save_for_backward called once: right, but the saved sigmoid(beta*x) "
        "makes the double backward wrong",
    ),
    Case(
        "logsumexp_long_guide.py",
        "LogSumExp",
        LOGSUMEXP_DIM,
        fails=set(),
        warns=("gradgradcheck",),
        call="LogSumExp.apply(x, -1)",
        why="right; saves softmax, an intermediate, so the double backward is wrong",
    ),
    Case(
        "fused_linear_relu_long_guide.py",
        "FusedLinearReLU",
        LINEAR_RELU,
        fails=set(),
        warns=("ctx", "second_shape"),
        why="right; keeps its bool ReLU mask (an intermediate, not an input or output) as a ctx attribute, "
        "and input.mm refuses an extra batch dimension in forward (2-D input only)",
    ),
    Case(
        "textbook.py",
        "QuadraticFunction",
        QUADRATIC,
        fails=set(),
        warns=("needs_input_grad",),
        why="right; returns all four gradients whether needed or not; grads of the 0-d a, b, c are the full "
        "[4, 5] tensors, which autograd's engine sums to their shape",
    ),
    Case("textbook.py", "PowerFunction", POWER, fails=set(), why="right"),
    Case("textbook.py", "ScaledActivation", SCALED_ACTIVATION, fails=set(), why="right (tanh branch)"),
    Case(
        "textbook.py",
        "StableLogSumExp",
        LOGSUMEXP_ALL,
        fails=set(),
        warns=("ctx", "gradgradcheck"),
        why="right; keeps sum_exp (an intermediate tensor) as a ctx attribute and saves exp(x - max), so the "
        "double backward is wrong",
    ),
    Case("textbook.py", "SmoothL1Function", SMOOTH_L1, fails=set(), why="right"),
    Case(
        "textbook.py",
        "criterion",
        SMOOTH_L1_LOSS,
        fails=set(),
        why="right; a Module instance (SmoothL1Loss(beta=1.0)) standing in for the Function",
    ),
    Case(
        "textbook.py",
        "ClipGradient",
        CLIP_GRADIENT,
        fails=set(),
        unsure=("gradcheck", "gradgradcheck"),
        why="right against the spec's custom gradient; gradcheck compares with finite differences of the "
        "identity, which a clipped gradient is not meant to match (fails where |grad| > clip_val)",
    ),
    Case("clipped_relu_worked_example.py", "ClippedReLUFunction", CLIPPED_RELU, fails=set(), why="right"),
    Case(
        "clipped_relu_worked_example.py",
        "clipped_relu",
        CLIPPED_RELU,
        fails=set(),
        why="right; a plain function standing in for the Function",
    ),
    # --- right: timm, Liger ---
    Case("timm_activations_me.py", "SwishAutoFn", SWISH1, fails=set(), why="right; recomputes sigmoid from x"),
    Case("timm_activations_me.py", "MishAutoFn", MISH, fails=set(), why="right; recomputes from x"),
    Case(
        "liger_rms_norm.py",
        "LigerRMSNormFunction",
        RMS_NORM,
        fails=set(),
        warns=("gradgradcheck", "needs_input_grad"),
        why="right; saves RSTD (an intermediate), so the double backward is wrong; always computes dW",
    ),
    Case(
        "bce_with_logits.py",
        "BCEWithLogitsFunction",
        BCE,
        fails={"gradients", "gradcheck", "needs_input_grad", "second_shape"},
        unsure=("extreme_inputs", "compile"),
        why="right for the logits, but returns None for the target, whose gradient the math has (-x): a spec "
        'that takes the target as a constant says so with [gradients] t = "0" (the next case)',
    ),
    Case(
        "bce_with_logits.py",
        "BCEWithLogitsFunction",
        BCE_CONSTANT_TARGET,
        fails=set(),
        warns=("needs_input_grad",),
        why="right: the spec declares the target's gradient 0, the None backward returns for it",
    ),
    Case("setup_context_style.py", "GELU", GELU, fails=set(), why="right; setup_context style with vmap and jvp"),
    # --- buggy ---
    Case(
        "flash_attn_bias_gelu.py",
        "GeLUFunction",
        BIAS_GELU,
        fails=_BACKWARD_CHECKS,
        unsure=_ALSO_RUN_BACKWARD,
        why="backward returns (tmp, tmp) where tmp is a (grad_input, grad_bias) pair: raises on every call",
    ),
    Case(
        "soft_dice.py",
        "SoftDiceFunction",
        SOFT_DICE,
        fails={"second_shape", "retain_graph", "gradcheck"},
        warns=("needs_input_grad",),
        unsure=("gradgradcheck",),
        why="backward sums numerator and denominator over the whole tensor, not per row (right for the one-row "
        "example only); squares the saved probs in place, so a second backward (retain_graph, and gradcheck's "
        "repeated backward) raises",
    ),
    Case(
        "sigmoid_focal_loss.py",
        "SigmoidFocalLossFunction",
        FOCAL,
        fails={"ctx", "retain_graph", "gradcheck"},
        warns=("needs_input_grad",),
        unsure=("gradgradcheck",),
        call="SigmoidFocalLossFunction.apply(x, y, alpha, 2.0)",
        why="backward mutates the probabilities it keeps (probs.mul_), so a second backward differs; the "
        "tensors are kept in ctx.vars, the label among them",
    ),
    Case(
        "liger_gelu_mul.py",
        "LigerGELUMulFunction",
        GELU_MUL,
        fails={"inputs_unchanged", "retain_graph", "gradcheck"},
        warns=("needs_input_grad",),
        unsure=("gradgradcheck",),
        why="backward writes da, db into the caller's a and b (and, those being saved, a second backward raises)",
    ),
    Case(
        "block_cosine_similarity.py",
        "BlockCosineSimilarity",
        COSINE.format(n=4),
        fails={"second_shape"},
        warns=("needs_input_grad",),
        call="BlockCosineSimilarity.apply(a, b, 1e-8)",
        why="normalises per block of 4 columns instead of per row: right for the example's rows of 4, wrong for "
        "longer rows",
    ),
    Case(
        "block_cosine_similarity.py",
        "BlockCosineSimilarity",
        COSINE.format(n=8),
        fails={"forward", "gradients", "second_shape"},
        warns=("needs_input_grad",),
        unsure=_COMPARE_AGAIN[1:],
        call="BlockCosineSimilarity.apply(a, b, 1e-8)",
        why="normalises per block of 4 columns instead of per row: the example's rows of 8 are two blocks",
    ),
    Case(
        "fairseq_grad_clip.py",
        "GradClip",
        CLIP_GRADIENT,
        fails={"gradients"},
        unsure=("gradcheck", "gradgradcheck", *_COMPARE_AGAIN),
        why="torch.clip(grad, min=clip_val, max=clip_val): every gradient element is clip_val (gradcheck fails "
        "too, as it does for any clipped gradient)",
    ),
    Case(
        "ctx_rules.py",
        "ScaleByTensorAttrs",
        SCALE,
        fails={"ctx"},
        why="keeps its inputs x and w as ctx attributes instead of save_for_backward",
    ),
    Case(
        "ctx_rules.py",
        "ScaleBySavedTwice",
        SCALE,
        fails={"ctx"},
        why="calls save_for_backward twice",
    ),
    Case(
        "ctx_rules.py",
        "LeakyReLUMissingNone",
        LEAKY_RELU,
        fails={"ctx"} | _BACKWARD_CHECKS - {"needs_input_grad"},
        unsure=_ALSO_RUN_BACKWARD[1:],
        why="backward returns 1 value for 2 forward inputs (no None for negative_slope): autograd raises on "
        "every backward",
    ),
    Case(
        "linear_all_grads.py",
        "LinearFunction",
        LINEAR,
        fails=set(),
        warns=("needs_input_grad",),
        why="right, but returns every gradient whether needed or not",
    ),
    Case(
        "sigmoid_wrong_derivative.py",
        "MySigmoid",
        SIGMOID,
        fails={"gradients", "gradcheck"},
        warns=("gradgradcheck",),
        unsure=_COMPARE_AGAIN,
        why="sigmoid' written as s instead of s * (1 - s)",
    ),
    Case(
        "bias_add.py",
        "BiasAdd",
        BIAS_ADD,
        fails=set(),
        warns=("needs_input_grad",),
        why="returns grad_output unsummed for the [5] bias; autograd's engine sums it to the bias's shape, so "
        "nothing is wrong",
    ),
    Case(
        "channel_scale_long_guide.py",
        "CorrectBroadcast",
        CHANNEL_SCALE,
        fails={"second_shape"},
        warns=("needs_input_grad",),
        why="the weight's gradient is summed over dims (0, 2, 3) counted from the front: with an extra batch "
        "dimension forward works but backward returns a wrong-shaped gradient and autograd raises",
    ),
    Case(
        "softmax_dim_from_front.py",
        "Softmax",
        SOFTMAX,
        fails={"second_shape"},
        why="softmax over dim=1 instead of dim=-1: right for 2-D input only, wrong with an extra batch dimension",
    ),
    Case(
        "relu_inplace_forward.py",
        "InplaceForward",
        RELU,
        fails={"inputs_unchanged", "gradcheck"},
        unsure=("gradients", "gradgradcheck", *_COMPARE_AGAIN),
        why="forward zeroes the negatives of the caller's tensor in place and returns it (a view of it): "
        "gradcheck's perturbed inputs then break; gradients are right for leaf inputs, zero for non-leaf ones",
    ),
    Case(
        "softplus_naive.py",
        "NaiveSoftplus",
        SOFTPLUS,
        fails={"extreme_inputs"},
        why="log(1 + exp(x)) overflows to inf in float32 at x = 100 (and backward gives nan) where the math is finite",
    ),
    Case(
        "setup_context_style.py",
        "CheckedLog",
        LOG,
        fails={"torch_func"},
        why="claims vmap support (generate_vmap_rule) but forward has a data-dependent `if` on a tensor, which "
        "vmap cannot run",
    ),
]
