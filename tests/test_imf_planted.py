"""IMF and INMF find planted structure: on planted linear-Gaussian data with 5000 rows the
default search (growth candidates plus the ICA restart, ``models.imf``) ends at the true K+ with E[Z] agreeing
with the true Z on >= 99% of the entries after matching features. Two fixed draws per model here; the ten-draw
count is ``benchmarks/imf_planted_recovery.py`` (its figures: docs/performance.md, 'IMF and INMF at size')."""

import numpy as np
import pytest

from buffet.data.ibp_synthetic import planted_features
from buffet.kernels.metrics import z_agreement
from buffet.pipeline.engine.dataset import ArrayRows
from buffet.pipeline.models.imf import IMFConfig, INMFConfig, fit_to_end

N_ROWS, N_COLS, N_FEATURES = 5000, 30, 5


@pytest.mark.parametrize("draw", [1, 3])
@pytest.mark.parametrize("config_cls", [IMFConfig, INMFConfig])
def test_search_recovers_planted_features(config_cls, draw):
    """Bases N(0, 1) for IMF, |N(0, 1)| for INMF; row probabilities U(0.2, 0.4), noise sd 0.5. Tolerance 1e-5
    instead of the default 1e-6 keeps the test short (each K+ converges in fewer alternations)."""
    data = planted_features(np.random.default_rng(draw), N_ROWS, N_COLS, N_FEATURES,
                            nonnegative=config_cls is INMFConfig)
    config = config_cls(max_k=N_FEATURES + 1, tol=1e-5, chunk_rows=2000, split=None, select="none")
    driver = fit_to_end(config, ArrayRows(data.X))
    assert driver.k_plus == N_FEATURES
    assert z_agreement(data.Z, driver.expected_z()) >= 0.99

