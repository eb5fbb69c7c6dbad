# ruff: noqa: N803, N806 (the kernel's names: X, W, RSTD, dY)
"""A plain-torch port of Liger-Kernel's RMSNorm (LigerRMSNormFunction, "llama" casting, offset 0).

Forward flattens to rows, computes rstd = 1 / sqrt(mean(x^2) + eps) per row and saves X, W and RSTD; backward
is the kernel's hand-derived one. RSTD is an intermediate, so the double backward is not right; dW is always
computed, as the kernel does.
"""

import torch


class LigerRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, W, eps):
        shape = X.shape
        X = X.reshape(-1, shape[-1])
        RSTD = torch.rsqrt(X.pow(2).mean(dim=-1) + eps)
        Y = X * RSTD[:, None] * W
        ctx.eps = eps
        ctx.save_for_backward(X, W, RSTD)
        return Y.view(*shape)

    @staticmethod
    def backward(ctx, dY):
        X, W, RSTD = ctx.saved_tensors
        shape = dY.shape
        dY = dY.reshape(-1, shape[-1])
        n_cols = X.shape[-1]
        rstd = RSTD[:, None]
        x_hat = X * rstd
        m = dY * W
        # dX = rstd * (m - x_hat * mean(m * x_hat))
        dX = rstd * (m - x_hat * (m * x_hat).sum(dim=-1, keepdim=True) / n_cols)
        # dW = sum over rows of dY * x_hat
        dW = (dY * x_hat).sum(dim=0)
        return dX.view(*shape), dW, None
