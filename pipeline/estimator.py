"""Former home of ``BayesianNMF``; the estimators now live in ``buffet.pipeline.estimators``."""

from buffet.pipeline.estimators import BayesianNMF

__all__ = ["BayesianNMF"]
