"""Fused Linear + ReLU, as the long guide (reference 000, "Example 3") writes it.

Keeps the ReLU mask (a bool intermediate, neither input nor output) as a ctx attribute rather than through
save_for_backward; uses input.mm, so it takes 2-D input (batch, in_features) only.
"""

import torch
from torch.autograd import Function


class FusedLinearReLU(Function):
    @staticmethod
    def forward(ctx, input, weight, bias):
        linear_output = input.mm(weight.t())
        if bias is not None:
            linear_output += bias
        output = torch.relu(linear_output)
        relu_mask = linear_output > 0  # Boolean (1 bit per element)
        ctx.save_for_backward(input, weight, bias)
        ctx.relu_mask = relu_mask
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        relu_mask = ctx.relu_mask
        grad_input = grad_weight = grad_bias = None
        grad_linear = grad_output * relu_mask.float()
        if ctx.needs_input_grad[0]:
            grad_input = grad_linear.mm(weight)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_linear.t().mm(input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_linear.sum(0)
        return grad_input, grad_weight, grad_bias
