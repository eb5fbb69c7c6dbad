"""Three small Functions that each break one ctx rule of the guides; their math is right.

- ScaleByTensorAttrs keeps its inputs as ctx attributes (ctx.x = x) instead of save_for_backward.
- ScaleBySavedTwice calls save_for_backward twice (the second call silently replaces the first).
- LeakyReLUMissingNone forgets the None for its non-tensor slope: backward returns 1 value for 2 inputs, which
  autograd rejects on every backward ("returned an incorrect number of gradients").
"""

import torch


class ScaleByTensorAttrs(torch.autograd.Function):
    """y = x * w (w broadcast over x's last dim)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.x = x
        ctx.w = w
        return x * w

    @staticmethod
    def backward(ctx, grad_output):
        x, w = ctx.x, ctx.w
        grad_x = grad_output * w if ctx.needs_input_grad[0] else None
        grad_w = (grad_output * x).sum(dim=tuple(range(x.dim() - 1))) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


class ScaleBySavedTwice(torch.autograd.Function):
    """y = x * w (w broadcast over x's last dim)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x)
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, grad_output):
        x, w = ctx.saved_tensors
        grad_x = grad_output * w if ctx.needs_input_grad[0] else None
        grad_w = (grad_output * x).sum(dim=tuple(range(x.dim() - 1))) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


class LeakyReLUMissingNone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, negative_slope):
        ctx.save_for_backward(x)
        ctx.negative_slope = negative_slope
        return torch.where(x > 0, x, x * negative_slope)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return torch.where(x > 0, grad_output, grad_output * ctx.negative_slope)
