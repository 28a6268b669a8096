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
from typing import Any, Callable

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

    def config(self, base: Any) -> Any:
        """``base`` with this candidate's settings."""
        return dataclasses.replace(base, **self.settings)


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
    """(metric, value) with larger better: AUC for binary data, minus the RMSE otherwise (SPEC 4)."""
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
    tasks of the cluster."""
    folds = validation_folds(config)
    kind = source.open().kind
    log.info("validation: %d candidates x %d folds, %d fits (%s)", len(candidates), len(folds),
             len(candidates) * len(folds), "in this process" if engine.kind == "process" else "as cluster tasks")
    jobs = [(candidate.config(config), make_driver, source, fold, kind) for candidate in candidates for fold in folds]
    results = engine.batch(fit_fold, jobs)
    scored = [candidate_record(candidate, results[i * len(folds):(i + 1) * len(folds)])
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


def fit_fold(config: Any, make_driver: DriverFactory, source: Source, fold: EntrySample,
             kind: str) -> tuple[str, float, int, int]:
    """One validation fit (a job of ``Engine.batch``): ``config`` fitted in this process without the entries
    of ``fold``; (metric, score of its predictions of them, K+, how many entries the fold holds)."""
    driver = make_driver(config, source, ProcessEngine(), validation=fold)
    driver.start()
    run_loop(driver, None, Position(), config.checkpoint_every, quiet=True)
    predicted, truth = driver.predictions()
    metric, value = validation_score(kind, predicted, truth)
    return metric, value, int(driver.k_plus), int(truth.size)


def candidate_record(candidate: Candidate, folds: list[tuple[str, float, int, int]]) -> dict:
    """What the run records of one candidate: its mean score, the score and K+ of every fold (``fit_fold``),
    and how many validation entries the folds hold."""
    scores = [value for _, value, _, _ in folds]
    return {"label": candidate.label, "metric": folds[0][0], "score": float(np.mean(scores)), "fold_scores": scores,
            "k_plus": [k for _, _, k, _ in folds], "entries": sum(n for _, _, _, n in folds),
            "settings": candidate.settings}
