"""Structural settings chosen on validation entries.

A model whose ``ModelSpec`` lists ``candidates`` (IMF, INMF, BMF) can choose settings that the evidence
or the sampler does not choose well on its own (the cap on K+, offsets or not) by fitting every
candidate with a validation part of the TRAINING entries left out, scoring its predictions of those
entries (AUC for binary data, RMSE otherwise) and keeping the best. Held-out entries are never looked
at. The validation entries are an ``EntrySample`` of the training entries: about
``validation_fraction`` of them, drawn by a hash of the run's seed and the entry's position, so the
choice is the same with any chunking and any number of workers.

``select`` ("auto", "validation", "none") says when: "auto" chooses when the dataset has held-out
entries (a split of the store), "validation" always, "none" never. The record of a choice (metric,
every candidate's score and K+, the chosen one) is kept in the run (``runs.settle_config``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from buffet.data.splits import EntrySample
from buffet.kernels.metrics import auc
from buffet.pipeline.engine.dataset import Source
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.loop import Position, run_loop
from buffet.pipeline.engine.messages import logger
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.seeds import stream

log = logger("selection")


@dataclass(frozen=True)
class Candidate:
    """One setting to try: a readable label (e.g. "K+ <= 4, offsets") and the config fields it sets.
    A model lists its candidates in order of preference: the one it would fit without validation first."""

    label: str
    settings: dict
    cap: str | None = None  # the setting among ``settings`` that caps K+, where the search stops growing

    def config(self, base: Any) -> Any:
        """``base`` with this candidate's settings."""
        return dataclasses.replace(base, **self.settings)

    def same_but_cap(self, other: "Candidate") -> bool:
        """Whether ``other`` differs from this candidate in its cap on K+ alone."""
        rest = {k: v for k, v in self.settings.items() if k != self.cap}
        return self.cap is not None and other.cap == self.cap and \
            rest == {k: v for k, v in other.settings.items() if k != other.cap}


def wants_validation(config: Any, source: Source) -> bool:
    """Whether ``config.select`` asks for a choice on this dataset (module docstring)."""
    if config.select == "validation":
        return True
    if config.select == "none" or source.url is None:
        return False
    return bool(config.split) and config.split in source.open().split_names()


def validation_folds(config: Any) -> list[EntrySample]:
    """The validation folds of a run: ``validation_folds`` disjoint samples of ``validation_fraction`` of
    the entries each, keyed by the run's seed."""
    key = int(stream(config.seed, "validation").integers(2 ** 63))
    width = config.validation_fraction
    return [EntrySample(key, f * width, (f + 1) * width) for f in range(config.validation_folds)]


def validation_score(kind: str, predicted: np.ndarray, truth: np.ndarray) -> tuple[str, float]:
    """(metric, value) with larger better: AUC for binary data, minus the RMSE otherwise."""
    if kind == "binary":
        return "auc", auc(predicted, truth)
    return "neg_rmse", -float(np.sqrt(np.mean((predicted - truth) ** 2)))


DriverFactory = Callable[..., Any]  # (config, source, engine, validation=EntrySample) -> driver


def choose_on_validation(candidates: list[Candidate], make_driver: DriverFactory, config: Any, source: Source,
                         engine: Engine) -> tuple[Any, dict]:
    """Fit every candidate (listed in order of preference) once per validation fold without the fold's
    entries, score its predictions of them, and return the config of the candidate chosen by the
    one-standard-error rule on the mean scores (``one_standard_error_choice``), with the record of the
    choice. The fits are independent jobs of ``engine.batch``: side by side on this machine's cores, or as
    tasks of the cluster. A candidate that only lowers a cap on K+ is not fitted on its own: the fit under the
    highest cap (``widest_cap``) gives its result too (``fit_fold``)."""
    folds = validation_folds(config)
    kind = source.open().kind
    widest = [widest_cap(candidates, i) for i in range(len(candidates))]
    fitted = [i for i in range(len(candidates)) if widest[i] is None]
    lower = {i: [j for j in range(len(candidates)) if widest[j] == i] for i in fitted}
    log.info("validation: %d candidates x %d folds, %d fits side by side by the %s executor", len(candidates),
             len(folds), len(fitted) * len(folds), engine.kind)
    todo = [(i, f) for i in fitted for f in range(len(folds))]
    done = engine.batch(fit_fold, [(candidates[i].config(config), make_driver, source, folds[f], kind,
                                    [candidates[j].settings[candidates[j].cap] for j in lower[i]]) for i, f in todo])
    results: dict[tuple[int, int], FoldResult] = {}
    for (i, f), fold_results in zip(todo, done):
        for j, result in zip([i] + lower[i], fold_results):
            results[j, f] = result
    scored = [candidate_record(candidate, [results[i, f] for f in range(len(folds))])
              for i, candidate in enumerate(candidates)]
    for i, record in enumerate(scored):
        log.info("validation %d/%d: %s  %s=%.4f  K+=%s", i + 1, len(candidates), record["label"], record["metric"],
                 record["score"], record["k_plus"])
    chosen, tolerance = one_standard_error_choice(scored)
    record = {"metric": scored[0]["metric"], "validation_fraction": config.validation_fraction,
              "folds": len(folds), "entries": scored[0]["entries"], "tolerance": tolerance,
              "candidates": scored, "chosen": candidates[chosen].label}
    log.info("chosen on validation: %s", candidates[chosen].label)
    return candidates[chosen].config(config), record


