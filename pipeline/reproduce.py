"""``buffet reproduce NAME``: the papers' experiments, one command each (SPEC 4).

An experiment is a function ``run(out_dir, seeds, quick) -> list[Path]`` that writes a table
and PNG figures into ``out_dir``, prints the paper's numbers beside the measured ones and
returns the files it wrote. Experiment modules register themselves in ``EXPERIMENTS`` and are
listed in ``EXPERIMENT_MODULES`` so they load on first lookup.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

from buffet.data.errors import UserError

Experiment = Callable[[Path, int, bool], list[Path]]
EXPERIMENTS: dict[str, Experiment] = {}
EXPERIMENT_MODULES: tuple[str, ...] = ("buffet.pipeline.reproduce_roles", "buffet.pipeline.reproduce_ibp", "buffet.pipeline.reproduce_cf", "buffet.pipeline.reproduce_particles")


def register(name: str, experiment: Experiment) -> None:
    EXPERIMENTS[name] = experiment


def experiments() -> dict[str, Experiment]:
    for module in EXPERIMENT_MODULES:
        importlib.import_module(module)
    return EXPERIMENTS


def run_experiment(name: str, out_dir: Path, seeds: int, quick: bool) -> list[Path]:
    available = experiments()
    if name not in available:
        raise UserError(f"unknown experiment {name!r}; available: {', '.join(sorted(available)) or 'none yet'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    return available[name](out_dir, seeds, quick)
