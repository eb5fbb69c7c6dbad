"""Bad input: each case exits 1 with exactly this message on stderr, no traceback, and writes nothing.

The table is the reference for scaffold's error messages; change a message here when you change it in
the code (the test prints the actual message on failure).
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from scaffold.cli import main

CASES = [
    pytest.param(
        [
            "op",
            "--forward",
            "2*logsumexp(x, dim=-1)",
            "--tensor",
            "x=4,4",
            "--tensor",
            "p=4,4",
            "--gradient",
            "x=grad*p",
        ],
        "scaffold: error: command-line flags: gradients.x: grad (shape [4]) has fewer dimensions than the gradient of 'x' (shape [4, 4]), and broadcasting aligns its last dimensions with dimensions the forward reduced away\n  hint: make the reduction the forward's last step, or keep its dimensions with keepdim=True\n",
        id="custom gradient of a reduced output along the wrong dimensions",
    ),
    pytest.param(
        ["op", "--forward", "logsumexp(x, dim=-1)", "--tensor", "x=4,8", "--tensor", "p=4,6", "--gradient", "x=grad*p"],
        "scaffold: error: command-line flags: gradients.x: the gradient of 'x' has shape [4, 6], which does not broadcast to the shape of 'x', [4, 8]\n  hint: a gradient has its tensor's shape, or one that broadcasts to it (it is summed back over the broadcast dimensions); keepdim=True keeps a reduced dimension as 1\n",
        id="custom gradient of another shape in a structured op",
    ),
    pytest.param(
        ["op", "--forward", "sum(x, dim=-1)", "--tensor", "x=4,8", "--tensor", "p=8,4", "--gradient", "x=grad*p"],
        "scaffold: error: command-line flags: gradients.x: the gradient of 'x' combines tensors whose shapes do not broadcast together: grad [4, 1], p [8, 4]\n  hint: grad has the output's shape (a reduced output's with its reduced dimensions as 1); keepdim=True keeps a reduced dimension as 1\n",
        id="custom gradient whose shapes do not broadcast in a structured op",
    ),
    pytest.param(
        ["op", "--forward", "sum(x, dim=-1)", "--tensor", "x=4,8", "--gradient", "x=grad*sum(grad*x, dim=-1)"],
        "scaffold: error: command-line flags: gradients.x: the gradient reads sum(grad*x, dim=-1), a reduction, softmax or product of the upstream gradient: backward computes a custom gradient elementwise from grad and the forward's values\n  hint: write the gradient as grad times (elementwise math of) the forward's values\n",
        id="custom gradient reducing the upstream gradient",
    ),
    pytest.param(
        ["op", "--forward", "sum(x, dim=(0, -1))", "--tensor", "x=4,5"],
        "scaffold: error: command-line flags: forward: sum() got dim=(0, -1), which counts some dimensions from the front and some from the back: which dimensions those are depends on the input's rank\n  hint: count them all from the front (dim=(0, 1)) or all from the back (dim=(-2, -1))\n",
        id="reduction dims counted from both ends",
    ),
    pytest.param(
        ["op", "--forward", "", "--tensor", "x"],
        'scaffold: error: command-line flags: forward: the forward expression is empty\n  hint: give the math of the op, e.g. forward = "x / (1 + exp(-x))"\n',
        id="empty expression",
    ),
    pytest.param(
        ["op", "--forward", "   ", "--tensor", "x"],
        'scaffold: error: command-line flags: forward: the forward expression is empty\n  hint: give the math of the op, e.g. forward = "x / (1 + exp(-x))"\n',
        id="blank expression",
    ),
    pytest.param(
        ["op", "--forward", "x +", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: cannot parse 'x +': invalid syntax\n  hint: write Python-style math, e.g. x / (1 + exp(-x)); powers are written **\n",
        id="unparseable",
    ),
    pytest.param(
        ["op", "--forward", "x + y", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: unknown name 'y' (declared arguments: x)\n  hint: declare it with --tensor y or --scalar y=VALUE, or [tensors.y] in the spec\n",
        id="unknown symbol",
    ),
    pytest.param(
        ["op", "--forward", "gamma(x)", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: unknown function 'gamma'\n  hint: did you mean 'lgamma'? supported: Abs, abs, acos, acosh, amax, amin, argmax, argmin, asin, asinh, atan, atan2, atanh, cat, cbrt, ceil, clamp, cos, cosh, cot, csc, cumprod, cumsum, digamma, elu, erf, erfc, erfcx, erfinv, exp, exp2, expit, expm1, flatten, floor, gather, gelu, gelu_tanh, hardsigmoid, hardswish, hardtanh, Heaviside, hypot, leaky_relu, lgamma, ln, log, log10, log1p, log2, log_ndtr, log_softmax, logaddexp, loggamma, logit, logsigmoid, logsumexp, Max, max, mean, Min, min, mish, ndtr, one_hot, Piecewise, polygamma, Rational, relu, reshape, round, sec, sigmoid, sign, silu, sin, sinh, softmax, softplus, sqrt, squeeze, stack, sum, tan, tanh, transpose, trunc, unsqueeze, where, xlog1py, xlogy\n",
        id="unknown function",
    ),
    pytest.param(
        ["1op", "--forward", "x", "--tensor", "x"],
        "scaffold: error: command-line flags: name: op name '1op' is not a valid name: use ASCII letters, digits and underscores, starting with a letter\n  hint: try 'v1op'\n",
        id="bad op name",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "ｘ"],
        "scaffold: error: --tensor ｘ: argument name 'ｘ' is not a valid name: use ASCII letters, digits and underscores, starting with a letter\n  hint: try 'x'\n",
        id="non-ascii name",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "lambda"],
        "scaffold: error: --tensor lambda: argument name 'lambda' is a Python keyword\n  hint: try 'lambda_'\n",
        id="keyword argument name",
    ),
    pytest.param(
        ["op", "--forward", "ctx", "--tensor", "ctx"],
        "scaffold: error: command-line flags: tensors.ctx: argument name 'ctx' is used by the generated code itself\n  hint: try 'ctx_'\n",
        id="reserved argument name",
    ),
    pytest.param(
        ["torch", "--forward", "x", "--tensor", "x"],
        "scaffold: error: command-line flags: name: op name 'torch' would shadow a name the generated code or its tests rely on\n  hint: try 'my_torch'\n",
        id="reserved op name",
    ),
    pytest.param(
        ["scale", "--forward", "x * Scale", "--tensor", "x", "--scalar", "Scale=2.0"],
        "scaffold: error: command-line flags: scalars.Scale: argument name 'Scale' would shadow the op's own class\n  hint: rename the argument, e.g. 'Scale_in'\n",
        id="argument shadows op",
    ),
    pytest.param(
        ["op", "--forward", "2 * alpha", "--tensor", "x", "--scalar", "alpha=1.0"],
        "scaffold: error: command-line flags: forward: the forward '2 * alpha' does not depend on any tensor argument (x)\n  hint: use the declared tensors in the expression, or declare the names it uses with --tensor\n",
        id="no tensor in expression",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x", "--tensor", "x=3"],
        "scaffold: error: --tensor x=3: --tensor x is given twice\n  hint: give each argument once, e.g. --tensor x=...\n",
        id="tensor given twice",
    ),
    pytest.param(
        ["op", "--forward", "a * x", "--tensor", "x", "--scalar", "a=1.0", "--scalar", "a=2.0"],
        "scaffold: error: --scalar a=2.0: --scalar a is given twice\n  hint: give each argument once, e.g. --scalar a=...\n",
        id="scalar given twice",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x", "--tensor", "y"],
        "scaffold: error: command-line flags: forward: tensor argument 'y' is declared but not used in the forward\n  hint: remove the declaration or use it in the expression\n",
        id="unused tensor",
    ),
    pytest.param(
        ["op", "--forward", "x.grad", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: attribute access ('.') is not allowed in an expression\n  hint: use numbers, argument names, + - * / **, comparisons and functions such as exp(x)\n",
        id="attribute access",
    ),
    pytest.param(
        ["op", "--forward", "__import__('os').system('echo pwned')", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: only functions can be called, by their plain name, e.g. exp(x)\n  hint: expressions are math only: no attributes, methods, imports or Python builtins\n",
        id="code injection",
    ),
    pytest.param(
        ["op", "--forward", "x^2", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: '^' is not a power here\n  hint: write powers with **, e.g. x**2\n",
        id="caret power",
    ),
    pytest.param(
        ["op", "--forward", "x * 2**10**10", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: the exponent 10000000000 is too large (at most 64) in '2**10**10'\n",
        id="huge power",
    ),
    pytest.param(
        ["op", "--forward", "x > 0", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: the forward 'x > 0' is a condition (a comparison or a bool "
        "tensor), not a number: an op returns floating-point values\n  hint: return it as 0/1 numbers, e.g. "
        "where(x > 0, 1.0, 0.0) or 1*(x > 0), and compare with 0.5 outside; or use Piecewise((value, condition), "
        "(other, True)) for an op defined by cases\n",
        id="condition as forward",
    ),
    pytest.param(
        ["op", "--forward", "Piecewise((x, x > 0))", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: Piecewise needs a last pair whose condition is True, so every input has a value\n  hint: add an 'otherwise' pair such as (0, True)\n",
        id="piecewise without otherwise",
    ),
    pytest.param(
        ["op", "--forward", "x * erfinv(alpha)", "--tensor", "x", "--scalar", "alpha=0.5"],
        "scaffold: error: command-line flags: forward: erfinv(alpha) has only non-tensor arguments and Python's math module has no erfinv\n  hint: declare the argument as a tensor\n",
        id="scalar-only special function",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x", "--scalar", "alpha"],
        "scaffold: error: --scalar alpha: a scalar needs a default value\n  hint: write e.g. --scalar alpha=0.5\n",
        id="scalar without default",
    ),
    pytest.param(
        ["op", "--forward", "x * a", "--tensor", "x", "--scalar", "a=big"],
        "scaffold: error: --scalar a=big: cannot read the default value 'big'\n  hint: write e.g. alpha=0.5, n=3 or flag=true\n",
        id="bad scalar default",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x=4,5.5"],
        "scaffold: error: --tensor x=4,5.5: cannot read shape '4,5.5'\n  hint: write e.g. x=4,5, x=4,features (a size named with --size features=16) or beta=[] for one value\n",
        id="bad shape",
    ),
    pytest.param(
        ["op", "--forward", "x * y", "--tensor", "x=4,5", "--tensor", "y=3"],
        "scaffold: error: command-line flags: tensors.y.shape: the example shapes of x [4, 5] and y [3] do not broadcast together: dimension -1 (counted from the right) is 5 in x and 3 in y\n  hint: each dimension must have the same size or 1 in every tensor, e.g. shape = [5] for y\n",
        id="shapes that do not broadcast",
    ),
    pytest.param(
        ["op", "--tensor", "x"],
        'scaffold: error: missing --forward\n  hint: e.g. scaffold new op swish --forward "x / (1 + exp(-x))" --tensor x, or scaffold new op --spec swish.toml\n',
        id="missing forward",
    ),
    pytest.param(
        ["op", "--spec", "op.toml", "--forward", "x"],
        "scaffold: error: --spec cannot be combined with NAME, --forward\n  hint: put everything in the spec file, or use flags alone\n",
        id="spec and flags",
    ),
    pytest.param(
        ["--spec", "missing.toml"],
        "scaffold: error: missing.toml: spec file not found\n",
        id="missing spec file",
    ),
    pytest.param(
        ["op", "--forward", "Piecewise((x, alpha), (0, True))", "--tensor", "x", "--scalar", "alpha=0.5"],
        "scaffold: error: command-line flags: forward: expected a condition such as x > 0\n  hint: conditions are comparisons, True/False, bool scalars, and &, |, ~ of those\n",
        id="number as condition",
    ),
    pytest.param(
        ["op", "--forward", "Piecewise((x, x), (0, True))", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: expected a condition such as x > 0\n  hint: conditions are comparisons, True/False, bool scalars, and &, |, ~ of those\n",
        id="tensor as condition",
    ),
    pytest.param(
        ["op", "--forward", "Piecewise((x, log(-1) < x), (0, True))", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: this is not defined for real numbers (Invalid comparison of non-real I*pi) in 'log(-1) < x'\n  hint: constants must be finite real numbers: log(-1), asin(2) or atan2(0, 0) are not\n",
        id="non-real constant in a comparison",
    ),
    pytest.param(
        ["op", "--forward", "x * atanh(2)", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: atanh(2) is not a finite real number\n  hint: keep constants and scalar defaults inside each function's domain\n",
        id="unevaluated non-real constant",
    ),
    pytest.param(
        ["op", "--forward", "x * sqrt(alpha)", "--tensor", "x", "--scalar", "alpha=-1.0"],
        "scaffold: error: command-line flags: forward: with the default alpha = -1.0, sqrt(alpha) is not a finite real number\n  hint: keep constants and scalar defaults inside each function's domain\n",
        id="scalar default outside the domain",
    ),
    pytest.param(
        ["op", "--forward", "sqrt(sin(x) - 2)", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: no test inputs were found where the forward and its derivatives are finite and real (tried x in [0.25, 3], [0.1, 0.9], [1.25, 4], [3, 6], [-0.9, -0.1], [-3, -0.25])\n  hint: declare where the op is defined: domain = [1.0, 2.0] in the spec's [tensors.x], or --domain x=1.0,2.0 on the command line\n",
        id="never real",
    ),
    pytest.param(
        ["op", "--forward", "x + (1e-200**2)**2", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: the power has more than 300 digits in '1e-200**2'\n",
        id="tiny power",
    ),
    pytest.param(
        ["op", "--forward", "x * needs_input_grad", "--tensor", "x", "--scalar", "needs_input_grad=1.0"],
        "scaffold: error: command-line flags: scalars.needs_input_grad: argument name 'needs_input_grad' is used by the generated code itself\n  hint: try 'needs_input_grad_'\n",
        id="argument named like a ctx attribute",
    ),
    pytest.param(
        ["reference", "--forward", "x", "--tensor", "x"],
        "scaffold: error: command-line flags: name: op name 'reference' would shadow a name the generated code or its tests rely on\n  hint: try 'my_reference'\n",
        id="op named after a test helper",
    ),
    pytest.param(
        ["inspect", "--forward", "x", "--tensor", "x"],
        "scaffold: error: command-line flags: name: op name 'inspect' is also the name of Python's standard module inspect, which the generated code, torch or pytest import: the op's module inspect.py would shadow it where its tests run\n  hint: try 'my_inspect'\n",
        id="op named like a module the generated code imports",
    ),
    pytest.param(
        ["op", "--forward", "(lambda: __import__('os').system('id'))()", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: only functions can be called, by their plain name, e.g. exp(x)\n  hint: expressions are math only: no attributes, methods, imports or Python builtins\n",
        id="lambda call",
    ),
    pytest.param(
        ["op", "--forward", "__import__", "--tensor", "__import__"],
        "scaffold: error: --tensor __import__: argument name '__import__' is not a valid name: use ASCII letters, digits and underscores, starting with a letter\n  hint: try 'import_'\n",
        id="dunder argument",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "ｘ"],
        "scaffold: error: --tensor ｘ: argument name 'ｘ' is not a valid name: use ASCII letters, digits and underscores, starting with a letter\n  hint: try 'x'\n",
        id="look-alike argument",
    ),
    pytest.param(
        ["op", "--forward", "+".join(["x"] * 40000), "--tensor", "x"],
        "scaffold: error: command-line flags: forward: the forward is 79999 characters long, more than the 5000 allowed\n  hint: write it shorter: name a part used several times as a step (h = ...), one step per line\n",
        id="80 kB forward",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x", "--gradient", "x=" + "-" * 6000 + "grad"],
        "scaffold: error: command-line flags: gradients.x: the gradient is 6004 characters long, more than the 5000 allowed\n  hint: write it shorter: name a part used several times as a step (h = ...), one step per line\n",
        id="long custom gradient",
    ),
    pytest.param(
        ["op", "--forward", "-" * 4990 + "x", "--tensor", "x"],
        "scaffold: error: command-line flags: forward: the expression is nested more than 60 levels deep\n  hint: write it with fewer nested operations, or in steps, one per line\n",
        id="nested too deep for the parser",
    ),
    # --- sizes and init schemes ---
    pytest.param(
        [
            "linear",
            "--forward",
            "x @ w",
            "--tensor",
            "x=8,16",
            "--tensor",
            "w=n_in,n_out",
            "--learnable",
            "w=linear",
            "--size",
            "n_in=16",
            "--size",
            "n_out=32",
        ],
        'scaffold: error: command-line flags: tensors: the op\'s shapes do not hold at other sizes (n_in = 17, n_out = 33): @ of x (shape [8, 16]) and w (shape [17, 33]): the inner dimensions 16 and 17 differ\n  hint: a dimension that must equal a named size takes its name in every shape, e.g. x = [8, "in_features"] where weight is ["out_features", "in_features"]\n',
        id="a product's inner dimension named in one tensor only",
    ),
    pytest.param(
        [
            "op",
            "--forward",
            "h0 = x\n" + "".join(f"h{i} = exp(h{i - 1})\n" for i in range(1, 70)) + "h69",
            "--tensor",
            "x",
        ],
        "scaffold: error: command-line flags: forward: the forward is nested more than 60 levels deep once its steps are substituted (70)\n  hint: each step nests in the steps that use it: write the op with fewer steps inside one another\n",
        id="steps nested too deep",
    ),
    pytest.param(
        [
            "op",
            "--forward",
            "x*w",
            "--tensor",
            "x=4,m",
            "--tensor",
            "w=n",
            "--learnable",
            "w",
            "--size",
            "n=16",
            "--size",
            "m=16",
        ],
        "scaffold: error: command-line flags: tensors.w.shape: dimension -1 (counted from the right) is size 'm' in x, but w names it 'n': dimensions that broadcast together are one size\n  hint: write \"m\" there in the shape of w\n",
        id="broadcast dimension named twice",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x=4,features"],
        "scaffold: error: command-line flags: tensors.x.shape: size 'features' is not declared in [sizes]\n  hint: give its example value: features = 16 under [sizes], or --size features=16 on the command line\n",
        id="undeclared size",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x=4,5", "--size", "features=16"],
        "scaffold: error: command-line flags: sizes.features: size 'features' is declared in [sizes] but no tensor's shape uses it\n  hint: use it in a shape, e.g. shape = [4, \"features\"], or remove it\n",
        id="unused size",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x=4,features", "--size", "features=0"],
        "scaffold: error: command-line flags: sizes.features: size 'features' must be a positive integer (its example value), got 0\n  hint: e.g. features = 16\n",
        id="size not positive",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x=4,features", "--size", "features=many"],
        "scaffold: error: --size features=many: cannot read size 'features=many'\n  hint: write NAME=VALUE, e.g. --size features=16\n",
        id="size not a number",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x=4,n", "--size", "n=3", "--size", "n=4"],
        "scaffold: error: --size n=4: --size n is given twice\n  hint: give each argument once, e.g. --size n=...\n",
        id="size given twice",
    ),
    pytest.param(
        ["op", "--forward", "x*w", "--tensor", "x=4,w", "--tensor", "w=w", "--size", "w=3"],
        "scaffold: error: command-line flags: sizes.w: size name 'w' is also an argument of the op\n  hint: try 'w_size'\n",
        id="size named like an argument",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x=4,exp", "--size", "exp=3"],
        "scaffold: error: command-line flags: sizes.exp: size name 'exp' is the name of a function or constant in expressions\n  hint: try 'exp_size'\n",
        id="size named like a function",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x=4,mean", "--size", "mean=3"],
        "scaffold: error: command-line flags: sizes.mean: size name 'mean' is the name of a function or constant in expressions\n  hint: try 'mean_size'\n",
        id="size named like a structural function",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x=4,len", "--size", "len=3"],
        "scaffold: error: command-line flags: sizes.len: size name 'len' is used by the generated code itself\n  hint: try 'len_size'\n",
        id="size named like a builtin",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x=4,training", "--size", "training=3"],
        "scaffold: error: command-line flags: sizes.training: size name 'training' is used by the generated code itself\n  hint: try 'training_size'\n",
        id="size named like a Module attribute",
    ),
    pytest.param(
        ["op", "--forward", "x", "--tensor", "x=4,lambda", "--size", "lambda=3"],
        "scaffold: error: --size lambda=3: size name 'lambda' is a Python keyword\n  hint: try 'lambda_'\n",
        id="size keyword",
    ),
    pytest.param(
        ["op", "--forward", "y = x*2; z = y+1", "--tensor", "x=4,z", "--size", "z=3", "--output", "z"],
        "scaffold: error: command-line flags: sizes.z: size name 'z' is also an output of the op\n  hint: try 'z_size'\n",
        id="size named like an output",
    ),
    pytest.param(
        ["op", "--forward", "n = x*2; n+1", "--tensor", "x=4,n", "--size", "n=3"],
        "scaffold: error: command-line flags: forward, line 1: step 'n' has the name of a size in [sizes]\n  hint: name the step differently, e.g. 'n_1', or rename the size\n",
        id="size named like a step",
    ),
    pytest.param(
        ["op", "--forward", "x*beta", "--tensor", "x=4,beta_init", "--size", "beta_init=3", "--learnable", "beta"],
        "scaffold: error: command-line flags: sizes.beta_init: 'beta_init' is the name the Module gives beta's initial value\n  hint: try 'beta_start'\n",
        id="size named like an initial value",
    ),
    pytest.param(
        ["op", "--forward", "x*w", "--tensor", "x", "--learnable", "w=gaussian"],
        'scaffold: error: command-line flags: tensors.w.init: unknown init \'gaussian\'\n  hint: use a number or one of "ones", "zeros", "normal(mean, std)", "uniform(low, high)", "kaiming_uniform", "xavier_uniform", "linear"\n',
        id="unknown init",
    ),
    pytest.param(
        ["op", "--forward", "x*w", "--tensor", "x", "--learnable", "w=normal(0, big)"],
        "scaffold: error: command-line flags: tensors.w.init: cannot read 'big' in init 'normal(0, big)' as a finite number\n  hint: write e.g. \"normal(0.0, 0.02)\"\n",
        id="init with a bad number",
    ),
    pytest.param(
        ["op", "--forward", "x*w", "--tensor", "x", "--learnable", "w=uniform(0, inf)"],
        "scaffold: error: command-line flags: tensors.w.init: cannot read 'inf' in init 'uniform(0, inf)' as a finite number\n  hint: write e.g. \"uniform(-0.1, 0.1)\"\n",
        id="init not finite",
    ),
    pytest.param(
        ["op", "--forward", "x*w", "--tensor", "x", "--learnable", "w=normal(0, -1)"],
        "scaffold: error: command-line flags: tensors.w.init: the std of init 'normal(0, -1)' must be positive\n  hint: e.g. \"normal(0.0, 0.02)\"\n",
        id="init normal std",
    ),
    pytest.param(
        ["op", "--forward", "x*w", "--tensor", "x", "--learnable", "w=uniform(1, -1)"],
        "scaffold: error: command-line flags: tensors.w.init: init 'uniform(1, -1)' needs low < high\n  hint: e.g. \"uniform(-0.1, 0.1)\"\n",
        id="init uniform order",
    ),
    pytest.param(
        ["op", "--forward", "x*w", "--tensor", "x", "--learnable", "w=__import__('os')"],
        'scaffold: error: command-line flags: tensors.w.init: unknown init "__import__(\'os\')"\n  hint: use a number or one of "ones", "zeros", "normal(mean, std)", "uniform(low, high)", "kaiming_uniform", "xavier_uniform", "linear"\n',
        id="init code",
    ),
    pytest.param(
        ["op", "--forward", "x*w", "--tensor", "x", "--tensor", "w=5", "--learnable", "w=kaiming_uniform"],
        'scaffold: error: command-line flags: tensors.w.init: init \'kaiming_uniform\' needs a tensor of two or more dimensions (fan-in and fan-out), and w has shape [5]\n  hint: give a weight [out, in] this scheme; a bias takes "linear", "zeros" or a number\n',
        id="kaiming on a vector",
    ),
    pytest.param(
        ["op", "--forward", "x + b", "--tensor", "x", "--tensor", "b=5", "--learnable", "b=linear"],
        'scaffold: error: command-line flags: tensors.b.init: init "linear" of b is nn.Linear\'s bias scheme, uniform in +-1/sqrt(fan_in) of its weight, and no learnable tensor of two or more dimensions has init "linear"\n  hint: give the weight init = "linear" too, or give the bias another init, e.g. "zeros"\n',
        id="linear bias without a weight",
    ),
    pytest.param(
        [
            "op",
            "--forward",
            "x @ transpose(w1, 0, 1) + x @ transpose(w2, 0, 1) + b",
            "--tensor",
            "x=4,5",
            "--tensor",
            "w1=3,5",
            "--tensor",
            "w2=3,5",
            "--tensor",
            "b=3",
            "--learnable",
            "w1=linear",
            "--learnable",
            "w2=linear",
            "--learnable",
            "b=linear",
        ],
        'scaffold: error: command-line flags: tensors.b.init: init "linear" of b: w1, w2 all have init "linear", and no one of them alone has b\'s last size name in its first dimension\n  hint: name each layer\'s output size, e.g. weight shape = ["out", "in"] and bias shape = ["out"]\n',
        id="linear bias of two weights",
    ),
]


@pytest.mark.parametrize(("argv", "message"), CASES)
def test_bad_input_is_refused_cleanly(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "op.toml").write_text('name = "op"\nforward = "x"\n[tensors.x]\n')
    before = sorted(tmp_path.iterdir())
    assert main(["new", "op", *argv]) == 1
    captured = capsys.readouterr()
    assert captured.err == message
    assert captured.out == ""
    assert "Traceback" not in captured.err
    assert sorted(tmp_path.iterdir()) == before, "a refused generation must write nothing"


# --- inside a project --------------------------------------------------------------------------------
# Each case edits a fresh project holding the op cube (shell-like: (path, old, new) replacements, or
# (path, None, text) to write a file, (path, None, None) to delete it), runs the command in it, and
# expects exactly this message; nothing in the project may change. {root} is the project's folder.

CUBE_SPEC = "specs/cube.toml"
PROJECT_CASES = [
    pytest.param(
        [], ["update", "op", "../evil"],
        "scaffold: error: scaffold update op: op name '../evil' is not a valid name: use ASCII letters, digits and underscores, starting with a letter\n  hint: try 'evil'\n",
        id="update a path",
    ),
    pytest.param(
        [], ["update", "op", "nope"],
        "scaffold: error: {root}: specs/nope.toml does not exist\n  hint: write specs/nope.toml and run `scaffold new op --spec specs/nope.toml`, or use `scaffold new op nope` with flags\n",
        id="update an unknown op",
    ),
    pytest.param(
        [(CUBE_SPEC, 'name = "cube"', 'name = "cubic"')], ["update", "op", "cube"],
        "scaffold: error: specs/cube.toml: name: the spec is named 'cubic' but its file is cube.toml\n  hint: rename the file to cubic.toml or set name = 'cube'\n",
        id="spec renamed",
    ),
    pytest.param(
        [("src/demo/ops/cube.py", "    @staticmethod\n    def backward", "<<<<<<< yours\n    @staticmethod\n    def backward")],
        ["update"],
        "scaffold: error: src/demo/ops/cube.py: conflict markers from the last update are still there (line 49); nothing was written\n  hint: resolve them (keep the lines you want, delete the <<<<<<<, ======= and >>>>>>> lines), then update again\n",
        id="unresolved conflict",
    ),
    pytest.param(
        [("src/demo/__init__.py", "# --- scaffold exports: end ---\n", "")], ["update"],
        "scaffold: error: src/demo/__init__.py: the export markers are broken: scaffold needs exactly one begin line before one end line\n  hint: keep one '# --- scaffold exports: begin ---' and one '# --- scaffold exports: end ---' line, or remove both\n",
        id="export marker deleted",
    ),
    pytest.param(
        [(".scaffold/cube/record.toml", None, "garbage [\n")], ["update"],
        "scaffold: error: .scaffold/cube/record.toml: the record of the last generation is damaged (Expected '=' after a key in a key/value pair (at line 1, column 9))\n  hint: restore it from version control, or delete .scaffold/cube to merge without a base\n",
        id="damaged record",
    ),
    pytest.param(
        [(".scaffold/cube/cube.py.base", None, None)], ["update"],
        "scaffold: error: .scaffold/cube/record.toml: .scaffold/cube/cube.py.base is missing\n  hint: restore it from version control, or delete .scaffold/cube to merge without a base\n",
        id="missing base",
    ),
    pytest.param(
        [(CUBE_SPEC, "forward = ", "forward =  ")], ["update", "op", "cube", "--forward", "x**4"],
        "scaffold: error: specs/cube.toml: the flags change lines of the spec that you have edited; nothing was written\n  hint: make the change in specs/cube.toml itself, then run `scaffold update op cube`\n",
        id="flags over an edited spec line",
    ),
    pytest.param(
        [], ["new", "op", "cube", "--forward", "x**2", "--tensor", "x"],
        "scaffold: error: {root}: the op 'cube' already exists in this project (specs/cube.toml, src/demo/ops/cube.py, tests/test_cube.py); nothing was written\n  hint: run `scaffold update op cube` to regenerate it and keep your edits, or pass --force to overwrite\n",
        id="new op over an existing one",
    ),
    pytest.param(
        [(CUBE_SPEC, None, None)], ["update"],
        'scaffold: error: {root}: the project has no ops: specs/ holds no NAME.toml\n  hint: add one with scaffold new op NAME --forward "..." --tensor x\n',
        id="no specs",
    ),
    pytest.param(
        [("pyproject.toml", 'package = "demo"', 'package = "demo2"')], ["update"],
        "scaffold: error: {root}/pyproject.toml: [tool.scaffold]: the package's src/demo2/__init__.py is missing\n  hint: create it, or set package (and src) to where the package is\n",
        id="package missing",
    ),
    pytest.param(
        [("pyproject.toml", 'package = "demo"', 'packages = "demo"')], ["update"],
        "scaffold: error: {root}/pyproject.toml: [tool.scaffold]: unknown key 'packages'\n  hint: the keys are package and src\n",
        id="unknown project key",
    ),
    pytest.param(
        [], ["update", "op", "--forward", "x"],
        "scaffold: error: flags that change the spec need the op's name\n  hint: scaffold update op NAME --forward ...\n",
        id="flags without a name",
    ),
    pytest.param(
        [(CUBE_SPEC, '"x**3"', '"x**3 + y"')], ["update"],
        "scaffold: error: specs/cube.toml: forward: unknown name 'y' (declared arguments: x)\n  hint: declare it with --tensor y or --scalar y=VALUE, or [tensors.y] in the spec\n",
        id="bad math in the spec",
    ),
    pytest.param(
        [(CUBE_SPEC, '"x**3"', '"' + "+".join(["x"] * 40000) + '"')], ["update"],
        "scaffold: error: specs/cube.toml: forward: the forward is 79999 characters long, more than the 5000 allowed\n  hint: write it shorter: name a part used several times as a step (h = ...), one step per line\n",
        id="80 kB forward in the spec",
    ),
    pytest.param(
        [(CUBE_SPEC, '"x**3"', '"x**3"\nnested = ' + "[" * 3000 + "]" * 3000)], ["update"],
        "scaffold: error: {root}/specs/cube.toml: invalid TOML: arrays or tables nested too deeply to read\n  hint: a spec's values are strings, numbers, and lists of numbers\n",
        id="spec nested too deep for TOML",
    ),
    pytest.param(
        [(CUBE_SPEC, '"x**3"', '"x**3"\n' + "# a long comment\n" * 7000)], ["update"],
        "scaffold: error: {root}/specs/cube.toml: the spec file is 119060 characters long, more than the 100000 allowed\n  hint: a spec holds one op: its name, forward, arguments and options\n",
        id="spec file too long",
    ),
    pytest.param(
        [], ["new", "project", "."],
        "scaffold: error: .: the folder already exists and is not empty; nothing was written\n  hint: choose a new folder; to update a project from a newer template, run `scaffold update project` in it "
        "(`copier update` if copier copied it from a git-tracked template)\n",
        id="new project over a project",
    ),
    pytest.param(
        [], ["new", "project", "2024-ops", "--defaults"],
        "scaffold: error: 2024-ops: the template refused the answers: Validation error for question 'project_name': The project name must start with a letter and contain only letters, digits, '-', '_' and '.'\n  hint: the project is named after its folder, '2024-ops', and its package after the project: choose them with --data project_name=NAME (and --data package_name=NAME)\n",
        id="new project in a folder that cannot name it",
    ),
    pytest.param(
        [], ["new", "project", "json", "--defaults"],
        "scaffold: error: json: the package name 'json' is also the name of Python's standard module json, which the project's tests import: with src/ on their path, the package would shadow it\n  hint: the project is named after its folder, 'json', and its package after it: choose another with --data package_name=NAME\n",
        id="new project whose package would shadow a module",
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def cube_project(tmp_path_factory):
    root = tmp_path_factory.mktemp("made") / "demo"
    assert main(["new", "project", str(root), "--defaults", "--data", "project_name=demo"]) == 0
    cwd = os.getcwd()
    try:
        os.chdir(root)
        assert main(["new", "op", "cube", "--forward", "x**3", "--tensor", "x"]) == 0
    finally:
        os.chdir(cwd)
    return root


def _files(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("edits", "argv", "message"), PROJECT_CASES)
def test_bad_input_in_a_project_is_refused_cleanly(edits, argv, message, cube_project, tmp_path, monkeypatch, capsys):
    root = tmp_path / "demo"
    shutil.copytree(cube_project, root)
    for path, old, new in edits:
        target = root / path
        if old is None and new is None:
            target.unlink()
        elif old is None:
            target.write_text(new)
        else:
            assert old in target.read_text(), f"the case's edit does not apply to {path}"
            target.write_text(target.read_text().replace(old, new, 1))
    before = _files(root)
    monkeypatch.chdir(root)
    capsys.readouterr()
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err == message.format(root=root)
    assert "Traceback" not in captured.err
    assert _files(root) == before, "a refused command must write nothing"


# --- ruff, which formats generated code --------------------------------------------------------------
# Each case breaks ruff the way a user's environment can (scaffold finds it through ruff's own package:
# ruff.__main__.find_ruff_bin), then generates an op: outside a project, and inside one.

FAKE_RUFF = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "ruff {version}"; exit 0; fi
cat > /dev/null
echo "error: {error}" >&2
exit 2
"""


