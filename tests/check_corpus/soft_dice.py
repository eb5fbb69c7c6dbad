"""A per-row soft-dice loss on logits with a hand-derived backward, in the style of the widely copied
SoftDiceLossV2Func (squared probabilities in the denominator, soft labels allowed).

BUGS: backward forms the numerator and denominator over the whole tensor instead of per row (right only for
a single row), and it squares the saved probabilities in place (`probs.pow_(2)`), so a second backward through
the same graph fails autograd's saved-tensor version check.
"""

import torch


class SoftDiceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, smooth):
        probs = torch.sigmoid(logits)
        numer = 2 * (probs * labels).sum(dim=-1) + smooth
        denor = (probs * probs + labels).sum(dim=-1) + smooth
        loss = 1.0 - numer / denor
        ctx.save_for_backward(probs, labels)
        ctx.smooth = smooth
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        probs, labels = ctx.saved_tensors
        smooth = ctx.smooth
        numer = 2 * (probs * labels).sum() + smooth
        d_probs = probs * (1 - probs)
        two_p = 2 * probs
        denor = (probs.pow_(2) + labels).sum() + smooth
        g = grad_output.unsqueeze(-1)
        grad_logits = g * -(2 * labels * denor - numer * two_p) / denor**2 * d_probs
        grad_labels = None
        if ctx.needs_input_grad[1]:
            grad_labels = g * -(two_p * denor - numer) / denor**2
        return grad_logits, grad_labels, None
