"""buffet: Bayesian and nonparametric Bayesian matrix factorization on Dask.

    >>> import buffet
    >>> model = buffet.BayesianNMF(50, batch_size=1000).fit("corpus.zarr")
    >>> run = buffet.load_run("runs/nyt")             # a run of `buffet fit`, as its model's estimator

The estimators of ``buffet.pipeline.estimators`` and ``load_run``, and ``__version__`` (from the installed
package's metadata). They are imported when first used, so ``import buffet`` and the command line,
whose modules live under this package, do not load the models until asked.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version
from typing import Any

ESTIMATORS = "buffet.pipeline.estimators"
__all__ = ["BayesianNMF", "CorrelatedNMF", "IMF", "INMF", "BinaryMF", "LinearGaussianParticleFilter",
           "NoisyORParticleFilter", "LinearGaussianGibbs", "NoisyORGibbs", "NotFittedError", "InvalidParameterError",
           "load_run", "__version__"]


def __getattr__(name: str) -> Any:
    """An estimator (or ``load_run``, an error class) from ``buffet.pipeline.estimators``, or ``__version__``."""
    if name == "__version__":
        return version("buffet")
    if name in __all__:
        return getattr(importlib.import_module(ESTIMATORS), name)
    raise AttributeError(f"module 'buffet' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
