"""Softplus written as log(1 + exp(x)) with backward exp(x) / (1 + exp(x)).

BUG: exp overflows in float32 for x > ~88: forward gives inf and backward inf / inf = nan at x = 100, where
the math is finite (softplus(100) = 100, slope 1). Right in float64 at the usual test inputs.
"""

import torch


class NaiveSoftplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.log(1 + torch.exp(x))

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        e = torch.exp(x)
        return grad_output * e / (1 + e)
