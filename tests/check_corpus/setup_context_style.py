"""Two Functions in the setup_context style (forward without ctx), which torch.func can transform.

- GELU (erf form): right, with generate_vmap_rule and a jvp, so torch.func.grad, vmap and jvp all apply.
- CheckedLog: log(x) that validates its input with a data-dependent Python `if` on a tensor. It is right in
  eager mode, but it claims vmap support (generate_vmap_rule = True) and vmap cannot run that `if`.
"""

import math

import torch


class GELU(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2.0)))

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)

    @staticmethod
    def _slope(x):
        return 0.5 * (1 + torch.erf(x / math.sqrt(2.0))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * GELU._slope(x)

    @staticmethod
    def jvp(ctx, x_tangent):
        (x,) = ctx.saved_tensors
        return x_tangent * GELU._slope(x)


class CheckedLog(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        if (x <= 0).any():
            raise ValueError("CheckedLog needs positive input")
        return torch.log(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output / x
