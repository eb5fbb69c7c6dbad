"""Realistic formulas from papers and textbooks, written the way a researcher would type them into scaffold.

Each entry of FORMULAS is a spec mapping (what :func:`scaffold.spec_from_mapping` takes): a single-expression
forward, tensor arguments (some learnable, some per-feature shapes that broadcast against ``[4, 5]``) and
scalar parameters with defaults. ``domain`` is declared only where a user naturally would (labels and
probabilities in [0, 1], a quantile level, ...); everything else is left to scaffold to infer.

TYPICAL gives, per op, the value of each tensor that the independent accuracy check of
``tests/test_realistic.py`` holds it at while it moves another tensor to extreme values (default
DEFAULT_TYPICAL); pick values away from the formula's kinks.

FOUND holds the forwards the property test of ``tests/test_realistic.py`` (random compositions of these
blocks) ever found failing: each must generate, pass its own generated tests and the accuracy check.
"""

from __future__ import annotations

from typing import Any

DEFAULT_TYPICAL = 0.7
SELU_ALPHA = "1.6732632423543772848170429916717"
SELU_SCALE = "1.0507009873554804934193349852946"

FORMULAS: list[dict[str, Any]] = []
TYPICAL: dict[str, dict[str, float]] = {}


def _f(name: str, forward: str, tensors: dict, scalars: dict | None = None, typical: dict | None = None) -> None:
    FORMULAS.append({"name": name, "forward": forward, "tensors": tensors, "scalars": scalars or {}})
    if typical:
        TYPICAL[name] = typical


X = {"x": {}}
FEATURE = {"x": {"shape": [4, 5]}}
PRED = {"y_pred": {}, "y": {}}  # a prediction and its target, both [4, 5]


def _learn(shape: list[int], init: float = 1.0, **extra) -> dict:
    return {"shape": shape, "learnable": True, "init": init, **extra}


def _float(default: float) -> dict:
    return {"type": "float", "default": default}


# --- activations -------------------------------------------------------------------------------------------

# Swish / SiLU with a learnable per-feature slope: Ramachandran, Zoph & Le, "Searching for Activation
# Functions" (2017); Elfwing et al. (2018) for SiLU.
_f("swish_beta", "x / (1 + exp(-beta*x))", {**FEATURE, "beta": _learn([5])}, typical={"beta": 1.0})
# Mish: Misra, "Mish: A Self Regularized Non-Monotonic Activation Function" (2019).
_f("mish", "x*tanh(log(1 + exp(x)))", X)
# GELU, exact and tanh approximation: Hendrycks & Gimpel, "Gaussian Error Linear Units" (2016).
_f("gelu_erf", "0.5*x*(1 + erf(x/sqrt(2)))", X)
_f("gelu_tanh", "0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x**3)))", X)
# ELU: Clevert, Unterthiner & Hochreiter, "Fast and Accurate Deep Network Learning by ELUs" (2015).
_f("elu", "Piecewise((x, x > 0), (alpha*(exp(x) - 1), True))", X, {"alpha": _float(1.0)})
# SELU: Klambauer et al., "Self-Normalizing Neural Networks" (2017).
_f("selu", f"{SELU_SCALE}*Piecewise((x, x > 0), ({SELU_ALPHA}*exp(x) - {SELU_ALPHA}, True))", X)
# CELU: Barron, "Continuously Differentiable Exponential Linear Units" (2017).
_f("celu", "Max(0, x) + Min(0, alpha*(exp(x/alpha) - 1))", X, {"alpha": _float(0.5)})
# Softsign: Bergstra et al. (2009); Glorot & Bengio (2010).
_f("softsign", "x/(1 + Abs(x))", X)
# Softplus: Dugas et al. (2001); with a sharpness beta as in torch.nn.Softplus (no threshold).
_f("softplus", "log(1 + exp(x))", X)
_f("softplus_beta", "log(1 + exp(beta*x))/beta", X, {"beta": _float(2.0)})
# Squareplus: Barron, "Squareplus: A Softplus-Like Algebraic Rectifier" (2021).
_f("squareplus", "(x + sqrt(x**2 + b))/2", X, {"b": _float(4.0)})
# Snake: Ziyin, Hartwig & Ueda, "Neural Networks Fail to Learn Periodic Functions and How to Fix It" (2020),
# with a learnable per-feature frequency.
_f("snake", "x + sin(a*x)**2/a", {**FEATURE, "a": _learn([5], 0.5)}, typical={"a": 0.5})
# Hard-swish and hard-sigmoid: Howard et al., "Searching for MobileNetV3" (2019).
_f("hard_swish", "x*Min(Max(x + 3, 0), 6)/6", X)
_f("hard_sigmoid", "Max(0, Min(1, x/6 + 0.5))", X)
# Leaky ReLU: Maas, Hannun & Ng, "Rectifier Nonlinearities Improve Neural Network Acoustic Models" (2013).
_f("leaky_relu", "Piecewise((x, x >= 0), (negative_slope*x, True))", X, {"negative_slope": _float(0.01)})
# Smish: Wang, Ren & Wang, "Smish: A Novel Activation Function for Deep Learning Methods" (2022).
_f("smish", "x*tanh(log(1 + 1/(1 + exp(-x))))", X)
# Serf: Nag & Bhattacharyya, "SERF: Towards better training of deep neural networks using log-Softplus
# ERror activation Function" (2023).
_f("serf", "x*erf(log(1 + exp(x)))", X)
# Log-sigmoid, as written from its definition.
_f("log_sigmoid", "log(1/(1 + exp(-x)))", X)
# TanhExp: Liu & Di, "TanhExp: A Smooth Activation Function with High Convergence Speed" (2020).
_f("tanh_exp", "x*tanh(exp(x))", X)

