"""ReLU whose forward zeroes the negatives of its input in place, as the long guide's "InplaceForward"
(reference 000, Pitfall 1) writes it, with a backward added.

BUG: forward overwrites the caller's tensor (and returns it without ctx.mark_dirty). Values and gradients are
right: relu(x) > 0 exactly where x > 0.
"""

from torch.autograd import Function


class InplaceForward(Function):
    @staticmethod
    def forward(ctx, input):
        input[input < 0] = 0  # IN-PLACE - breaks autograd!
        ctx.save_for_backward(input)
        return input

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        return grad_output * (input > 0).to(grad_output.dtype)
