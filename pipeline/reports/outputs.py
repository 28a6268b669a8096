"""One evaluate / export / report skeleton for every model.

Each model supplies ``Outputs``: its metrics, its exported arrays, its figures and its summary lines,
each computed from its driver restored at the run's newest checkpoint (``engine.runs.restored``). The
skeleton adds what every run has: the run, its model and status, the steps and the seconds (cumulative
across resumes) of its trace, the settings chosen on validation if any, the trace as arrays
(``trace_step``, ``trace_seconds`` and the model's own keys), the dataset's row and column names in the export
when its store has them (``row_labels``, ``col_labels``: a table's or an h5ad file's names), a plot of the trace's model-specific
quantities against the step, and the summary's header.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.loop import Position
from buffet.pipeline.engine.runs import restored, run_source
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.registry import spec_for
from buffet.pipeline.reports import plots, selection

Metrics = Callable[[Any, RunStore], dict]                          # (driver, run) -> scores
Arrays = Callable[[Any, RunStore], dict[str, np.ndarray]]          # (driver, run) -> exported arrays
Figures = Callable[[Any, RunStore, list[dict], Path], list[Path]]  # (driver, run, trace, folder) -> PNGs
Lines = Callable[[Any, RunStore, list[dict]], list[str]]           # (driver, run, trace) -> markdown


@dataclass(frozen=True)
class Outputs:
    """What a model adds to the skeleton (module docstring). ``states`` names the per-block states its
    functions read (only those are read back from the checkpoint)."""

    title: str
    evaluate: Metrics
    export: Arrays
    figures: Figures
    summary: Lines
    states: tuple[str, ...] = ()


def _restore(run: RunStore, engine: Engine) -> tuple[Any, Position, Outputs]:
    outputs = spec_for(run.model).outputs
    driver, position = restored(run, engine, outputs.states)
    return driver, position, outputs


def evaluate_run(run: RunStore, engine: Engine) -> dict:
    """The run's common facts and the model's held-out metrics."""
    driver, position, outputs = _restore(run, engine)
    return {"model": run.model, "run": str(run.path), "status": run.status, "steps": position.step,
            "seconds": position.seconds, **selection.chosen(run), **outputs.evaluate(driver, run)}


def trace_arrays(trace: list[dict]) -> dict[str, np.ndarray]:
    """The trace as one array per recorded quantity (NaN where a step did not record it)."""
    keys = sorted({k for record in trace for k in record})
    return {f"trace_{k}": np.array([float(r.get(k, np.nan)) for r in trace]) for k in keys}


def data_names(run: RunStore) -> dict[str, np.ndarray]:
    """The row and column names of the run's dataset store (``row_labels``, ``col_labels``) that it holds."""
    source = run_source(run)
    if source.url is None:
        return {}
    store = source.open()
    return {name: np.asarray(names) for name in ("row_labels", "col_labels")
            if (names := store.strings(name)) is not None}


def export_run(run: RunStore, engine: Engine) -> dict[str, np.ndarray]:
    """The model's arrays, the dataset's names and the trace."""
    driver, position, outputs = _restore(run, engine)
    return {**outputs.export(driver, run), **data_names(run), **trace_arrays(position.trace)}


def report_run(run: RunStore, engine: Engine, out_dir: Path) -> list[Path]:
    """PNG figures (the trace's quantities against the step, then the model's) and summary.md."""
    driver, position, outputs = _restore(run, engine)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [plots.trace_panels(position.trace, out_dir / "trace.png"),
             *outputs.figures(driver, run, position.trace, out_dir)]
    lines = [f"# {outputs.title} run `{run.path}`", "", f"- status: {run.status}",
             f"- steps: {position.step}, seconds: {position.seconds:.1f}", "",
             *outputs.summary(driver, run, position.trace), *selection.summary_lines(run)]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    return files + [out_dir / "summary.md"]