# --- robust and regression losses (elementwise) ------------------------------------------------------------

# Huber, "Robust Estimation of a Location Parameter" (1964).
_f(
    "huber",
    "Piecewise((0.5*(y_pred - y)**2, Abs(y_pred - y) <= delta), (delta*(Abs(y_pred - y) - 0.5*delta), True))",
    PRED,
    {"delta": _float(1.0)},
    typical={"y": 0.3},
)
# Smooth L1: Girshick, "Fast R-CNN" (2015).
_f(
    "smooth_l1",
    "Piecewise((0.5*(y_pred - y)**2/beta, Abs(y_pred - y) < beta), (Abs(y_pred - y) - 0.5*beta, True))",
    PRED,
    {"beta": _float(1.0)},
    typical={"y": 0.3},
)
# Log-cosh loss: e.g. Chen et al., "Log Hyperbolic Cosine Loss" (2019).
_f("log_cosh", "log(cosh(y_pred - y))", PRED, typical={"y": 0.3})
# Cauchy / Lorentzian loss with a learnable scale: Black & Anandan (1996).
_f("cauchy", "c**2/2*log(1 + ((y_pred - y)/c)**2)", {**PRED, "c": _learn([])}, typical={"y": 0.3, "c": 1.0})
# Geman-McClure, in Barron's (2019) parametrisation.
_f("geman_mcclure", "2*((y_pred - y)/c)**2/(((y_pred - y)/c)**2 + 4)", PRED, {"c": _float(1.0)}, typical={"y": 0.3})
# Charbonnier, "Two deterministic half-quadratic regularization algorithms" (1994); Lai et al. LapSRN (2017).
_f("charbonnier", "sqrt((y_pred - y)**2 + eps**2)", PRED, {"eps": _float(1e-3)}, typical={"y": 0.3})
# Pseudo-Huber: Hartley & Zisserman, "Multiple View Geometry" (2003), A6.8.
_f("pseudo_huber", "delta**2*(sqrt(1 + ((y_pred - y)/delta)**2) - 1)", PRED, {"delta": _float(1.5)}, typical={"y": 0.3})
# Barron, "A General and Adaptive Robust Loss Function" (CVPR 2019): shape alpha a scalar, scale c learnable.
_f(
    "barron",
    "Abs(alpha - 2)/alpha*((((y_pred - y)/c)**2/Abs(alpha - 2) + 1)**(alpha/2) - 1)",
    {**PRED, "c": _learn([])},
    {"alpha": _float(1.5)},
    typical={"y": 0.3, "c": 1.0},
)
# Tukey's biweight: Beaton & Tukey (1974), c = 4.685 for 95% efficiency.
_f(
    "tukey_biweight",
    "Piecewise((c**2/6*(1 - (1 - (r/c)**2)**3), Abs(r) <= c), (c**2/6, True))",
    {"r": {}},
    {"c": _float(4.685)},
)
# Pinball / quantile loss: Koenker & Bassett, "Regression Quantiles" (1978).
_f(
    "pinball",
    "Piecewise((tau*(y - q), y >= q), ((tau - 1)*(y - q), True))",
    {"q": {}, "y": {}},
    {"tau": _float(0.9)},
    typical={"y": 0.3},
)
# Welsch / Leclerc loss: Dennis & Welsch (1978).
_f("welsch", "c**2/2*(1 - exp(-((y_pred - y)/c)**2/2))", PRED, {"c": _float(1.0)}, typical={"y": 0.3})

