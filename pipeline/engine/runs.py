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
from buffet.pipeline.engine.executors import Executor
from buffet.pipeline.engine.fitloop import run_loop
from buffet.pipeline.engine.runstore import RunStore


@dataclass(frozen=True)
class ModelSpec:
    """How the engine runs, evaluates, exports and reports one model. ``summary`` is the one line that
    ``buffet fit --help`` shows for it (what it is and what data it is for); ``worker_kind`` is the kind
    of embedded LocalCluster worker its block tasks run best on (``cluster.WORKER_KINDS``)."""

    config_cls: type
    make_driver: Callable[[Any, str, Executor], Any]
    evaluate: Callable[[RunStore, Executor], dict]
    export: Callable[[RunStore], dict[str, np.ndarray]]
    report: Callable[[RunStore, Path], list[Path]]
    summary: str
    worker_kind: str = "processes"


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


def fit_run(model: str, store: str, out: str, config: Any, executor: Executor, overwrite: bool = False,
            stop_after: int | None = None, quiet: bool = False) -> RunStore:
    """Fit ``model`` on the dataset ``store`` into a new run folder ``out``."""
    spec = spec_for(model)
    driver = spec.make_driver(config, str(Path(store).resolve()), executor)
    run = RunStore.create(out, model, str(Path(store).resolve()), asdict(config), overwrite=overwrite)
    driver.start()
    run_loop(driver, run, [], 0, config.checkpoint_every, stop_after, quiet)
    return run


def resume_run(path: str, executor: Executor, quiet: bool = False) -> RunStore:
    """Continue a run from its newest checkpoint; a finished run is left as it is."""
    run = RunStore(path)
    if run.status == "finished":
        return run
    spec = spec_for(run.model)
    config = config_from(spec, run.params)
    driver = spec.make_driver(config, run.meta["dataset"], executor)
    if run.has_checkpoint():
        arrays, state, folder = run.load_checkpoint()
        driver.restore(arrays, folder)
        trace, step = state["trace"], state["step"]
    else:
        driver.start()
        trace, step = [], 0
    run.set_status("running")
    run_loop(driver, run, trace, step, config.checkpoint_every, None, quiet)
    return run


def trace_arrays(trace: list[dict]) -> dict[str, np.ndarray]:
    """The trace as one array per recorded quantity (NaN where a step did not record it)."""
    keys = sorted({k for record in trace for k in record})
    return {f"trace_{k}": np.array([float(r.get(k, np.nan)) for r in trace]) for k in keys}
