"""Softmax over the last dim of a (rows, features) input. BUG: forward and backward use dim=1, counted from the
front, which is the last dim only for 2-D input; with an extra leading batch dimension it normalises over the
rows instead."""

import torch


class Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.exp(x - x.amax(dim=1, keepdim=True))
        y = y / y.sum(dim=1, keepdim=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return y * (grad_output - (grad_output * y).sum(dim=1, keepdim=True))
