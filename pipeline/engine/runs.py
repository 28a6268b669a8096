"""Run-level operations shared by every model: fit into a run store, resume, evaluate, export.

Each model registers a ``ModelSpec`` that says how to build its driver from a config and a
dataset, and how to evaluate, export and report a finished run. The CLI and the Python API
call only these functions, so a new model plugs in by adding one ``ModelSpec``.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np

from buffet.data.errors import UserError
from buffet.data.urls import normalise
from buffet.pipeline.engine.executors import Executor
from buffet.pipeline.engine.fitloop import run_loop
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.engine.selection import Candidate, choose_on_validation, wants_validation


@dataclass(frozen=True)
class ModelSpec:
    """How the engine runs, evaluates, exports and reports one model. ``summary`` is the one line that
    ``buffet fit --help`` shows for it (what it is and what data it is for); ``worker_kind`` is the kind
    of embedded LocalCluster worker its block tasks run best on (``cluster.WORKER_KINDS``); a model with
    ``candidates`` chooses those settings on validation entries (``engine.selection``)."""

    config_cls: type
    make_driver: Callable[..., Any]  # (config, store, executor) -> driver; with candidates also validation=
    evaluate: Callable[[RunStore, Executor], dict]
    export: Callable[[RunStore], dict[str, np.ndarray]]
    report: Callable[[RunStore, Path], list[Path]]
    summary: str
    worker_kind: str = "processes"
    candidates: Callable[[Any], list[Candidate]] | None = None  # settings to choose on validation (selection)


MODELS: dict[str, ModelSpec] = {}
MODEL_MODULES = ("buffet.pipeline.reports.bnmf", "buffet.pipeline.reports.cnmf", "buffet.pipeline.reports.imf",
                 "buffet.pipeline.reports.ibp", "buffet.pipeline.reports.bmf")


def register(name: str, spec: ModelSpec) -> None:
    MODELS[name] = spec


def models() -> dict[str, ModelSpec]:
    """Every registered model; the modules that register them are imported on first use."""
    for module in MODEL_MODULES:
        importlib.import_module(module)
    return MODELS


def spec_for(name: str) -> ModelSpec:
    if name not in models():
        raise UserError(f"unknown model {name!r}; available: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def config_from(spec: ModelSpec, params: dict) -> Any:
    """A model config from stored or user parameters; unknown names are refused."""
    known = {f.name for f in fields(spec.config_cls)}
    unknown = set(params) - known
    if unknown:
        raise UserError(f"unknown parameter(s) {', '.join(sorted(unknown))}")
    return spec.config_cls(**params)


def settle_config(spec: ModelSpec, config: Any, source: Any, executor: Executor) -> tuple[Any, dict | None]:
    """The config a fit runs with: ``config``, or the candidate chosen on validation entries when the model
    has candidates and ``config.select`` asks for a choice (``engine.selection``); with the record of the
    choice (None when nothing was chosen)."""
    if spec.candidates is None or not wants_validation(config, source):
        return config, None
    return choose_on_validation(spec.candidates(config), spec.make_driver, config, source, executor)


def fit_run(model: str, store: str, out: str, config: Any, executor: Executor, overwrite: bool = False,
            stop_after: int | None = None, quiet: bool = False) -> RunStore:
    """Fit ``model`` on the dataset ``store`` into a new run folder ``out``."""
    spec = spec_for(model)
    dataset = normalise(store)
    driver = spec.make_driver(config, dataset, executor)  # refuses data the model cannot take, before a run exists
    run = RunStore.create(out, model, dataset, asdict(config), overwrite=overwrite)
    return _fit(spec, run, config, executor, stop_after, quiet, driver, choose=True)


def _fit(spec: ModelSpec, run: RunStore, config: Any, executor: Executor, stop_after: int | None, quiet: bool,
         driver: Any = None, choose: bool = True) -> RunStore:
    """Fit from the start: first, if ``choose``, settle the config (recording a choice in the run)."""
    if choose:
        try:
            chosen, selection = settle_config(spec, config, run.meta["dataset"], executor)
        except BaseException:
            run.set_status("interrupted")
            raise
        if selection is not None:
            run.record_selection(selection, asdict(chosen))
            config, driver = chosen, None
    driver = driver or spec.make_driver(config, run.meta["dataset"], executor)
    driver.start()
    run_loop(driver, run, [], 0, config.checkpoint_every, stop_after, quiet)
    return run


def resume_run(path: str, executor: Executor, quiet: bool = False) -> RunStore:
    """Continue a run from its newest readable checkpoint; a finished run is left as it is, unless its final
    checkpoint is unreadable (then it continues from the one before). A run stopped before its first
    checkpoint starts again (choosing its settings again if it had not recorded the choice)."""
    run = RunStore(path)
    if run.status == "finished" and run.final_checkpoint_readable():
        return run
    spec = spec_for(run.model)
    config = config_from(spec, run.params)
    run.set_status("running")
    if not run.has_checkpoint():
        return _fit(spec, run, config, executor, None, quiet, choose=run.selection is None)
    driver = spec.make_driver(config, run.meta["dataset"], executor)
    arrays, state, folder = run.load_checkpoint()
    driver.restore(arrays, folder)
    run_loop(driver, run, state["trace"], state["step"], config.checkpoint_every, None, quiet)
    return run


def trace_arrays(trace: list[dict]) -> dict[str, np.ndarray]:
    """The trace as one array per recorded quantity (NaN where a step did not record it)."""
    keys = sorted({k for record in trace for k in record})
    return {f"trace_{k}": np.array([float(r.get(k, np.nan)) for r in trace]) for k in keys}
