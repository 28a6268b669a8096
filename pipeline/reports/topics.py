"""What the two topic models' runs share in their outputs: held-out scores of every
held-out document, topics as word lists and shares of the tokens, and their figures and summary lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from buffet.kernels.bnmf import top_words, topic_mass, topic_tokens, topic_word
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.models.topics import TopicDriver
from buffet.pipeline.reports import plots

UNUSED_SHARE = 0.005  # a topic holding less of the tokens than this is reported as left at its prior


def token_shares(g: np.ndarray, c0: float) -> np.ndarray:
    """Each topic's share of the tokens the topics hold (``kernels.bnmf.topic_tokens``)."""
    tokens = np.maximum(topic_tokens(g, c0), 0.0)
    return tokens / tokens.sum()


def evaluate(driver: TopicDriver, run: RunStore) -> dict:
    """Held-out per-word log likelihood over every document of the stored split (paper 002, Sec. 11.6)."""
    config = driver.config
    return {"n_topics": config.n_topics, "mode": config.mode, "docs_seen": driver.state.docs_seen,
            "heldout_docs": int(len(driver.corpus.held_out)),
            "heldout_loglik_per_word": driver.heldout_loglik(every_document=True)
            if len(driver.corpus.held_out) else None}


def export(driver: TopicDriver) -> dict[str, np.ndarray]:
    """q(beta) (shapes ``g``, rates ``h``), topic-word probabilities, topic weights and tokens, the vocabulary."""
    g, h = driver.state.g, driver.state.h
    out = {"g": g, "h": h, "topic_word": topic_word(g, h), "topic_mass": topic_mass(g, h),
           "topic_tokens": topic_tokens(g, driver.model.hyper.c0)}
    if driver.corpus.vocab:
        out["vocab"] = np.asarray(driver.corpus.vocab)
    return out


def figures(driver: TopicDriver, trace: list[dict], out_dir: Path) -> list[Path]:
    """Held-out log likelihood against documents seen, and the topics with their top words."""
    g, h = driver.state.g, driver.state.h
    return [plots.metric_curve(trace, "docs_seen", "heldout_ll", "documents seen",
                               "held-out log likelihood per word", out_dir / "heldout_loglik.png"),
            plots.topic_summary(top_words(g, h, driver.corpus.vocab), token_shares(g, driver.model.hyper.c0),
                                out_dir / "topics.png")]


def summary(driver: TopicDriver, trace: list[dict], settings: str) -> list[str]:
    """The settings, the last scores, how many topics the data left at their prior, and every topic's top words
    by its share of the tokens."""
    g, h = driver.state.g, driver.state.h
    words, share = top_words(g, h, driver.corpus.vocab), token_shares(g, driver.model.hyper.c0)
    unused = int(np.sum(share < UNUSED_SHARE))
    names = {"heldout_ll": "heldout_ll", "elbo": "elbo", "log_posterior": "log posterior density"}
    lines = [f"- {settings}",
             *[f"- final {names[k]}: {trace[-1][k]:.6g}" for k in names if trace and k in trace[-1]],
             f"- topics holding under {UNUSED_SHARE:.1%} of the tokens (left at their prior): {unused} of {len(share)}",
             "", "## Topics (by share of the tokens)", ""]
    return lines + [f"{i + 1}. topic {k} ({share[k]:.1%}): {', '.join(words[k])}"
                    for i, k in enumerate(np.argsort(-share, kind="stable"))]
