"""What a finished Bayesian NMF run gives a user: topics, held-out scores, exports and plots.

Registers the ``bnmf`` model with the run layer (``pipeline.runs``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from buffet.pipeline.reports import plots as plots
from buffet.pipeline.engine.blocks import resolve
from buffet.pipeline.models.bnmf import BNMFConfig, BNMFDriver, corpus_from_source
from buffet.pipeline.engine.executors import Executor
from buffet.pipeline.engine.runs import ModelSpec, config_from, register, trace_arrays
from buffet.pipeline.engine.runstore import RunStore


def make_driver(config: BNMFConfig, store: str, executor: Executor) -> BNMFDriver:
    return BNMFDriver(config, corpus_from_source(store, config.split), executor)


def topic_word(g: np.ndarray, h: np.ndarray) -> np.ndarray:
    """E[beta] normalised per topic: a K x V matrix of word probabilities."""
    mean = (g / h).T
    return mean / mean.sum(axis=1, keepdims=True)


def topic_mass(g: np.ndarray, h: np.ndarray) -> np.ndarray:
    """sum_v E beta_vk per topic, the scale each topic carries."""
    return (g / h).sum(axis=0)


def top_words(g: np.ndarray, h: np.ndarray, vocab: list[str] | None, n: int = 10) -> list[list[str]]:
    """The ``n`` most probable words of every topic (word ids when there is no vocabulary)."""
    order = np.argsort(-topic_word(g, h), axis=1)[:, :n]
    return [[vocab[v] if vocab else f"w{v}" for v in row] for row in order]


def _vocab(run: RunStore) -> list[str] | None:
    return resolve(run.meta["dataset"]).strings("vocab")


def evaluate(run: RunStore, executor: Executor) -> dict:
    """Held-out per-word log likelihood on all documents of the stored split (SPEC 4)."""
    return evaluate_topic_model(run, executor, "bnmf", spec)


def evaluate_topic_model(run: RunStore, executor: Executor, model: str, model_spec: ModelSpec) -> dict:
    """``evaluate`` for a topic model whose driver scores held-out documents (``heldout_loglik``)."""
    arrays, state, _ = run.load_checkpoint()
    config = config_from(model_spec, run.params)
    driver = model_spec.make_driver(replace(config, eval_docs=np.iinfo(np.int32).max), run.meta["dataset"], executor)
    driver.set_globals(arrays)
    trace = state["trace"]
    out = {"model": model, "run": str(run.path), "status": run.status, "steps": state["step"],
           "n_topics": config.n_topics, "mode": config.mode,
           "docs_seen": trace[-1]["docs_seen"] if trace else 0,
           "heldout_docs": int(len(driver.corpus.held_out)),
           "heldout_loglik_per_word": driver.heldout_loglik() if len(driver.corpus.held_out) else None}
    if config.mode == "batch" and trace:
        out["elbo"] = trace[-1]["elbo"]
    return out


def export(run: RunStore) -> dict[str, np.ndarray]:
    arrays, state, _ = run.load_checkpoint()
    out = {"g": arrays["g"], "h": arrays["h"], "topic_word": topic_word(arrays["g"], arrays["h"]),
           "topic_mass": topic_mass(arrays["g"], arrays["h"]), **trace_arrays(state["trace"])}
    vocab = _vocab(run)
    if vocab:
        out["vocab"] = np.asarray(vocab)
    return out


def report(run: RunStore, out_dir: Path) -> list[Path]:
    """PNG plots (held-out LL vs documents seen, objective trace, topic summary) and summary.md."""
    arrays, state, _ = run.load_checkpoint()
    trace, config = state["trace"], config_from(spec, run.params)
    g, h = arrays["g"], arrays["h"]
    words = top_words(g, h, _vocab(run))
    mass = topic_mass(g, h)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [plots.metric_curve(trace, "docs_seen", "heldout_ll", "documents seen",
                                "held-out log likelihood per word", out_dir / "heldout_loglik.png")]
    if config.mode == "batch":
        files.append(plots.metric_curve(trace, "step", "elbo", "iteration", "ELBO", out_dir / "objective.png"))
    else:
        files.append(plots.metric_curve(trace, "step", "mean_sweeps", "minibatch",
                                        "mean local sweeps per document", out_dir / "local_sweeps.png"))
    files.append(plots.topic_summary(words, mass, out_dir / "topics.png"))
    order = np.argsort(-mass)
    lines = [f"# Bayesian NMF run `{run.path}`", "", f"- status: {run.status}, steps: {state['step']}",
             f"- topics: {config.n_topics}, mode: {config.mode}, batch size: {config.batch_size}",
             *[f"- final {k}: {trace[-1][k]:.6g}" for k in ("heldout_ll", "elbo") if trace and k in trace[-1]],
             "", "## Topics (by total weight)", ""]
    lines += [f"{i + 1}. ({mass[k]:.3g}) {', '.join(words[k])}" for i, k in enumerate(order)]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    return files + [out_dir / "summary.md"]


# The local step spends its time in NumPy calls that release the GIL, so threads sharing the broadcast
# topics beat worker processes that each receive a serialised copy (benchmarks/README.md section 13).
spec = ModelSpec(config_cls=BNMFConfig, make_driver=make_driver, evaluate=evaluate, export=export, report=report,
                 summary="Bayesian NMF (Poisson-gamma topic model) by batch VB or SVI, for count data such as "
                         "bag-of-words corpora",
                 worker_kind="threads")
register("bnmf", spec)
