"""What a finished correlated NMF run gives a user: topics, their correlations, document locations,
held-out scores, exports and plots (SPEC 3.6, 4).

Registers the ``cnmf`` model with the run layer (``pipeline.runs``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from buffet.kernels import bnmf, cnmf
from buffet.pipeline.reports import plots as plots
from buffet.pipeline.reports.bnmf import _vocab, evaluate_topic_model, top_words, topic_mass, topic_word
from buffet.pipeline.models.cnmf import CNMFConfig, CNMFDriver, make_corpus
from buffet.pipeline.engine.executors import Executor, SyncExecutor
from buffet.pipeline.engine.runs import ModelSpec, config_from, register, trace_arrays
from buffet.pipeline.engine.runstore import RunStore


def make_driver(config: CNMFConfig, store: str, executor: Executor) -> CNMFDriver:
    return CNMFDriver(config, make_corpus(store, config), executor)


def evaluate(run: RunStore, executor: Executor) -> dict:
    """Held-out per-word log likelihood on all documents of the stored split (SPEC 4)."""
    return evaluate_topic_model(run, executor, "cnmf", spec)


def transform(run: RunStore, X: sp.spmatrix) -> np.ndarray:
    """u_d of the documents (rows of the count matrix ``X``, over the run's vocabulary) with the run's
    fitted globals fixed: the local step of SPEC 3.6 (what ``export`` gives as ``u`` for the dataset)."""
    arrays, _, _ = run.load_checkpoint()
    config = config_from(spec, run.params)
    X = sp.csr_matrix(X, dtype=np.float64)
    view = bnmf.TopicView.from_params(arrays["g"], arrays["h"])
    return cnmf.local_step(X.indptr, X.indices, X.data, view, arrays["L"], config.local_settings(),
                           with_stats=False).u


def correlated_pairs(corr: np.ndarray, n: int = 10) -> list[tuple[int, int, float]]:
    """The ``n`` topic pairs (i < j) with the largest |corr(i, j)|, strongest first."""
    i, j = np.triu_indices(len(corr), k=1)
    order = np.argsort(-np.abs(corr[i, j]), kind="stable")[:n]
    return [(int(i[o]), int(j[o]), float(corr[i[o], j[o]])) for o in order]


def export(run: RunStore) -> dict[str, np.ndarray]:
    """q(beta), topic words and mass, L and the topic correlations, and u_d of every document of the
    dataset computed with the fitted globals (rows in dataset order, for nearest-neighbour retrieval)."""
    arrays, state, _ = run.load_checkpoint()
    driver = make_driver(config_from(spec, run.params), run.meta["dataset"], SyncExecutor())
    driver.set_globals(arrays)
    g, h, L = arrays["g"], arrays["h"], arrays["L"]
    out = {"g": g, "h": h, "topic_word": topic_word(g, h), "topic_mass": topic_mass(g, h), "L": L,
           "correlation": cnmf.correlation(L), "u": driver.locations(), **trace_arrays(state["trace"])}
    vocab = _vocab(run)
    if vocab:
        out["vocab"] = np.asarray(vocab)
    return out


def report(run: RunStore, out_dir: Path) -> list[Path]:
    """PNG plots (held-out LL vs documents seen, objective or Newton steps, topic correlation heat map,
    top words) and summary.md with the topics and the most correlated pairs."""
    arrays, state, _ = run.load_checkpoint()
    trace, config = state["trace"], config_from(spec, run.params)
    g, h, corr = arrays["g"], arrays["h"], cnmf.correlation(arrays["L"])
    words, mass = top_words(g, h, _vocab(run)), topic_mass(g, h)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [plots.metric_curve(trace, "docs_seen", "heldout_ll", "documents seen",
                                "held-out log likelihood per word", out_dir / "heldout_loglik.png")]
    if config.mode == "batch":
        files.append(plots.metric_curve(trace, "step", "elbo", "iteration", "objective F", out_dir / "objective.png"))
    else:
        files.append(plots.metric_curve(trace, "step", "mean_newton_steps", "minibatch",
                                        "mean local Newton steps per document", out_dir / "local_steps.png"))
    files += [plots.correlation_map(corr, out_dir / "correlation.png"),
              plots.topic_summary(words, mass, out_dir / "topics.png")]
    lines = [f"# Correlated NMF run `{run.path}`", "", f"- status: {run.status}, steps: {state['step']}",
             f"- topics: {config.n_topics}, latent dimensions: {config.n_dims}, mode: {config.mode}, "
             f"batch size: {config.batch_size}",
             *[f"- final {k}: {trace[-1][k]:.6g}" for k in ("heldout_ll", "elbo") if trace and k in trace[-1]],
             "", "## Topics (by total weight)", ""]
    lines += [f"{i + 1}. topic {k} ({mass[k]:.3g}): {', '.join(words[k])}" for i, k in enumerate(np.argsort(-mass))]
    lines += ["", "## Most correlated topic pairs", ""]
    lines += [f"- topics {i} and {j}: {c:+.3f}" for i, j, c in correlated_pairs(corr)]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    return files + [out_dir / "summary.md"]


# Like Bayesian NMF's, the local step is NumPy calls that release the GIL: threads share the broadcast globals.
spec = ModelSpec(config_cls=CNMFConfig, make_driver=make_driver, evaluate=evaluate, export=export, report=report,
                 summary="correlated NMF: Bayesian NMF with topic and document locations in a latent space, for "
                         "count data when topic correlations or similar documents matter",
                 worker_kind="threads")
register("cnmf", spec)
