"""Numerically stable log-sum-exp over one dim, as the long guide (reference 000, "Example 2") writes it.

Saves softmax, an intermediate, so its double backward is wrong (not twice differentiable).
"""

import torch
from torch.autograd import Function


class LogSumExp(Function):
    @staticmethod
    def forward(ctx, input, dim):
        # Max trick for numerical stability
        max_val, _ = input.max(dim=dim, keepdim=True)
        input_shifted = input - max_val
        sumexp = torch.exp(input_shifted).sum(dim=dim, keepdim=True)
        logsumexp = torch.log(sumexp) + max_val
        # Save softmax for backward
        softmax = torch.exp(input_shifted) / sumexp
        ctx.save_for_backward(softmax)
        ctx.dim = dim
        return logsumexp.squeeze(dim)

    @staticmethod
    def backward(ctx, grad_output):
        (softmax,) = ctx.saved_tensors
        grad_output_expanded = grad_output.unsqueeze(ctx.dim)
        grad_input = softmax * grad_output_expanded
        return grad_input, None
