"""``buffet reproduce NAME``: the papers' experiments, one command each (SPEC 4).

An experiment is a function ``run(out_dir, seeds, quick) -> list[Path]`` that writes a table
and PNG figures into ``out_dir``, prints the paper's numbers beside the measured ones and
returns the files it wrote. Experiment modules register themselves in ``EXPERIMENTS`` and are
listed in ``EXPERIMENT_MODULES`` so they load on first lookup. An experiment may also take keyword
options (e.g. ``jester`` of collaborative-filtering, a user's own data file); it names them when it
registers, and an option given to an experiment that does not take it is a user error.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable, Mapping

from buffet.data.errors import UserError

Experiment = Callable[..., list[Path]]  # (out_dir, seeds, quick, **options) -> files written
EXPERIMENTS: dict[str, Experiment] = {}
OPTIONS: dict[str, tuple[str, ...]] = {}  # the keyword options each experiment takes
EXPERIMENT_MODULES: tuple[str, ...] = ("buffet.pipeline.experiments.role_mining", "buffet.pipeline.experiments.ibp_images", "buffet.pipeline.experiments.collaborative_filtering", "buffet.pipeline.experiments.particles", "buffet.pipeline.experiments.bmf")


def register(name: str, experiment: Experiment, options: tuple[str, ...] = ()) -> None:
    EXPERIMENTS[name] = experiment
    OPTIONS[name] = options


def experiments() -> dict[str, Experiment]:
    for module in EXPERIMENT_MODULES:
        importlib.import_module(module)
    return EXPERIMENTS


def run_experiment(name: str, out_dir: Path, seeds: int, quick: bool,
                   options: Mapping[str, object] | None = None) -> list[Path]:
    """Run experiment ``name``; ``options`` (those not None) must be ones the experiment registered."""
    available = experiments()
    if name not in available:
        raise UserError(f"unknown experiment {name!r}; available: {', '.join(sorted(available)) or 'none yet'}")
    given = {key: value for key, value in (options or {}).items() if value is not None}
    for key in given:
        if key not in OPTIONS[name]:
            raise UserError(f"--{key.replace('_', '-')} does not apply to the experiment {name!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    return available[name](out_dir, seeds, quick, **given)
