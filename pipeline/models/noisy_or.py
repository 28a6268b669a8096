"""The noisy-OR model's settings, shared by its particle filter (``models.particles``) and its Gibbs
sampler (``models.gibbs``): the help of p, lambda and epsilon (paper 001 eq. 8) and their check."""

from __future__ import annotations

from buffet.data.errors import UserError
from buffet.kernels.pf_noisy_or import NoisyORParams

NOISY_OR_HELP = {
    "p": "Prior probability p that a feature is linked to a column, y_kd = 1, in (0, 1). Raise it if features "
         "should switch on many columns each.",
    "lam": "Probability lambda that one active, linked feature turns an entry on, in (0, 1). Lower it for noisier "
           "data in which features often fail to show.",
    "eps": "Leak probability epsilon that an entry is on with no active feature, in (0, 1). Raise it for data "
           "with many spurious ones.",
}


def noisy_or_params(config: object) -> NoisyORParams:
    """The kernels' parameters of a noisy-OR config, refused (naming the setting) outside (0, 1)."""
    params = NoisyORParams(config.p, config.lam, config.eps)
    problem = params.out_of_range()
    if problem:
        raise UserError(problem)
    return params
