"""Clipped ReLU with a non-tensor clip value, from the worked example (reference 003), and the deliberately
wrong backward the same text shows gradcheck catching (it forgets the mask)."""

import torch


class ClippedReLUFunction(torch.autograd.Function):
    """Implements the Clipped ReLU function: min(max(0, x), clip_val)."""

    @staticmethod
    def forward(ctx, input_tensor, clip_val):
        clip_val = float(clip_val)
        ctx.save_for_backward(input_tensor)
        ctx.clip_val = clip_val
        output = input_tensor.clamp(min=0, max=clip_val)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (input_tensor,) = ctx.saved_tensors
        clip_val = ctx.clip_val
        # Gradient is 1 where 0 < input < clip_val, 0 otherwise
        grad_input_mask = (input_tensor > 0) & (input_tensor < clip_val)
        grad_input = grad_output * grad_input_mask.float()
        return grad_input, None


def clipped_relu(input_tensor, clip_val=1.0):
    """Applies the Clipped ReLU function element-wise."""
    return ClippedReLUFunction.apply(input_tensor, clip_val)


class IncorrectClippedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_tensor, clip_val):
        ctx.save_for_backward(input_tensor)
        ctx.clip_val = float(clip_val)
        return input_tensor.clamp(min=0, max=ctx.clip_val)

    @staticmethod
    def backward(ctx, grad_output):
        # Incorrect gradient calculation (e.g., forgot the mask)
        grad_input = grad_output.clone()  # Wrong!
        return grad_input, None