# --- classification and likelihood losses -------------------------------------------------------------------

LABEL = {"domain": [0.0, 1.0]}
# Binary cross-entropy on probabilities.
_f("bce", "-(y*log(p) + (1 - y)*log(1 - p))", {"p": {}, "y": LABEL}, typical={"p": 0.3, "y": 0.25})
# Binary cross-entropy with logits, written with the sigmoid spelled out.
_f(
    "bce_logits",
    "-(y*log(1/(1 + exp(-x))) + (1 - y)*log(1 - 1/(1 + exp(-x))))",
    {"x": {}, "y": LABEL},
    typical={"y": 0.25},
)
# Focal loss: Lin et al., "Focal Loss for Dense Object Detection" (2017), alpha-balanced, on logits.
_f(
    "focal",
    "-alpha*y*(1 - 1/(1 + exp(-x)))**gamma*log(1/(1 + exp(-x)))"
    " - (1 - alpha)*(1 - y)*(1/(1 + exp(-x)))**gamma*log(1 - 1/(1 + exp(-x)))",
    {"x": {}, "y": LABEL},
    {"alpha": _float(0.25), "gamma": _float(2.0)},
    typical={"y": 0.25},
)
# Poisson negative log-likelihood with log input (torch.nn.PoissonNLLLoss, log_input=True, full=False).
_f("poisson_nll", "exp(log_rate) - k*log_rate", {"log_rate": {}, "k": {"domain": [0.0, 10.0]}}, typical={"k": 3.0})
# Heteroscedastic Gaussian NLL with a predicted log-variance: Kendall & Gal (2017), eq. 8.
_f("gaussian_nll", "0.5*(log_var + (y - mu)**2*exp(-log_var))", {"y": {}, "mu": {}, "log_var": {}}, typical={"y": 0.3})
# Hinge and squared hinge (SVM, Cortes & Vapnik 1995; L2-SVM), label in [-1, 1].
_f("hinge", "Max(0, 1 - t*x)", {"x": {}, "t": {"domain": [-1.0, 1.0]}}, typical={"t": 1.0, "x": 0.3})
_f("squared_hinge", "Max(0, 1 - t*x)**2", {"x": {}, "t": {"domain": [-1.0, 1.0]}}, typical={"t": 1.0, "x": 0.3})
# Logistic loss with labels in {-1, 1}.
_f("logistic", "log(1 + exp(-t*x))", {"x": {}, "t": {"domain": [-1.0, 1.0]}}, typical={"t": 1.0})
# KL(N(mu, exp(log_var)) || N(0, 1)) of a VAE: Kingma & Welling, "Auto-Encoding Variational Bayes" (2014).
_f("kl_vae", "-0.5*(1 + log_var - mu**2 - exp(log_var))", {"mu": {}, "log_var": {}})
# Pointwise KL divergence term, as torch.nn.KLDivLoss (input is a log-probability).
_f("kl_pointwise", "target*(log(target) - log_q)", {"log_q": {}, "target": {}}, typical={"log_q": -1.0})
# Student-t negative log-likelihood with learnable degrees of freedom and per-feature scale.
_f(
    "student_t_nll",
    "-(lgamma((nu + 1)/2) - lgamma(nu/2) - 0.5*log(nu*pi) - log(sigma) - (nu + 1)/2*log(1 + ((y - mu)/sigma)**2/nu))",
    {"y": {"shape": [4, 5]}, "mu": {"shape": [4, 5]}, "sigma": _learn([5]), "nu": _learn([], 4.0, domain=[0.5, 50.0])},
    typical={"y": 0.3, "sigma": 1.0, "nu": 4.0},
)

# --- physics potentials -------------------------------------------------------------------------------------