def widest_cap(candidates: list[Candidate], i: int) -> int | None:
    """The candidate that differs from candidate ``i`` in its cap alone, with the highest cap, if that cap is
    higher than ``i``'s (else None)."""
    candidate = candidates[i]
    peers = [j for j, other in enumerate(candidates) if candidate.same_but_cap(other)]
    if not peers:
        return None
    j = max(peers, key=lambda j: candidates[j].settings[candidate.cap])
    return j if candidates[j].settings[candidate.cap] > candidate.settings[candidate.cap] else None


def one_standard_error_choice(scored: list[dict]) -> tuple[int, float]:
    """The first candidate (in preference order) whose mean score is within one standard error of the
    best mean, and that standard error (the spread of the best candidate's fold scores over sqrt(folds);
    0 with one fold). Candidates closer than that are not told apart by the validation entries, so the
    preferred one is kept instead of the one a lucky draw favours."""
    means = np.array([s["score"] for s in scored])
    best = int(np.nanargmax(means))
    folds = np.asarray(scored[best]["fold_scores"])
    tolerance = float(folds.std(ddof=1) / np.sqrt(folds.size)) if folds.size > 1 else 0.0
    return int(np.flatnonzero(means >= means[best] - tolerance)[0]), tolerance


@dataclass(frozen=True)
class FoldResult:
    """One validation fit (``fit_fold``): the metric, the score of its predictions of the fold's entries,
    K+, and how many entries the fold holds."""

    metric: str
    score: float
    k_plus: int
    entries: int


def fit_fold(config: Any, make_driver: DriverFactory, source: Source, fold: EntrySample, kind: str,
             lower_caps: Sequence[int] = ()) -> list[FoldResult]:
    """One validation fit (a job of ``Engine.batch``): ``config`` fitted in this process without the entries
    of ``fold``; its result, then the result of the same fit under each cap on K+ in ``lower_caps``, read
    off this one (``IMFDriver.watch_caps``): a cap the search never held gives this fit's result."""
    driver = make_driver(config, source, ProcessEngine(), validation=fold)
    if lower_caps:
        driver.watch_caps(lower_caps)
    driver.start()
    run_loop(driver, None, Position(), config.checkpoint_every, quiet=True)
    own = fold_result(kind, *driver.predictions(), int(driver.k_plus))
    return [own] + [fold_result(kind, *driver.fits_at_caps[cap]) if cap in driver.fits_at_caps else own
                    for cap in lower_caps]


def fold_result(kind: str, predicted: np.ndarray, truth: np.ndarray, k_plus: int) -> FoldResult:
    """The score of one fit's predictions of a fold's entries (``validation_score``)."""
    metric, value = validation_score(kind, predicted, truth)
    return FoldResult(metric, value, k_plus, int(truth.size))


def candidate_record(candidate: Candidate, folds: list[FoldResult]) -> dict:
    """What the run records of one candidate: its mean score, the score and K+ of every fold, and how many
    validation entries the folds hold."""
    scores = [fold.score for fold in folds]
    return {"label": candidate.label, "metric": folds[0].metric, "score": float(np.mean(scores)),
            "fold_scores": scores, "k_plus": [fold.k_plus for fold in folds],
            "entries": sum(fold.entries for fold in folds), "settings": candidate.settings}
