# ruff: noqa: N812 (torch.nn.functional as F, as torch code writes it)
"""Sigmoid focal loss (reduction 'none') with a hand-derived backward, in the style of the widely copied
FocalSigmoidLossFuncV2: intermediates kept in ctx.vars and backward reusing their buffers in place.

BUGS: tensors (among them the label, an input) are kept as a ctx attribute instead of save_for_backward, and
backward mutates the kept probabilities (`probs.mul_(...)`), so a second backward with retain_graph=True
computes from sigmoid(x) * (...) instead of sigmoid(x) and differs from the first.
"""

import torch
from torch.nn import functional as F


class SigmoidFocalLossFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, label, alpha, gamma):
        probs = torch.sigmoid(logits)
        coeff = (label - probs).abs().pow(gamma)
        log_probs = F.logsigmoid(logits)
        log_1_probs = F.logsigmoid(-logits)
        ce = -(alpha * label * log_probs + (1 - alpha) * (1 - label) * log_1_probs)
        loss = coeff * ce
        ctx.vars = (coeff, probs, ce, label, log_probs, log_1_probs, alpha, gamma)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        coeff, probs, ce, label, log_probs, log_1_probs, alpha, gamma = ctx.vars
        diff = label - probs
        d_coeff = gamma * diff.abs().pow(gamma - 1) * diff.sign()  # d coeff / d label
        grad_label = None
        if ctx.needs_input_grad[1]:
            d_ce_label = -(alpha * log_probs - (1 - alpha) * log_1_probs)
            grad_label = grad_output * (d_coeff * ce + coeff * d_ce_label)
        term1 = -d_coeff * probs * (1 - probs) * ce
        # d ce / d logits = (1 - alpha)(1 - label) p - alpha label (1 - p), computed in the probs buffer
        d_ce = probs.mul_((1 - alpha) * (1 - label) + alpha * label).sub_(alpha * label)
        grad_logits = grad_output * (term1 + coeff * d_ce)
        return grad_logits, grad_label, None, None
