"""Lost workers, and a cluster left without any, cost time and not results: the particle filters, the Gibbs
samplers (linear-Gaussian and noisy-OR) and binary MF (the scenario and its data: tests/worker_loss.py)."""

import pytest

from worker_loss import lost_workers_scenario


@pytest.mark.parametrize("model", ["pf-linear-gaussian", "pf-noisy-or", "gibbs-linear-gaussian", "gibbs-noisy-or",
                                   "bmf"])
def test_lost_workers_cost_time_not_results(tmp_path, loss_stores, hand_cluster, gate, model):
    lost_workers_scenario(tmp_path, loss_stores, hand_cluster, gate, model)
