"""Python API: one estimator per model, in scikit-learn's conventions (docs/reference/python.md).

    >>> from buffet.pipeline.estimators import BayesianNMF, IMF, LinearGaussianParticleFilter
    >>> model = IMF(max_k=10).fit(X, mask=observed)          # NumPy, SciPy, dask arrays or a store path
    >>> model.predict(X_new, mask=observed_new)
    >>> model.save("imf-model.npz"); IMF.load("imf-model.npz")
    >>> BayesianNMF.from_run("runs/nyt"); load_run("runs/nyt")   # a run of ``buffet fit``

``base`` holds the common contract (parameters from each model's config dataclass, fit on the engine,
save/load, from_run, scikit-learn tags), ``inputs`` the accepted data, ``runs`` a run folder opened as
the estimator of its model. Importing this package imports neither scikit-learn nor matplotlib.
"""

from buffet.pipeline.estimators.base import InvalidParameterError, NotFittedError
from buffet.pipeline.estimators.bmf import BinaryMF
from buffet.pipeline.estimators.ibp import (LinearGaussianGibbs, LinearGaussianParticleFilter, NoisyORGibbs,
                                            NoisyORParticleFilter)
from buffet.pipeline.estimators.imf import IMF, INMF
from buffet.pipeline.estimators.runs import load_run
from buffet.pipeline.estimators.topics import BayesianNMF, CorrelatedNMF

__all__ = ["BayesianNMF", "CorrelatedNMF", "IMF", "INMF", "BinaryMF", "LinearGaussianParticleFilter",
           "NoisyORParticleFilter", "LinearGaussianGibbs", "NoisyORGibbs", "NotFittedError",
           "InvalidParameterError", "load_run"]
