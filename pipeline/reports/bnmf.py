"""What a Bayesian NMF run gives a user: held-out scores, topics, exports and plots.
Defines the ``bnmf`` model's ``ModelSpec`` (``pipeline.registry``)."""

from __future__ import annotations

from pathlib import Path

from buffet.pipeline.engine.dataset import Source
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.models.bnmf import BNMF, BNMFConfig
from buffet.pipeline.models.topics import TopicDriver, corpus_from_source
from buffet.pipeline.registry import ModelSpec
from buffet.pipeline.reports import topics
from buffet.pipeline.reports.outputs import Outputs


def make_driver(config: BNMFConfig, source: Source, engine: Engine) -> TopicDriver:
    corpus = corpus_from_source(source, config.split)
    return TopicDriver(BNMF.of(config, corpus.n_words), corpus, engine, "bnmf")


def export(driver: TopicDriver, run: RunStore) -> dict:
    return topics.export(driver)


def figures(driver: TopicDriver, run: RunStore, trace: list[dict], out_dir: Path) -> list[Path]:
    return topics.figures(driver, trace, out_dir)


def summary(driver: TopicDriver, run: RunStore, trace: list[dict]) -> list[str]:
    config = driver.config
    return topics.summary(driver, trace, f"topics: {config.n_topics}, mode: {config.mode}, "
                                         f"batch size: {config.batch_size}")


OUTPUTS = Outputs("Bayesian NMF", evaluate=topics.evaluate, export=export, figures=figures, summary=summary)

# The local step spends its time in NumPy calls that release the GIL, so threads sharing the shared
# topics beat worker processes that each receive a serialised copy (measured).
SPECS = {"bnmf": ModelSpec(config_cls=BNMFConfig, make_driver=make_driver, outputs=OUTPUTS, worker_kind="threads",
                           summary="Bayesian NMF (Poisson-gamma topic model) by batch VB or SVI, for count data "
                                   "such as bag-of-words corpora")}
