"""The textbook section's Functions (reference 001), as it writes them.

QuadraticFunction returns every gradient whether needed or not (no needs_input_grad check); StableLogSumExp
keeps sum_exp, an intermediate tensor, as a ctx attribute and reduces over every element.
"""

import torch
import torch.nn as nn


class QuadraticFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, b, c):
        """Compute y = ax² + bx + c"""
        ctx.save_for_backward(x, a, b)
        return a * x**2 + b * x + c

    @staticmethod
    def backward(ctx, grad_output):
        """dy/dx = 2ax + b, dy/da = x², dy/db = x, dy/dc = 1"""
        x, a, b = ctx.saved_tensors
        grad_x = grad_output * (2 * a * x + b)
        grad_a = grad_output * x**2
        grad_b = grad_output * x
        grad_c = grad_output  # dy/dc = 1
        return grad_x, grad_a, grad_b, grad_c


class PowerFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, exponent):
        """Compute x^n where n is a Python int."""
        ctx.save_for_backward(x)
        ctx.exponent = exponent  # Non-tensor: store as attribute
        return x**exponent

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        n = ctx.exponent
        grad_x = grad_output * n * x ** (n - 1)
        return grad_x, None  # None for non-differentiable exponent


class ScaledActivation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, use_relu):
        """Apply scaled activation. scale and use_relu are not differentiable."""
        ctx.save_for_backward(x)
        ctx.scale = scale
        ctx.use_relu = use_relu
        out = torch.relu(x) if use_relu else torch.tanh(x)
        return scale * out

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        if ctx.use_relu:
            grad_x = grad_output * ctx.scale * (x > 0).float()
        else:
            grad_x = grad_output * ctx.scale * (1 - torch.tanh(x) ** 2)
        return grad_x, None, None  # None for scale and use_relu


class StableLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        """Compute log(sum(exp(x))) with numerical stability."""
        c = x.max()  # Shift for stability
        exp_shifted = torch.exp(x - c)
        sum_exp = exp_shifted.sum()
        ctx.save_for_backward(exp_shifted)
        ctx.sum_exp = sum_exp
        return c + torch.log(sum_exp)

    @staticmethod
    def backward(ctx, grad_output):
        """d/dx_i log(sum(exp(x))) = exp(x_i) / sum(exp(x)) = softmax(x)_i"""
        (exp_shifted,) = ctx.saved_tensors
        softmax = exp_shifted / ctx.sum_exp
        return grad_output * softmax


class SmoothL1Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta):
        ctx.save_for_backward(x)
        ctx.beta = beta
        abs_x = x.abs()
        out = torch.where(abs_x < beta, 0.5 * x**2 / beta, abs_x - 0.5 * beta)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        beta = ctx.beta
        abs_x = x.abs()
        grad_x = torch.where(abs_x < beta, x / beta, x.sign())
        return grad_output * grad_x, None


class SmoothL1Loss(nn.Module):
    def __init__(self, beta=1.0):
        super().__init__()
        self.beta = beta

    def forward(self, prediction, target):
        diff = prediction - target
        return SmoothL1Function.apply(diff, self.beta).mean()


# A Module instance stands in for the Function: `scaffold check textbook.py:criterion --call ...`.
criterion = SmoothL1Loss(beta=1.0)


class ClipGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clip_value):
        """Forward pass is identity; backward clips the gradient."""
        ctx.clip_value = clip_value
        return x.clone()

    @staticmethod
    def backward(ctx, grad_output):
        """Clip gradient to [-clip_value, clip_value]."""
        clipped = grad_output.clamp(-ctx.clip_value, ctx.clip_value)
        return clipped, None