# Lennard-Jones (1924) 12-6 potential with learnable well depth and size.
_f(
    "lennard_jones",
    "4*eps*((sigma/r)**12 - (sigma/r)**6)",
    {"r": {}, "eps": _learn([]), "sigma": _learn([])},
    typical={"r": 1.2, "eps": 1.0, "sigma": 1.0},
)
# Morse, "Diatomic Molecules According to the Wave Mechanics" (1929).
_f(
    "morse",
    "D*(1 - exp(-a*(r - r0)))**2",
    {"r": {}, "D": _learn([]), "a": _learn([]), "r0": _learn([])},
    typical={"r": 1.5, "D": 1.0, "a": 1.0, "r0": 1.0},
)
# Coulomb's law in atomic units, and a softened (Plummer) version as in N-body codes.
_f("coulomb", "k*q1*q2/r", {"q1": {}, "q2": {}, "r": {}}, {"k": _float(1.0)})
_f("softened_coulomb", "q1*q2/sqrt(r**2 + eps**2)", {"q1": {}, "q2": {}, "r": {}}, {"eps": _float(0.1)})
# Harmonic bond with per-feature spring constants and rest lengths.
_f("harmonic", "0.5*k*(r - r0)**2", {"r": {}, "k": _learn([5]), "r0": _learn([5])}, typical={"r0": 1.0})
# Buckingham, "The Classical Equation of State of Gaseous Helium, Neon and Argon" (1938).
_f(
    "buckingham",
    "A*exp(-B*r) - C/r**6",
    {"r": {}, "A": _learn([]), "B": _learn([]), "C": _learn([])},
    typical={"r": 1.5, "A": 1.0, "B": 1.0, "C": 1.0},
)
# Yukawa (1935) screened potential.
_f("yukawa", "-g**2*exp(-m*r)/r", {"r": {}, "g": _learn([]), "m": _learn([])}, typical={"g": 1.0, "m": 1.0})
# Debye-Hueckel screened Coulomb interaction of two charges in an electrolyte.
_f(
    "debye_huckel",
    "q1*q2*exp(-kappa*r)/(eps_r*r)",
    {"q1": {}, "q2": {}, "r": {}, "kappa": _learn([])},
    {"eps_r": _float(78.5)},
    typical={"kappa": 1.0},
)
# Extended Debye-Hueckel law: log10 of the activity coefficient at ionic strength I (water, 25 C).
_f(
    "debye_huckel_activity",
    "-A*z**2*sqrt(I)/(1 + B*a*sqrt(I))",
    {"I": {}},
    {"A": _float(0.509), "B": _float(0.328), "a": _float(4.0), "z": {"type": "int", "default": 2}},
)
# Double-well (phi^4 / Landau) potential.
_f("double_well", "lam*(x**2 - v**2)**2", {"x": {}, "lam": _learn([]), "v": _learn([])}, typical={"lam": 1.0, "v": 1.0})

# --- finance ------------------------------------------------------------------------------------------------

# Black & Scholes (1973) call price, N(d) written with erf; all five inputs are tensors.
_D1 = "(log(S/K) + (rate + sigma**2/2)*T)/(sigma*sqrt(T))"
_D2 = f"({_D1} - sigma*sqrt(T))"
_f(
    "bs_call",
    f"S*(1 + erf({_D1}/sqrt(2)))/2 - K*exp(-rate*T)*(1 + erf({_D2}/sqrt(2)))/2",
    {"S": {}, "K": {}, "T": {}, "sigma": {}, "rate": {}},
    typical={"S": 1.0, "K": 0.9, "T": 1.0, "sigma": 0.2, "rate": 0.05},
)
# Black-Scholes put price, N(-d) written with erfc, with the ranges a user would declare.
_f(
    "bs_put",
    f"K*exp(-rate*T)*erfc({_D2}/sqrt(2))/2 - S*erfc({_D1}/sqrt(2))/2",
    {
        "S": {"domain": [50.0, 150.0]},
        "K": {"domain": [50.0, 150.0]},
        "T": {"domain": [0.05, 3.0]},
        "sigma": {"domain": [0.05, 1.0]},
        "rate": {"domain": [0.0, 0.1]},
    },
    typical={"S": 100.0, "K": 105.0, "T": 1.0, "sigma": 0.2, "rate": 0.05},
)
# Log-return of a price series.
_f("log_return", "log(p1/p0)", {"p1": {}, "p0": {}}, typical={"p0": 1.3})

# --- probability densities -----------------------------------------------------------------------------------

