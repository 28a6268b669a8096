"""Every model ``buffet fit`` knows and every experiment ``buffet reproduce`` runs, by name: the one place a
new model or experiment is added.

``MODELS`` maps a model's name to the module that defines its ``ModelSpec`` (in that module's ``SPECS``
dict), ``EXPERIMENTS`` an experiment's name to the function that runs it. Nothing is imported until a name
is looked up, and then only the module that name needs: ``buffet fit bnmf`` loads Bayesian NMF's kernels
and driver and no other model's. Importing a model or experiment module registers nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from buffet.data.errors import UserError
from buffet.pipeline.engine.executor_choice import PROCESS_ENTRIES

if TYPE_CHECKING:
    from buffet.pipeline.engine.selection import Candidate

MODELS: dict[str, str] = {
    "bnmf": "buffet.pipeline.reports.bnmf",
    "cnmf": "buffet.pipeline.reports.cnmf",
    "imf": "buffet.pipeline.reports.imf",
    "inmf": "buffet.pipeline.reports.imf",
    "vfmf": "buffet.pipeline.reports.vfmf",
    "tvimf": "buffet.pipeline.reports.vfmf",
    "bmf": "buffet.pipeline.reports.bmf",
    "pf-linear-gaussian": "buffet.pipeline.reports.ibp",
    "pf-noisy-or": "buffet.pipeline.reports.ibp",
    "gibbs-linear-gaussian": "buffet.pipeline.reports.ibp",
    "gibbs-noisy-or": "buffet.pipeline.reports.ibp",
}


@dataclass(frozen=True)
class ModelSpec:
    """How the engine runs one model and what its runs give a user. ``make_driver(config, source, engine)``
    builds the driver (with ``validation=`` too when the model has ``candidates``, the settings it can
    choose on validation entries, ``engine.selection``); ``outputs`` is its ``reports.outputs.Outputs``;
    ``summary`` the one line ``buffet fit --help`` shows; ``worker_kind`` the kind of embedded LocalCluster
    worker its block tasks run best on (``cluster.WORKER_KINDS``); ``process_entries`` the stored entries up to
    which its fits run in this process (``engine.executor_choice``)."""

    config_cls: type
    make_driver: Callable[..., Any]
    outputs: Any
    summary: str
    worker_kind: str = "processes"
    process_entries: int = PROCESS_ENTRIES
    candidates: Callable[[Any], list[Candidate]] | None = None


def spec_for(name: str) -> ModelSpec:
    """The ``ModelSpec`` of model ``name``, importing only the module that defines it."""
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; available: {', '.join(sorted(MODELS))}")
    return importlib.import_module(MODELS[name]).SPECS[name]


def models() -> dict[str, ModelSpec]:
    """Every model's ``ModelSpec`` by name (imports every model module)."""
    return {name: spec_for(name) for name in MODELS}


Experiment = Callable[..., list[Path]]  # (out_dir, seeds, quick, **options) -> files written


@dataclass(frozen=True)
class ExperimentEntry:
    """Where an experiment lives: the function ``module.function(out_dir, seeds, quick, **options)``, which
    writes a table and PNG figures into ``out_dir``, prints the paper's numbers beside the measured ones and
    returns the files it wrote; ``options`` are the keyword options it takes (e.g. a user's own data file);
    ``seeds`` is how many repeats it averages unless told otherwise."""

    module: str
    function: str
    options: tuple[str, ...] = ()
    seeds: int = 10

    def load(self) -> Experiment:
        return getattr(importlib.import_module(self.module), self.function)


EXPERIMENTS: dict[str, ExperimentEntry] = {
    "role-mining": ExperimentEntry("buffet.pipeline.experiments.role_mining", "run"),
    "ibp-evidence": ExperimentEntry("buffet.pipeline.experiments.ibp_images", "run"),
    "collaborative-filtering": ExperimentEntry("buffet.pipeline.experiments.collaborative_filtering", "run",
                                               options=("jester",)),
    "pf-images": ExperimentEntry("buffet.pipeline.experiments.particles", "pf_images", options=("proposal",)),
    "pf-noisy-or": ExperimentEntry("buffet.pipeline.experiments.particles", "pf_noisy_or"),
    "ibp-speed": ExperimentEntry("buffet.pipeline.experiments.particles", "ibp_speed"),
    "bmf-bars": ExperimentEntry("buffet.pipeline.experiments.bmf", "run_bars"),
    "bmf-digits": ExperimentEntry("buffet.pipeline.experiments.bmf", "run_digits"),
    "bmf-genes": ExperimentEntry("buffet.pipeline.experiments.bmf_genes", "run", seeds=3),  # 3 splits in 10 min
}


def run_experiment(name: str, out_dir: Path, seeds: int | None, quick: bool,
                   options: Mapping[str, object] | None = None) -> list[Path]:
    """Run experiment ``name`` on ``seeds`` repeats (None: its own number, ``ExperimentEntry.seeds``);
    ``options`` (those not None) must be ones the experiment takes."""
    if name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {name!r}; available: {', '.join(sorted(EXPERIMENTS))}")
    entry = EXPERIMENTS[name]
    given = {key: value for key, value in (options or {}).items() if value is not None}
    for key in given:
        if key not in entry.options:
            raise UserError(f"--{key.replace('_', '-')} does not apply to the experiment {name!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    return entry.load()(out_dir, entry.seeds if seeds is None else seeds, quick, **given)
