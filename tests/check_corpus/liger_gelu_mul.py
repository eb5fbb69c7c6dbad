"""An emulation of Liger-Kernel's GEGLU (tanh-GELU(a) * b) Function: the Triton backward writes da and db
into the buffers of a and b to save memory, and returns them.

BUG: backward overwrites the caller's inputs a and b with their gradients (and they are saved tensors, so a
second backward fails autograd's version check).
"""

import math

import torch


class LigerGELUMulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        sqrt_2_over_pi = math.sqrt(2.0 / math.pi)
        tanh_arg = sqrt_2_over_pi * (a + 0.044715 * a * a * a)
        gelu_a = 0.5 * a * (1 + torch.tanh(tanh_arg))
        ctx.save_for_backward(a, b)
        return gelu_a * b

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        sqrt_2_over_pi = math.sqrt(2.0 / math.pi)
        tanh_result = torch.tanh(sqrt_2_over_pi * (a + 0.044715 * a * a * a))
        gelu_a = 0.5 * a * (1 + tanh_result)
        db = dc * gelu_a
        term1 = 0.5 * (1 + tanh_result)
        term2 = 0.5 * a * (1 - tanh_result * tanh_result) * (sqrt_2_over_pi * (1 + 3 * 0.044715 * a * a))
        da = dc * b * (term1 + term2)
        # the kernel stores the gradients in the input buffers
        a.copy_(da)
        b.copy_(db)
        return a, b
