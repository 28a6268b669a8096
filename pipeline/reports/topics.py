"""What the two topic models' runs share in their outputs: held-out scores of every
held-out document, topics as word lists and weights, and their figures and summary lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from buffet.kernels.bnmf import top_words, topic_mass, topic_word
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.models.topics import TopicDriver
from buffet.pipeline.reports import plots


def evaluate(driver: TopicDriver, run: RunStore) -> dict:
    """Held-out per-word log likelihood over every document of the stored split (paper 002, Sec. 11.6)."""
    config = driver.config
    return {"n_topics": config.n_topics, "mode": config.mode, "docs_seen": driver.state.docs_seen,
            "heldout_docs": int(len(driver.corpus.held_out)),
            "heldout_loglik_per_word": driver.heldout_loglik(every_document=True)
            if len(driver.corpus.held_out) else None}


def export(driver: TopicDriver) -> dict[str, np.ndarray]:
    """q(beta) (shapes ``g``, rates ``h``), topic-word probabilities, topic weights, the vocabulary."""
    g, h = driver.state.g, driver.state.h
    out = {"g": g, "h": h, "topic_word": topic_word(g, h), "topic_mass": topic_mass(g, h)}
    if driver.corpus.vocab:
        out["vocab"] = np.asarray(driver.corpus.vocab)
    return out


def figures(driver: TopicDriver, trace: list[dict], out_dir: Path) -> list[Path]:
    """Held-out log likelihood against documents seen, and the topics with their top words."""
    g, h = driver.state.g, driver.state.h
    return [plots.metric_curve(trace, "docs_seen", "heldout_ll", "documents seen",
                               "held-out log likelihood per word", out_dir / "heldout_loglik.png"),
            plots.topic_summary(top_words(g, h, driver.corpus.vocab), topic_mass(g, h), out_dir / "topics.png")]


def summary(driver: TopicDriver, trace: list[dict], settings: str) -> list[str]:
    """The settings, the last scores, and every topic's top words by weight."""
    g, h = driver.state.g, driver.state.h
    words, mass = top_words(g, h, driver.corpus.vocab), topic_mass(g, h)
    lines = [f"- {settings}",
             *[f"- final {k}: {trace[-1][k]:.6g}" for k in ("heldout_ll", "elbo") if trace and k in trace[-1]],
             "", "## Topics (by total weight)", ""]
    return lines + [f"{i + 1}. topic {k} ({mass[k]:.3g}): {', '.join(words[k])}"
                    for i, k in enumerate(np.argsort(-mass))]