# Normal log-density with per-feature mean and scale.
_f(
    "normal_logpdf",
    "-0.5*((x - mu)/sigma)**2 - log(sigma) - 0.5*log(2*pi)",
    {"x": {"shape": [4, 5]}, "mu": _learn([5], 0.0), "sigma": _learn([5])},
    typical={"mu": 0.1, "sigma": 1.0},
)
# Log-normal log-density.
_f(
    "lognormal_logpdf",
    "-log(x*sigma*sqrt(2*pi)) - (log(x) - mu)**2/(2*sigma**2)",
    {"x": {}, "mu": _learn([], 0.0), "sigma": _learn([])},
    typical={"mu": 0.1, "sigma": 1.0},
)
# Gumbel log-density.
_f(
    "gumbel_logpdf",
    "-((x - mu)/beta + exp(-(x - mu)/beta)) - log(beta)",
    {"x": {}, "mu": _learn([], 0.0), "beta": _learn([])},
    typical={"mu": 0.1, "beta": 1.0},
)
# Logistic log-density.
_f(
    "logistic_logpdf",
    "-(x - mu)/s - 2*log(1 + exp(-(x - mu)/s)) - log(s)",
    {"x": {}, "mu": _learn([], 0.0), "s": _learn([])},
    typical={"mu": 0.1, "s": 1.0},
)
# Unnormalised Beta density with tensor shape parameters.
_f(
    "beta_kernel",
    "x**(a - 1)*(1 - x)**(b - 1)",
    {"x": {"domain": [0.0, 1.0]}, "a": _learn([], 2.0), "b": _learn([], 3.0)},
    typical={"x": 0.3, "a": 2.0, "b": 3.0},
)
# Beta log-density.
_f(
    "beta_logpdf",
    "(a - 1)*log(x) + (b - 1)*log(1 - x) + lgamma(a + b) - lgamma(a) - lgamma(b)",
    {"x": {}, "a": _learn([], 2.0), "b": _learn([], 3.0)},
    typical={"x": 0.3, "a": 2.0, "b": 3.0},
)
# Gamma log-density with shape k and scale theta.
_f(
    "gamma_logpdf",
    "(k - 1)*log(x) - x/theta - lgamma(k) - k*log(theta)",
    {"x": {}, "k": _learn([], 2.0), "theta": _learn([])},
    typical={"k": 2.0, "theta": 1.0},
)
# Power laws with a float exponent, and a generalised-normal style |x|**p.
_f("power_law", "x**n", X, {"n": _float(2.5)})
_f("abs_power", "Abs(x)**p", X, {"p": _float(1.5)})
_f("power_law_scaled", "C*x**n", {"x": {}, "C": _learn([5])}, {"n": _float(3.0)})
# Exponential distribution's CDF with a learnable rate.
_f("exponential_cdf", "1 - exp(-lam*x)", {"x": {}, "lam": _learn([])}, typical={"lam": 1.0})

# --- found by the property test of tests/test_realistic.py --------------------------------------------------