def _fake_ruff(tmp_path, version="0.17.6", error="something went wrong"):
    """A ruff executable that says it is ``version`` and fails on everything else with ``error``."""
    path = tmp_path / "bin" / f"ruff-{version}"
    path.parent.mkdir(exist_ok=True)
    path.write_text(FAKE_RUFF.format(version=version, error=error))
    path.chmod(0o755)
    return str(path)


def _no_executable():
    raise FileNotFoundError("Could not find the ruff binary")  # what ruff's RuffNotFound is


RUFF_CASES = [
    pytest.param(
        lambda monkeypatch, tmp_path: monkeypatch.setitem(sys.modules, "ruff.__main__", None),
        "scaffold: error: {file}: ruff, which formats generated code, is not installed\n  hint: install it with `python -m pip install ruff==0.17.6`\n",
        id="ruff not installed",
    ),
    pytest.param(
        lambda monkeypatch, tmp_path: monkeypatch.setattr("ruff.__main__.find_ruff_bin", _no_executable),
        "scaffold: error: {file}: ruff, which formats generated code, is installed without its ruff executable\n  hint: reinstall it with `python -m pip install --force-reinstall ruff==0.17.6`\n",
        id="ruff executable missing",
    ),
    pytest.param(
        lambda monkeypatch, tmp_path: monkeypatch.setattr(
            "ruff.__main__.find_ruff_bin", lambda: _fake_ruff(tmp_path, version="0.1.0")
        ),
        "scaffold: error: {tmp}/bin/ruff-0.1.0: scaffold formats generated code with ruff 0.17.6, but this ruff is 0.1.0\n  hint: another version may format differently: install it with `python -m pip install ruff==0.17.6`\n",
        id="another ruff version",
    ),
    pytest.param(
        lambda monkeypatch, tmp_path: monkeypatch.setattr("ruff.__main__.find_ruff_bin", lambda: _fake_ruff(tmp_path)),
        "scaffold: error: {file}: ruff could not format the generated {file}: error: something went wrong\n  hint: this is a bug in scaffold: please report this, with the spec\n",
        id="ruff fails",
    ),
]  # fmt: skip


