"""Run-level operations shared by every model: fit into a run store, resume, and restore a run for its
outputs.

A run names its model; the model's ``ModelSpec`` (its config class, how to build its driver on an engine,
its candidates for a choice on validation entries) comes from ``pipeline.registry``, which imports the
model's own module only when it is looked up. The CLI and the Python API call only these functions.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from buffet.data.errors import UserError
from buffet.pipeline.engine.checkpoints import Saved
from buffet.pipeline.engine.dataset import Source, source_of
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.lease import Lease
from buffet.pipeline.engine.loop import run_loop
from buffet.pipeline.engine.position import Position
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.engine.selection import choose_on_validation, wants_validation
from buffet.pipeline.registry import ModelSpec, spec_for


def config_from(spec: ModelSpec, params: dict) -> Any:
    """A model config from stored or user parameters; unknown names are refused."""
    known = {f.name for f in fields(spec.config_cls)}
    unknown = set(params) - known
    if unknown:
        raise UserError(f"unknown parameter(s) {', '.join(sorted(unknown))}")
    return spec.config_cls(**params)


def settle_config(spec: ModelSpec, config: Any, source: Source, engine: Engine) -> tuple[Any, dict | None]:
    """The config a fit runs with: ``config``, or the candidate chosen on validation entries when the model
    has candidates and ``config.select`` asks for a choice (``engine.selection``); with the record of the
    choice (None when nothing was chosen)."""
    if spec.candidates is None or not wants_validation(config, source):
        return config, None
    return choose_on_validation(spec.candidates(config), spec.make_driver, config, source, engine)


def run_source(run: RunStore) -> Source:
    """The data of a run, as its workers read it."""
    return source_of(run.meta["dataset"], run.storage_options)


def fit_run(model: str, source: Source, out: str, config: Any, engine: Engine, overwrite: bool = False,
            stop_after: int | None = None, quiet: bool = False, force: bool = False) -> RunStore:
    """Fit ``model`` on the dataset ``source`` (a store) into a new run folder ``out``, holding the run's
    lease from before the folder is made or cleared until the fit ends; a run another live command holds is
    refused unless ``force`` (``engine.lease``)."""
    spec = spec_for(model)
    driver = spec.make_driver(config, source, engine)  # refuses data the model cannot take, before a run exists
    RunStore.check_new(out, overwrite)  # before a lease is written into a folder that is not a run
    with Lease(out).acquired(force) as lease:
        run = RunStore.create(out, model, source.url, asdict(config), overwrite=overwrite, lease=lease)
        return _fit(spec, run, config, engine, stop_after, quiet, driver, choose=True)


def _fit(spec: ModelSpec, run: RunStore, config: Any, engine: Engine, stop_after: int | None, quiet: bool,
         driver: Any = None, choose: bool = True) -> RunStore:
    """Fit from the start: first, if ``choose``, settle the config (recording a choice in the run)."""
    source = run_source(run)
    if choose:
        try:
            chosen, selection = settle_config(spec, config, source, engine)
        except BaseException:
            run.set_status("interrupted")
            raise
        if selection is not None:
            run.record_selection(selection, asdict(chosen))
            config, driver = chosen, None
    driver = driver or spec.make_driver(config, source, engine)
    driver.start()
    run_loop(driver, run, Position(), config.checkpoint_every, stop_after, quiet)
    return run


def resume_run(path: str, engine: Engine, quiet: bool = False, force: bool = False) -> RunStore:
    """Continue a run from its newest readable checkpoint; a finished run is left as it is, unless its final
    checkpoint is unreadable (then it continues from the one before). A run stopped before its first
    checkpoint starts again (choosing its settings again if it had not recorded the choice). The run's lease
    is held throughout; a run another live command holds is refused unless ``force`` (``engine.lease``)."""
    run = RunStore(path)
    with run.owned(force):
        return _resume(run, engine, quiet)


def _resume(run: RunStore, engine: Engine, quiet: bool) -> RunStore:
    """``resume_run`` once the run's lease is held."""
    saved = Saved(run, engine)
    if run.status == "finished" and run.final_checkpoint_readable(saved.verify):
        return run
    spec = spec_for(run.model)
    config = config_from(spec, run.params)
    run.set_status("running")
    if not run.has_checkpoint():
        return _fit(spec, run, config, engine, None, quiet, choose=run.selection is None)
    driver = spec.make_driver(config, run_source(run), engine)
    position = saved.restore(driver)
    run_loop(driver, run, position, config.checkpoint_every, None, quiet)
    return run


def restored(run: RunStore, engine: Engine, states: tuple[str, ...] = ()) -> tuple[Any, Position]:
    """A run's driver at its newest checkpoint, with only the named block ``states`` read back (what its
    outputs need), and where the run is."""
    spec = spec_for(run.model)
    driver = spec.make_driver(config_from(spec, run.params), run_source(run), engine)
    return driver, Saved(run, engine).restore(driver, states)
