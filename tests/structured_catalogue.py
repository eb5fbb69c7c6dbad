"""Ops that reduce, normalize or multiply matrices (structured programs), each with PyTorch's own
implementation: the issue's list (logsumexp in its textbook form, softmax, log_softmax, soft-target
cross-entropy, MSE, RMSNorm and LayerNorm with weights, fused Linear+ReLU, a bilinear form, attention,
cosine similarity, L2 normalisation, softmax entropy, amax, a Gram matrix, logistic-regression NLL, a sum
of squares, mean/variance and log_softmax with its logsumexp), and more of the same kind.

Entries are :class:`catalogue.CatalogueOp`: a spec mapping and ``native``, the op in torch, taking the
op's arguments in call order and returning what it returns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - the usual name

try:
    from .catalogue import CatalogueOp
except ImportError:  # tests/ run as a plain folder, not a package
    from catalogue import CatalogueOp


def _op(name: str, forward: str, tensors: dict, native, scalars: dict | None = None, **extra) -> CatalogueOp:
    spec = {"forward": forward, "tensors": tensors, **extra}
    if scalars:
        spec["scalars"] = scalars
    return CatalogueOp(name, spec, native)


ROWS = {"x": {"shape": [8, 16]}}
PROBABILITIES = {"shape": [8, 16], "domain": [0.0, 1.0]}


def _entropy(x):
    return torch.distributions.Categorical(logits=x).entropy()


def _kl(p, q):
    return F.kl_div(F.log_softmax(q, -1), F.log_softmax(p, -1), log_target=True, reduction="none").sum(-1)


STRUCTURED: list[CatalogueOp] = [
    # --- the list ---------------------------------------------------------------------------------
    _op("logsumexp_textbook", "log(sum(exp(x), dim=-1))", ROWS, lambda x: torch.logsumexp(x, -1)),
    _op("softmax_textbook", "exp(x) / sum(exp(x), dim=-1, keepdim=True)", ROWS, lambda x: F.softmax(x, -1)),
    _op(
        "log_softmax_textbook",
        "x - log(sum(exp(x), dim=-1, keepdim=True))",
        ROWS,
        lambda x: F.log_softmax(x, -1),
    ),
    _op(
        "soft_cross_entropy",
        "-sum(target * log_softmax(logits, dim=-1), dim=-1)",
        {"logits": {"shape": [8, 16]}, "target": PROBABILITIES},
        lambda logits, target: F.cross_entropy(logits, target, reduction="none"),
    ),
    _op(
        "mse_mean",
        "mean((input - target)**2)",
        {"input": {"shape": [8, 16]}, "target": {"shape": [8, 16]}},
        lambda input, target: F.mse_loss(input, target),
    ),
    _op(
        "rms_norm",
        "x * weight / sqrt(mean(x**2, dim=-1, keepdim=True) + eps)",
        {"x": {"shape": [8, 16]}, "weight": {"shape": [16], "learnable": True, "init": 1.0}},
        lambda x, weight, eps: F.rms_norm(x, x.shape[-1:], weight, eps),
        {"eps": {"default": 1e-6}},
    ),
    _op(
        "layer_norm",
        "mu = mean(x, dim=-1, keepdim=True)\n"
        "xc = x - mu\n"
        "var = mean(xc**2, dim=-1, keepdim=True)\n"
        "xc / sqrt(var + eps) * weight + bias",
        {
            "x": {"shape": [8, 16]},
            "weight": {"shape": [16], "learnable": True, "init": 1.0},
            "bias": {"shape": [16], "learnable": True, "init": 0.0},
        },
        lambda x, weight, bias, eps: F.layer_norm(x, x.shape[-1:], weight, bias, eps),
        {"eps": {"default": 1e-5}},
    ),
    _op(
        "linear_relu",
        "Max(0, x @ transpose(weight, 0, 1) + bias)",
        {"x": {"shape": [8, 16]}, "weight": {"shape": [32, 16]}, "bias": {"shape": [32]}},
        lambda x, weight, bias: F.relu(F.linear(x, weight, bias)),
    ),
    _op(
        "bilinear_form",
        "sum((x @ m) * y, dim=-1)",
        {"x": {"shape": [8, 16]}, "m": {"shape": [16, 12]}, "y": {"shape": [8, 12]}},
        lambda x, m, y: F.bilinear(x, y, m[None]).squeeze(-1),
    ),
    _op(
        "attention",
        "softmax(q @ transpose(k, -1, -2) * scale, dim=-1) @ v",
        {"q": {"shape": [8, 16]}, "k": {"shape": [6, 16]}, "v": {"shape": [6, 16]}},
        lambda q, k, v, scale: F.scaled_dot_product_attention(q, k, v, scale=scale),
        {"scale": {"default": 0.25}},
    ),
    _op(
        "cosine_similarity",
        "sum(a * b, dim=-1) / sqrt(sum(a**2, dim=-1) * sum(b**2, dim=-1))",
        {"a": {"shape": [8, 16]}, "b": {"shape": [8, 16]}},
        lambda a, b: F.cosine_similarity(a, b, dim=-1, eps=0.0),
    ),
    _op("l2_normalize", "x / sqrt(sum(x**2, dim=-1, keepdim=True))", ROWS, lambda x: F.normalize(x, dim=-1)),
    _op(
        "softmax_entropy",
        "p = softmax(x, dim=-1)\n-sum(p * log_softmax(x, dim=-1), dim=-1)",
        ROWS,
        _entropy,
    ),
    _op("amax_rows", "amax(x, dim=-1)", ROWS, lambda x: torch.amax(x, -1)),
    _op("gram", "x @ transpose(x, -1, -2)", ROWS, lambda x: x @ x.mT),
    _op(
        "logistic_nll",
        "z = x @ w\nmean(softplus(z) - t * z)",
        {"x": {"shape": [8, 16]}, "w": {"shape": [16]}, "t": {"shape": [8], "domain": [0.0, 1.0]}},
        lambda x, w, t: F.binary_cross_entropy_with_logits(x @ w, t),
    ),
    _op("sum_of_squares", "sum(x**2)", ROWS, lambda x: (x**2).sum()),
    _op(
        "mean_variance",
        "mean_ = mean(x, dim=-1)\nvariance = mean((x - mean(x, dim=-1, keepdim=True))**2, dim=-1)",
        ROWS,
        lambda x: tuple(reversed(torch.var_mean(x, -1, correction=0))),
        outputs=["mean_", "variance"],
    ),
    _op(
        "log_softmax_and_logsumexp",
        "lse = logsumexp(x, dim=-1, keepdim=True)\nlog_probs = x - lse",
        ROWS,
        lambda x: (F.log_softmax(x, -1), torch.logsumexp(x, -1, keepdim=True)),
        outputs=["log_probs", "lse"],
    ),
    # --- more of the same kind ------------------------------------------------------------------------------
    _op(
        "instance_center",
        "x - mean(x, dim=(-2, -1), keepdim=True)",
        {"x": {"shape": [3, 6, 8]}},
        lambda x: x - x.mean((-2, -1), keepdim=True),
    ),
    _op(
        "kl_softmax",
        "sum(softmax(p, dim=-1) * (log_softmax(p, dim=-1) - log_softmax(q, dim=-1)), dim=-1)",
        {"p": {"shape": [8, 16]}, "q": {"shape": [8, 16]}},
        _kl,
    ),
    _op(
        "batched_attention",
        "softmax(q @ transpose(k, -1, -2) / 4, dim=-1) @ v",
        {"q": {"shape": [2, 8, 16]}, "k": {"shape": [2, 6, 16]}, "v": {"shape": [2, 6, 16]}},
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.25),
    ),
    _op("matvec", "tanh(w @ x)", {"w": {"shape": [8, 16]}, "x": {"shape": [16]}}, lambda w, x: torch.tanh(w @ x)),
    _op("dot", "a @ b", {"a": {"shape": [16]}, "b": {"shape": [16]}}, lambda a, b: a @ b),
    _op(
        "swiglu",
        "h = x @ w1\nh * sigmoid(h) * (x @ w2)",
        {"x": {"shape": [8, 16]}, "w1": {"shape": [16, 32]}, "w2": {"shape": [16, 32]}},
        lambda x, w1, w2: F.silu(x @ w1) * (x @ w2),
    ),
    _op(
        "softmax_temperature_columns",
        "softmax(x / temperature, dim=0)",
        ROWS,
        lambda x, temperature: F.softmax(x / temperature, 0),
        {"temperature": {"default": 2.0}},
    ),
    _op("amin_all", "amin(x)", ROWS, lambda x: torch.amin(x)),
    _op(
        "logsumexp_columns_kept",
        "logsumexp(2 * x, dim=0, keepdim=True)",
        ROWS,
        lambda x: torch.logsumexp(2 * x, 0, keepdim=True),
    ),
    _op(
        "mlp_two_layers",
        "Max(0, x @ w1) @ w2",
        {"x": {"shape": [8, 16]}, "w1": {"shape": [16, 32]}, "w2": {"shape": [32, 4]}},
        lambda x, w1, w2: F.relu(x @ w1) @ w2,
    ),
    _op(
        "broadcast_batched_product",
        "a @ b",
        {"a": {"shape": [2, 1, 4, 5]}, "b": {"shape": [3, 5, 6]}},
        lambda a, b: a @ b,
    ),
    _op(
        "sign_by_row_sum",
        "Piecewise((x, sum(x, dim=-1, keepdim=True) > 0), (-x, True))",
        ROWS,
        lambda x: torch.where(x.sum(-1, keepdim=True) > 0, x, -x),
    ),
    _op(
        "smooth_max",
        "t * logsumexp(x / t, dim=-1)",
        ROWS,
        lambda x, t: t * torch.logsumexp(x / t, -1),
        {"t": {"default": 0.5}},
    ),
    _op(
        "row_extremes",
        "hi = amax(x, dim=-1)\nlo = amin(x, dim=-1)",
        ROWS,
        lambda x: (torch.amax(x, -1), torch.amin(x, -1)),
        outputs=["hi", "lo"],
    ),
    _op(
        "linear_gelu_learned",
        "h = x @ transpose(weight, 0, 1) + bias\nh * sigmoid(1.702 * h)",
        {
            "x": {"shape": [8, 16]},
            "weight": {"shape": [32, 16], "learnable": True, "init": 0.1},
            "bias": {"shape": [32], "learnable": True, "init": 0.0},
        },
        lambda x, weight, bias: F.linear(x, weight, bias) * torch.sigmoid(1.702 * F.linear(x, weight, bias)),
    ),
    _op(
        "softmax_or_log_softmax",
        "Piecewise((softmax(x, dim=-1), probabilities), (log_softmax(x, dim=-1), True))",
        ROWS,
        lambda x, probabilities: F.softmax(x, -1) if probabilities else F.log_softmax(x, -1),
        {"probabilities": {"type": "bool", "default": True}},
    ),
    _op(
        "batch_norm_training",
        "m = mean(x, dim=0, keepdim=True)\nv = mean((x - m)**2, dim=0, keepdim=True)\n(x - m) / sqrt(v + eps) * g",
        {"x": {"shape": [8, 16]}, "g": {"shape": [16]}},
        lambda x, g, eps: F.batch_norm(x, None, None, g, None, training=True, eps=eps),
        {"eps": {"default": 1e-5}},
    ),
    _op(
        "contrastive_loss",
        "s = a @ transpose(b, 0, 1) / t\nmean(logsumexp(s, dim=-1) - sum(s * eye, dim=-1))",
        {"a": {"shape": [6, 8]}, "b": {"shape": [6, 8]}, "eye": {"shape": [6, 6], "domain": [0.0, 1.0]}},
        lambda a, b, eye, t: (torch.logsumexp(a @ b.T / t, -1) - (a @ b.T / t * eye).sum(-1)).mean(),
        {"t": {"default": 0.5}},
    ),
    _op(
        "transposed_sum",
        "sum(transpose(x, 0, 1) * w)",
        {"x": {"shape": [8, 16]}, "w": {"shape": [16, 8]}},
        lambda x, w: (x.T * w).sum(),
    ),
    _op(
        "transposed_total",
        "sum(transpose(x, 0, 2), dim=(0, 1))",
        {"x": {"shape": [2, 4, 6]}},
        lambda x: x.transpose(0, 2).sum((0, 1)),
    ),
    _op(
        "weighted_mean_pool",
        "sum(softmax(s, dim=-1) * x, dim=-1)",
        {"s": {"shape": [8, 16]}, "x": {"shape": [8, 16]}},
        lambda s, x: (F.softmax(s, -1) * x).sum(-1),
    ),
    _op(  # c's gradient is one value a row (mean's spread): average takes it from each of c's 16 elements
        "centred_twice",
        "c = x - mean(x, dim=-1, keepdim=True)\nc2 = c - mean(c, dim=-1, keepdim=True)\nsum(c2**2, dim=-1)",
        ROWS,
        lambda x: ((x - x.mean(-1, True)) - (x - x.mean(-1, True)).mean(-1, True)).pow(2).sum(-1),
    ),
    _op(  # the same through an argument: w takes one share a row from each of x - w's 16 elements
        "mean_of_shifted",
        "mean(exp(x - w), dim=-1)",
        {"x": {"shape": [8, 16]}, "w": {"shape": [8, 1]}},
        lambda x, w: (x - w).exp().mean(-1),
    ),
    _op(  # x*exp(y) in stable form (xexpy), in a structured node: printed 0 where x is 0 (failed to generate)
        "row_sum_times_exp",
        "h = x @ w\nsum(h, dim=-1, keepdim=True) * exp(h)",
        {"x": {"shape": [8, 6]}, "w": {"shape": [6, 4]}},
        lambda x, w: (x @ w).sum(-1, True) * torch.exp(x @ w),
    ),
    _op(  # statistics of statistics: rsqrt(s) hoisted once, reused by exp(-t) * rsqrt(s)
        "exp_weighted_norm",
        "s = sum(x**2, dim=-1, keepdim=True)\nt = sum(x / sqrt(s), dim=-1, keepdim=True)\nx * exp(-t) / sqrt(s)",
        ROWS,
        lambda x: x * torch.exp(-(x / x.pow(2).sum(-1, True).sqrt()).sum(-1, True)) / x.pow(2).sum(-1, True).sqrt(),
    ),
    _op(  # the mean over everything passes a 0-d gradient: a row mean takes 16 shares of it (crashed the planner)
        "mean_of_centred_product",
        "mean(mean(x, dim=-1, keepdim=True) - x * w)",
        {"x": {"shape": [8, 16]}, "w": {"shape": [8, 1]}},
        lambda x, w: (x.mean(-1, True) - x * w).mean(),
    ),
    _op(
        "mean_of_difference",
        "mean(x - w, dim=-1)",
        {"x": {"shape": [8, 16]}, "w": {"shape": [8, 1]}},
        lambda x, w: (x - w).mean(-1),
    ),
    _op(  # flat in x: zeros for x's gradient and tangent (None and an int 0 failed their generated tests)
        "sign_weighted_sum",
        "sum(sign(x) * y, dim=-1)",
        {"x": {"shape": [8, 16]}, "y": {"shape": [8, 16]}},
        lambda x, y: (torch.sign(x) * y).sum(-1),
    ),
    _op(  # a kink between two inputs: their extreme values tie (the generated tests' large inputs failed there)
        "max_rows",
        "sum(Max(x, y), dim=-1)",
        {"x": {"shape": [8, 16]}, "y": {"shape": [8, 16]}},
        lambda x, y: torch.maximum(x, y).sum(-1),
    ),
    _op(  # c read directly and through 1/c**2, hoisted: c's per-element share and the hoisted part's summed one
        # were added before summing (the latter counted at every element: a wrong gradient in c)
        "cauchy_rows",
        "sum(c**2/2*log(1 + (x/c)**2), dim=-1)",
        {"x": {"shape": [8, 16]}, "c": {"shape": [], "learnable": True, "init": 1.0, "domain": [0.5, 2.0]}},
        lambda x, c: (c**2 / 2 * torch.log1p((x / c) ** 2)).sum(-1),
    ),
    _op(  # the reference as written cancels (log(1 - sigmoid(u)) at u = 30 keeps 3 digits in float64) and the
        # mean carries it into the row: the tests' draw narrows until the reference is accurate (7 red tests)
        "bce_of_cube_mean",
        "mean(-(t*log(1/(1 + exp(-(((x - y)/c)**3)))) + (1 - t)*log(1 - 1/(1 + exp(-(((x - y)/c)**3))))), dim=-1)",
        {"x": {"shape": [4, 5]}, "y": {"shape": [4, 5]}, "t": {"shape": [4, 5], "domain": [0.0, 1.0]}},
        lambda x, y, t, c: F.binary_cross_entropy_with_logits(((x - y) / c) ** 3, t, reduction="none").mean(-1),
        {"c": {"type": "float", "default": 0.5}},
    ),
    _op(  # K**h is hoisted; its derivative in terms of itself, h*stat/K, was 0/0 at K = 0 (h*K**(h - 1) is 0)
        "hill_rows",
        "sum(x**h/(K**h + x**h), dim=-1)",
        {"x": {"shape": [4, 5]}, "K": {"shape": [5], "learnable": True, "init": 1.0}},
        lambda x, k, h: (x**h / (k**h + x**h)).sum(-1),
        {"h": {"type": "float", "default": 2.5}},
    ),
    _op(  # a learnable per-feature log-variance: its per-row share (a mean's spread gradient) and exp(-logv)'s,
        # summed already, were added before summing (the latter counted once per row), then at the second
        # shape summed over the example's leading dims only
        "gaussian_nll_rows",
        "mean(0.5*(logv + (x - mu)**2*exp(-logv)), dim=-1)",
        {"x": {"shape": [6, 16]}, "mu": {"shape": [6, 16]}, "logv": {"shape": [16], "learnable": True, "init": 0.0}},
        lambda x, mu, logv: (0.5 * (logv + (x - mu) ** 2 * torch.exp(-logv))).mean(-1),
    ),
    _op(  # distillation's KL with a learnable temperature: softmax recomputed as exp(log_softmax) where y's
        # gradient alone is needed, its log_softmax was computed only for x's (an UnboundLocalError); the same
        # in kl_softmax with fuse = true
        "distillation_kl",
        "sum(softmax(x/T, dim=-1)*(log_softmax(x/T, dim=-1) - log_softmax(y/T, dim=-1)), dim=-1)*T**2",
        {
            "x": {"shape": [4, 6]},
            "y": {"shape": [4, 6]},
            "T": {"shape": [], "learnable": True, "init": 2.0, "domain": [0.5, 4.0]},
        },
        lambda x, y, t: _kl(x / t, y / t) * t**2,
    ),
]
