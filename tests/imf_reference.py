"""The in-memory reference of the IMF/INMF search for the tests: the engine's driver on an
in-process engine over a matrix held in memory as one block of rows (``models.imf.fit_to_end``)."""

from __future__ import annotations

import numpy as np

from buffet.pipeline.engine.dataset import ArrayRows
from buffet.pipeline.models.imf import IMFConfig, IMFDriver, fit_to_end

# The reference's settings unless a test says otherwise: alpha fixed at 1, a tight tolerance and room to
# converge at every K+.
REFERENCE = {"max_k": 10, "alpha": 1.0, "tol": 1e-7, "max_iter": 1000}


def reference_fit(x: np.ndarray, mask: np.ndarray | None = None, config_cls: type = IMFConfig,
                  start: np.ndarray | None = None, **settings) -> IMFDriver:
    """The driver fitted to the end on ``x`` (``mask``: the observed entries) from K+ = 0, or from the q(z)
    ``start``; ``settings`` are ``config_cls`` fields over ``REFERENCE``."""
    config = config_cls(**{**REFERENCE, **settings, "chunk_rows": x.shape[0], "split": None, "select": "none"})
    return fit_to_end(config, ArrayRows(x, mask), start=start)
