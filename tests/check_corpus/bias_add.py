"""Bias add, y = x + b for a bias b of shape [features].

Its backward returns grad_output unchanged for the bias too, without summing over the broadcast rows. This is
not a bug in practice: autograd's engine checks every gradient a Function returns against its input's shape
and sums one whose shape the input broadcasts to (validate_outputs: reduce_grad), so b.grad comes out right.
"""

import torch


class BiasAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b):
        return x + b

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, grad_output
