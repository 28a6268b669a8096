"""What a correlated NMF run gives a user: held-out scores, topics, their correlations,
document locations, exports and plots. Defines the ``cnmf`` model's ``ModelSpec`` (``pipeline.registry``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from buffet.kernels import cnmf
from buffet.pipeline.engine.dataset import Source
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.models.cnmf import CNMF, CNMFConfig
from buffet.pipeline.models.topics import TopicDriver, corpus_from_source
from buffet.pipeline.registry import ModelSpec
from buffet.pipeline.reports import plots, topics
from buffet.pipeline.reports.outputs import Outputs


def make_driver(config: CNMFConfig, source: Source, engine: Engine) -> TopicDriver:
    corpus = corpus_from_source(source, config.split, "correlated NMF")
    return TopicDriver(CNMF.of(config, corpus.n_words), corpus, engine, "cnmf")


def correlated_pairs(corr: np.ndarray, n: int = 10) -> list[tuple[int, int, float]]:
    """The ``n`` topic pairs (i < j) with the largest |corr(i, j)|, strongest first."""
    i, j = np.triu_indices(len(corr), k=1)
    order = np.argsort(-np.abs(corr[i, j]), kind="stable")[:n]
    return [(int(i[o]), int(j[o]), float(corr[i[o], j[o]])) for o in order]


def export(driver: TopicDriver, run: RunStore) -> dict[str, np.ndarray]:
    """Bayesian NMF's arrays, L and the topic correlations, and u_d of every document of the dataset
    with the fitted globals (rows in dataset order, for nearest-neighbour retrieval)."""
    L = driver.state.L
    return {**topics.export(driver), "L": L, "correlation": cnmf.correlation(L),
            "u": driver.model.locations(driver.engine, driver.corpus, driver.state)}


def figures(driver: TopicDriver, run: RunStore, trace: list[dict], out_dir: Path) -> list[Path]:
    return topics.figures(driver, trace, out_dir) + [
        plots.correlation_map(cnmf.correlation(driver.state.L), out_dir / "correlation.png")]


def summary(driver: TopicDriver, run: RunStore, trace: list[dict]) -> list[str]:
    config = driver.config
    lines = topics.summary(driver, trace, f"topics: {config.n_topics}, latent dimensions: {config.n_dims}, "
                                          f"mode: {config.mode}, batch size: {config.batch_size}")
    pairs = correlated_pairs(cnmf.correlation(driver.state.L))
    return lines + ["", "## Most correlated topic pairs", ""] + [f"- topics {i} and {j}: {c:+.3f}" for i, j, c in pairs]


OUTPUTS = Outputs("Correlated NMF", evaluate=topics.evaluate, export=export, figures=figures, summary=summary)

# Worker processes: the local step's many small NumPy calls hold the GIL, so a second thread worker adds only
# about 1.24x (docs/performance.md, "Correlated NMF against Bayesian NMF").
SPECS = {"cnmf": ModelSpec(config_cls=CNMFConfig, make_driver=make_driver, outputs=OUTPUTS, worker_kind="processes",
                           summary="correlated NMF: Bayesian NMF with topic and document locations in a latent "
                                   "space, for count data when topic correlations or similar documents matter")}
