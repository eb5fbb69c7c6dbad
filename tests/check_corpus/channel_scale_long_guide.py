"""Per-channel scale of an NCHW tensor by a weight of shape (C, 1, 1): the long guide's "CorrectBroadcast"
(reference 000, Pitfall 7), as written.

BUG: backward sums the weight's gradient over dims (0, 2, 3) counted from the front, which are the broadcast
dims only for a 4-D input; with an extra leading batch dimension the summed gradient has the wrong shape and
autograd rejects it.
"""

from torch.autograd import Function


class CorrectBroadcast(Function):
    @staticmethod
    def forward(ctx, input, weight):
        ctx.save_for_backward(input, weight)
        ctx.input_shape = input.shape
        ctx.weight_shape = weight.shape
        output = input * weight
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        grad_input = grad_output * weight
        grad_weight = grad_output * input
        # Sum over batch (0), height (2), width (3)
        grad_weight = grad_weight.sum(dim=(0, 2, 3), keepdim=True)
        # Squeeze batch dimension: (64, 1, 1)
        grad_weight = grad_weight.squeeze(0)
        return grad_input, grad_weight
