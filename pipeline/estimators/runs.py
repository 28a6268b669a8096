"""A run folder of any model with an estimator opened as that estimator (``load_run``)."""

from __future__ import annotations

import os
from typing import Any

from buffet.data.errors import UserError
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.estimators.base import Estimator, engine_for


def estimator_classes() -> dict[str, type[Estimator]]:
    """Every estimator class by the name of its model (as ``buffet fit`` knows it)."""
    found: dict[str, type[Estimator]] = {}
    pending = list(Estimator.__subclasses__())
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        if "model_name" in cls.__dict__:
            found[cls.model_name] = cls
    return found


def load_run(path: str | os.PathLike, *, client=None, storage_options: dict[str, Any] | None = None) -> Estimator:
    """The run folder ``path`` (``buffet fit MODEL STORE --out PATH``) as the estimator of its model, fitted as
    the run's newest checkpoint left it (``Estimator.from_run``)."""
    run = RunStore(path, storage_options)
    classes = estimator_classes()
    if run.model not in classes:
        raise UserError(f"{run.path}: a {run.model} run has no Python estimator (estimators exist for "
                        f"{', '.join(sorted(classes))}); use `buffet export` for its arrays")
    return classes[run.model].restore(run, engine_for(client))
