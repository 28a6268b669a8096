"""Lost workers, and a cluster left without any, cost time and not results: the topic models, IMF/INMF and
VFMF/TVIMF (the scenario and its data: tests/worker_loss.py)."""

import pytest

from worker_loss import lost_workers_scenario


@pytest.mark.parametrize("model", ["bnmf", "cnmf", "imf", "inmf", "vfmf", "tvimf"])
def test_lost_workers_cost_time_not_results(tmp_path, loss_stores, hand_cluster, gate, model):
    lost_workers_scenario(tmp_path, loss_stores, hand_cluster, gate, model)