@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in ruff is a shell script")
@pytest.mark.parametrize(("break_ruff", "message"), RUFF_CASES)
def test_without_a_working_ruff_nothing_is_generated(break_ruff, message, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(out)
    break_ruff(monkeypatch, tmp_path)
    assert main(["new", "op", "cube", "--forward", "x**3", "--tensor", "x"]) == 1
    captured = capsys.readouterr()
    assert captured.err == message.format(file="cube.py", tmp=tmp_path)
    assert "Traceback" not in captured.err
    assert not list(out.iterdir()), "a refused generation must write nothing"


def test_ruff_failing_on_a_projects_settings_says_where_to_look(cube_project, tmp_path, monkeypatch, capsys):
    root = tmp_path / "demo"
    shutil.copytree(cube_project, root)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("line-length = 120", 'line-length = "long"'))
    line = next(i for i, text in enumerate(pyproject.read_text().splitlines(), 1) if text.startswith("line-length"))
    before = _files(root)
    monkeypatch.chdir(root)
    capsys.readouterr()
    assert main(["update"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"scaffold: error: {root}/src/demo/ops/cube.py: ruff could not format the generated src/demo/ops/cube.py "
        f"with the project's ruff settings: Failed to parse pyproject.toml; TOML parse error at line {line}, column 15; "
        'invalid type: string "long", expected i64\n'
        "  hint: check the project's ruff settings (pyproject.toml [tool.ruff], ruff.toml): `ruff format` should "
        "run in the project; if it does, this is a bug in scaffold: please report this\n"
    )
    assert _files(root) == before, "a refused command must write nothing"


def test_a_runtime_that_differs_is_refused_with_its_own_message(tmp_path, monkeypatch, capsys):
    # The folder holds another runtime (an older scaffold's, or edited): the ops beside it import it.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "_scaffold_runtime.py").write_text("# an older runtime\n")
    before = sorted(tmp_path.iterdir())
    assert main(["new", "op", "cube", "--forward", "x**3", "--tensor", "x", "-o", "."]) == 1
    captured = capsys.readouterr()
    assert captured.err == (
        "scaffold: error: refusing to overwrite _scaffold_runtime.py: it differs from the runtime this scaffold "
        "writes (another scaffold version wrote it, or it was edited), and the ops beside it import it; nothing "
        "was written\n  hint: pass --force (force=True from Python) to replace it and regenerate the other ops in "
        "that folder with this scaffold, or choose another --output-dir\n"
    )
    assert sorted(tmp_path.iterdir()) == before and captured.out == ""


# --- int64 tensors (class indices) -------------------------------------------------------------------
INDICES = 'name = "op"\nforward = "sum(x*one_hot(t, num_classes=5), dim=-1)"\n[tensors.x]\n[tensors.t]\nshape = [4]\n'
INDEX_CASES = [
    (
        'dtype = "int32"',
        "scaffold: error: op.toml: tensors.t.dtype: unknown dtype 'int32' (supported: 'float', 'int64', 'bool')\n  "
        'hint: write dtype = "int64" for class indices, dtype = "bool" for a mask, or leave dtype out for a '
        "floating-point tensor\n",
    ),
    (
        'dtype = "bool"',
        "scaffold: error: op.toml: forward: one_hot() takes int64 indices, and this is a condition (a comparison or "
        'a bool tensor)\n  hint: declare the indices as an int64 tensor: [tensors.t] dtype = "int64"; write it as '
        "one_hot(t, num_classes=10), t an int64 tensor\n",
    ),
    (
        'dtype = "bool"\ndomain = [0, 1]',
        "scaffold: error: op.toml: tensors.t.domain: a bool tensor takes no domain: the generated tests draw it True "
        "and False\n  hint: remove 'domain': a bool mask holds True and False (an int64 tensor takes domain = [0, 1])\n",
    ),
    ("dtype = 64", 'scaffold: error: op.toml: tensors.t.dtype: dtype must be a string such as "int64", got 64\n'),
    (
        'dtype = "int64"\ndomain = [0, 2.5]',
        "scaffold: error: op.toml: tensors.t.domain: an int64 tensor's domain must be two integers [low, high] with "
        "low <= high, got [0.0, 2.5]\n  hint: e.g. domain = [0, 9] for the class indices of 10 classes (both ends "
        "included)\n",
    ),
    (
        'dtype = "int64"\nlearnable = true',
        "scaffold: error: op.toml: tensors.t.learnable: an int64 tensor cannot be learnable: it has no gradient\n  "
        "hint: remove 'learnable = true', or drop dtype for a floating-point parameter\n",
    ),
    (
        'dtype = "int64"\navoid = [1.0]',
        "scaffold: error: op.toml: tensors.t.avoid: avoid is only used for floating-point tensors\n",
    ),
    (
        'dtype = "int64"\n[gradients]\nt = "grad"',
        "scaffold: error: op.toml: gradients.t: 't' is an int64 tensor: it has no gradient\n  hint: remove "
        "gradients.t; backward returns None for it\n",
    ),
    (
        'dtype = "int64"\ndomain = [0, 9]',
        "scaffold: error: op.toml: forward: one_hot(t, num_classes=5): the domain of t, [0, 9], has indices outside 0 "
        "to 4, which one_hot refuses\n  hint: declare domain = [0, 4] for t, or raise num_classes\n",
    ),
]


@pytest.mark.parametrize(("table", "message"), INDEX_CASES)
def test_bad_int64_tensors_are_refused_cleanly(table, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "op.toml").write_text(INDICES + table + "\n")
    assert main(["new", "op", "--spec", "op.toml", "-o", "out"]) == 1
    captured = capsys.readouterr()
    assert captured.err == message
    assert not (tmp_path / "out").exists()
