"""The long guide's Swish with its one ctx mistake fixed: save_for_backward is called once.

Still saves sigmoid(beta * x), an intermediate, so its double backward is wrong (not twice differentiable).
"""

import torch


class SwishFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, beta):
        sigmoid_beta_input = torch.sigmoid(beta * input)
        ctx.save_for_backward(input, beta, sigmoid_beta_input)
        return input * sigmoid_beta_input

    @staticmethod
    def backward(ctx, grad_output):
        input, beta, sigmoid_beta_input = ctx.saved_tensors
        grad_input = grad_beta = None
        sigmoid_derivative = sigmoid_beta_input * (1 - sigmoid_beta_input)
        if ctx.needs_input_grad[0]:
            grad_input = grad_output * (sigmoid_beta_input + input * sigmoid_derivative * beta)
        if ctx.needs_input_grad[1]:
            grad_beta = (grad_output * input**2 * sigmoid_derivative).sum()
        return grad_input, grad_beta