FOUND: list[dict[str, Any]] = [
    # Found by test_random_compositions on the tree of this file's first commit (derandomized examples).
    {
        "name": "found_0",
        "forward": "(1 - exp(-((atan((w*(x - y)))) - t)))**2",
        "tensors": {
            "x": {"shape": [4, 5]},
            "y": {"shape": [4, 5]},
            "w": {"shape": [5], "learnable": True, "init": 1.0},
            "t": {"shape": [4, 5]},
        },
        "scalars": {},
    },
    {
        "name": "found_1",
        "forward": "-(t*log(1/(1 + exp(-((Piecewise(((w*x + b), (w*x + b) > 0), (alpha*(exp((w*x + b)) - 1), True))))))) + (1 - t)*log(1 - 1/(1 + exp(-((Piecewise(((w*x + b), (w*x + b) > 0), (alpha*(exp((w*x + b)) - 1), True))))))))",  # noqa: E501
        "tensors": {
            "x": {"shape": [4, 5]},
            "w": {"shape": [5], "learnable": True, "init": 1.0},
            "b": {"shape": [], "learnable": True, "init": 0.0},
            "t": {"shape": [4, 5], "domain": [0.0, 1.0]},
        },
        "scalars": {"alpha": {"type": "float", "default": 1.0}},
    },
    {
        "name": "found_2",
        "forward": "(1 - exp(-((tanh((w*x + b))) - t)))**2",
        "tensors": {
            "x": {"shape": [4, 5]},
            "w": {"shape": [5], "learnable": True, "init": 1.0},
            "b": {"shape": [], "learnable": True, "init": 0.0},
            "t": {"shape": [4, 5]},
        },
        "scalars": {},
    },
    {
        "name": "found_3",
        "forward": "(1 - exp(-((erf((alpha*x))) - t)))**2",
        "tensors": {"x": {"shape": [4, 5]}, "t": {"shape": [4, 5]}},
        "scalars": {"alpha": {"type": "float", "default": 1.0}},
    },
    {
        "name": "found_4",
        "forward": "(1 - exp(-((log(1 + exp((x)))) - t)))**2",
        "tensors": {"x": {"shape": [4, 5]}, "t": {"shape": [4, 5]}},
        "scalars": {},
    },
    {
        "name": "found_5",
        "forward": "4*((1/(1 + (((x + b)**n))**2))**6 - (1/(1 + (((x + b)**n))**2))**3)",
        "tensors": {"x": {"shape": [4, 5]}, "b": {"shape": [], "learnable": True, "init": 0.0}},
        "scalars": {"n": {"type": "int", "default": 3}},
    },
    {
        "name": "found_6",
        "forward": "4*((1/(1 + ((log(1 + exp((x*y)))))**2))**6 - (1/(1 + ((log(1 + exp((x*y)))))**2))**3)",
        "tensors": {"x": {"shape": [4, 5]}, "y": {"shape": [4, 5]}},
        "scalars": {},
    },
    # Found by test_random_compositions and wider searches on 2026-11-23: log cosh under a sigmoid (sympy folds
    # exp(-log(cosh)) into 1/cosh), a Lennard-Jones wrap of large arguments, Huber of a Piecewise (an ITE
    # condition) and Huber of an integer power (Abs of a held power differentiated through re/im).
    {
        "name": "found_7",
        "forward": "-(t*log(1/(1 + exp(-((log(cosh((w*(x - y))))))))) + (1 - t)*log(1 - 1/(1 + "
        "exp(-((log(cosh((w*(x - y))))))))))",
        "tensors": {
            "x": {"shape": [4, 5]},
            "y": {"shape": [4, 5]},
            "w": {"shape": [5], "learnable": True, "init": 1.0},
            "t": {"shape": [4, 5], "domain": [0.0, 1.0]},
        },
        "scalars": {},
    },
    {
        "name": "found_8",
        "forward": "4*((1/(1 + (((x*y)*tanh(log(1 + exp((x*y))))))**2))**6 - (1/(1 + (((x*y)*tanh(log(1 + "
        "exp((x*y))))))**2))**3)",
        "tensors": {"x": {"shape": [4, 5]}, "y": {"shape": [4, 5]}},
        "scalars": {},
    },
    {
        "name": "found_9",
        "forward": "Piecewise((0.5*((Piecewise(((x + b), (x + b) > 0), (alpha*(exp((x + b)) - 1), True))) - t)**2, "
        "Abs((Piecewise(((x + b), (x + b) > 0), (alpha*(exp((x + b)) - 1), True))) - t) <= delta), "
        "(delta*(Abs((Piecewise(((x + b), (x + b) > 0), (alpha*(exp((x + b)) - 1), True))) - t) - "
        "0.5*delta), True))",
        "tensors": {"x": {"shape": [4, 5]}, "b": {"shape": [], "learnable": True, "init": 0.0}, "t": {"shape": [4, 5]}},
        "scalars": {"alpha": {"type": "float", "default": 1.0}, "delta": {"type": "float", "default": 1.0}},
    },
    {
        "name": "found_10",
        "forward": "Piecewise((0.5*(((x*y)**n) - t)**2, Abs(((x*y)**n) - t) <= delta), (delta*(Abs(((x*y)**n) - t) "
        "- 0.5*delta), True))",
        "tensors": {"x": {"shape": [4, 5]}, "y": {"shape": [4, 5]}, "t": {"shape": [4, 5]}},
        "scalars": {"n": {"type": "int", "default": 3}, "delta": {"type": "float", "default": 1.0}},
    },
    # Found by wider searches (other seeds, more examples) on 2026-11-23: 1/cosh under exp (inf/inf in its
    # derivative), a sigmoid of softplus, Huber of a softsign of (x - y)/c (Abs through re/im: v/sign(v)),
    # exp of a cube (gradcheck's finite differences at exp(27)).
    {
        "name": "found_11",
        "forward": "(1 - exp(-((log(cosh((alpha*x)))) - t)))**2",
        "tensors": {"x": {"shape": [4, 5]}, "t": {"shape": [4, 5]}},
        "scalars": {"alpha": {"type": "float", "default": 1.0}},
    },
    {
        "name": "found_12",
        "forward": "-(t*log(1/(1 + exp(-((log(1 + exp((w*(x - y))))))))) + (1 - t)*log(1 - 1/(1 + exp(-((log(1 + "
        "exp((w*(x - y))))))))))",
        "tensors": {
            "x": {"shape": [4, 5]},
            "y": {"shape": [4, 5]},
            "w": {"shape": [5], "learnable": True, "init": 1.0},
            "t": {"shape": [4, 5], "domain": [0.0, 1.0]},
        },
        "scalars": {},
    },
    {
        "name": "found_13",
        "forward": "Piecewise((0.5*((((x - y)/c)/(1 + Abs(((x - y)/c)))) - t)**2, Abs((((x - y)/c)/(1 + Abs(((x - "
        "y)/c)))) - t) <= delta), (delta*(Abs((((x - y)/c)/(1 + Abs(((x - y)/c)))) - t) - 0.5*delta), "
        "True))",
        "tensors": {"x": {"shape": [4, 5]}, "y": {"shape": [4, 5]}, "t": {"shape": [4, 5]}},
        "scalars": {"c": {"type": "float", "default": 0.5}, "delta": {"type": "float", "default": 1.0}},
    },
    {
        "name": "found_14",
        "forward": "exp(((alpha*x)**n)) - t*((alpha*x)**n)",
        "tensors": {"x": {"shape": [4, 5]}, "t": {"shape": [4, 5]}},
        "scalars": {"alpha": {"type": "float", "default": 1.0}, "n": {"type": "int", "default": 3}},
    },
    # Binary cross-entropy of a cube and of a power of Abs: the domain check evaluated the textbook formula
    # (cancelling at 15 digits) and moved y to [3, 6]; the reference as written overflows at ordinary inputs.
    {
        "name": "found_15",
        "forward": "-(t*log(1/(1 + exp(-((((x - y)/c)**n))))) + (1 - t)*log(1 - 1/(1 + exp(-((((x - y)/c)**n))))))",
        "tensors": {"x": {"shape": [4, 5]}, "y": {"shape": [4, 5]}, "t": {"shape": [4, 5], "domain": [0.0, 1.0]}},
        "scalars": {"c": {"type": "float", "default": 0.5}, "n": {"type": "int", "default": 3}},
    },
    {
        "name": "found_16",
        "forward": "-(t*log(1/(1 + exp(-((Abs(((x - y)/c))**p))))) + (1 - t)*log(1 - 1/(1 + exp(-((Abs(((x - "
        "y)/c))**p))))))",
        "tensors": {"x": {"shape": [4, 5]}, "y": {"shape": [4, 5]}, "t": {"shape": [4, 5], "domain": [0.0, 1.0]}},
        "scalars": {"c": {"type": "float", "default": 0.5}, "p": {"type": "float", "default": 1.5}},
    },
    # Found on 2026-11-23 (second session): a square root of a sum of squares with a scalar (z**2 overflows
    # at z = (x*y)**3 = 1e24; hypot does not); a Cauchy loss and a soft Lennard-Jones of cubes, whose float32
    # intermediates left float32's range at 1e4: log(1 + u**2) switches to 2*log|u| + log1p(u**-2) beyond
    # |u| = 1, and u = (w*(x - y))**3 is kept whole (sympy merged u * du/dx into 6*(w*(x - y))**5, inf at 2e8).
    {
        "name": "found_17",
        "forward": "sqrt(((x*y)**3 - t)**2 + eps**2)",
        "tensors": {"x": {"shape": [4, 5]}, "y": {"shape": [4, 5]}, "t": {"shape": [4, 5]}},
        "scalars": {"eps": {"type": "float", "default": 1e-3}},
    },
    {
        "name": "found_18",
        "forward": "log(1 + (((w*x + b)**3 - t)/c)**2)",
        "tensors": {
            "x": {"shape": [4, 5]},
            "w": {"shape": [5], "learnable": True, "init": 1.0},
            "b": {"shape": [], "learnable": True, "init": 0.0},
            "t": {"shape": [4, 5]},
        },
        "scalars": {"c": {"type": "float", "default": 0.5}},
    },
    {
        "name": "found_19",
        "forward": "4*((1/(1 + (((w*(x - y))**n))**2))**6 - (1/(1 + (((w*(x - y))**n))**2))**3)",
        "tensors": {
            "x": {"shape": [4, 5]},
            "y": {"shape": [4, 5]},
            "w": {"shape": [5], "learnable": True, "init": 1.0},
        },
        "scalars": {"n": {"type": "int", "default": 3}},
    },
    # Found on 2026-11-23 by a set of 30 formulas from science written outside this file: Planck's law (0/0 at
    # x = 0, inf/inf at 100), a Hill curve (x**2.5 of negative x: domain not restricted), a soft clip (log of a
    # quotient of softplus arguments), the hand-written stable softplus (sign(0) against Heaviside(0)), and
    # a Gompertz curve (passes at first order since xexpy products merge; second order at t = -1e4 not).
    {"name": "found_20", "forward": "x**3/(exp(x) - 1)", "tensors": {"x": {"shape": [4, 5]}}, "scalars": {}},
    {
        "name": "found_21",
        "forward": "x**h/(K**h + x**h)",
        "tensors": {"x": {"shape": [4, 5]}, "K": {"shape": [5], "learnable": True, "init": 1.0}},
        "scalars": {"h": {"type": "float", "default": 2.5}},
    },
    {
        "name": "found_22",
        "forward": "log((1 + exp(a*x))/(1 + exp(a*(x - 1))))/a",
        "tensors": {"x": {"shape": [4, 5]}},
        "scalars": {"a": {"type": "float", "default": 5.0}},
    },
    {
        "name": "found_23",
        "forward": "log(1 + exp(-Abs(x))) + Max(x, 0)",
        "tensors": {"x": {"shape": [4, 5]}},
        "scalars": {},
    },
    {
        "name": "found_24",
        "forward": "a*exp(-b*exp(-c*t))",
        "tensors": {
            "t": {"shape": [4, 5]},
            "a": {"shape": [5], "learnable": True, "init": 1.0},
            "b": {"shape": [5], "learnable": True, "init": 1.0},
            "c": {"shape": [5], "learnable": True, "init": 1.0},
        },
        "scalars": {},
    },
    # The inverse softplus: its generated test was red (log(expm1(x)) is inf at x = 100 in float32).
    {"name": "found_25", "forward": "log(exp(x) - 1)", "tensors": {"x": {"shape": [4, 5]}}, "scalars": {}},
    # The Langevin function: 0/0 - inf at x = 0, no correct digit in float32 at x = 1e-3 (0.375 for 0.333).
    {"name": "found_26", "forward": "1/tanh(x) - 1/x", "tensors": {"x": {"shape": [4, 5]}}, "scalars": {}},
    # ELU with a learnable alpha: a*exp(x) became xexpy(a, x), which the branch guard did not know grows,
    # so exp(1e4) stayed outside the where() and the second derivative was 0 * inf.
    {
        "name": "found_27",
        "forward": "Piecewise((x, x > 0), (a*(exp(x) - 1), True))",
        "tensors": {"x": {"shape": [4, 5]}, "a": {"shape": [5], "learnable": True, "init": 1.0}},
        "scalars": {},
    },
    # The derivative of sqrt(softplus(x)) is sigmoid(x)/(2*sqrt(softplus(x))): 0/0 at x = -1e4 (float64),
    # where both underflow; found by the float64 extreme-input test's differences once it had them.
    {
        "name": "found_28",
        "forward": "sqrt(log(1 + exp(x)))",
        "tensors": {"x": {"shape": [4, 5]}},
        "scalars": {},
    },
    # A sum inside an x*exp(y) (xexpy) was shared by the scaled-sums lowering into a definition that the
    # xexpy lowering never saw: "xexpy(...) has no torch translation" (found_0 too).
    {
        "name": "found_29",
        "forward": "(1 - exp(-((((x - y)/c)/(1 + exp(-((x - y)/c)))) - t)))**2",
        "tensors": {"x": {"shape": [4, 5]}, "y": {"shape": [4, 5]}, "t": {"shape": [4, 5], "domain": [0.0, 1.0]}},
        "scalars": {"c": {"type": "float", "default": 0.5}},
    },
]

__all__ = ["DEFAULT_TYPICAL", "FORMULAS", "FOUND", "TYPICAL"]
