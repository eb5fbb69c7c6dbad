"""Swish with a learnable beta, as the long guide (reference 000, "Example 1") writes it.

The guide calls save_for_backward twice in forward (the first call is dead: the second replaces it), and it
saves sigmoid(beta * x), an intermediate computed without grad, so the double backward treats it as a
constant and is wrong.
"""

import torch
from torch.autograd import Function


class SwishFunction(Function):
    """f(x) = x * sigmoid(beta * x), beta a learnable 0-d tensor."""

    @staticmethod
    def forward(ctx, input, beta):
        ctx.save_for_backward(input, beta)
        # Compute sigmoid(beta * input)
        sigmoid_beta_input = torch.sigmoid(beta * input)
        # Save for backward (more efficient than recomputing)
        ctx.save_for_backward(input, beta, sigmoid_beta_input)
        output = input * sigmoid_beta_input
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, beta, sigmoid_beta_input = ctx.saved_tensors
        grad_input = grad_beta = None
        if ctx.needs_input_grad[0]:
            sigmoid_derivative = sigmoid_beta_input * (1 - sigmoid_beta_input)
            grad_input = grad_output * (sigmoid_beta_input + input * sigmoid_derivative * beta)
        if ctx.needs_input_grad[1]:
            sigmoid_derivative = sigmoid_beta_input * (1 - sigmoid_beta_input)
            grad_beta = grad_output * (input**2) * sigmoid_derivative
            # Sum over all elements (beta is scalar)
            grad_beta = grad_beta.sum()
        return grad_input, grad_beta
