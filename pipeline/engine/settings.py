"""Model settings shared by every config: declaring a documented field, and checks of values
(a bad value is a UserError naming it)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from buffet.data.errors import UserError

T = TypeVar("T")


def option(default: T, help: str, **extra: Any) -> T:
    """A config field with ``default`` and its ``help`` sentence (what it does, its unit or range, when
    to change it): the one source of ``buffet fit MODEL --help``. ``extra`` goes to ``dataclasses.field``.
    Typed as its default, like ``dataclasses.field``; at run time it is a ``dataclasses.Field``."""
    return dataclasses.field(default=default, metadata={"help": help}, **extra)


def inherited_option(parent: type, name: str, default: T) -> T:
    """Field ``name`` of config class ``parent`` with another default for a subclass, same help."""
    return option(default, parent.__dataclass_fields__[name].metadata["help"])


def checkpoint_option(default: int, unit: str) -> int:
    """The ``checkpoint_every`` field of a model whose engine steps are ``unit`` (steps, rows, sweeps)."""
    return option(default, f"Save a checkpoint every this many {unit} (>= 1); `buffet resume` continues from the "
                           "latest. Smaller loses less work to a crash but writes more often.")


def split_option(unit: str) -> str | None:
    """The ``split`` field of a model that holds out the ``unit`` (documents, entries) of a stored split."""
    return option("heldout", f"Name of the dataset's split whose {unit} are held out of training and scored "
                             f"(`buffet ingest --holdout` writes 'heldout'); '' or a name the dataset lacks "
                             f"trains on all {unit}.")


def option_help(owner: type, f: dataclasses.Field) -> str:
    """The help sentence of field ``f`` of config class ``owner``; a field declared without one (not
    with ``option``) is a programming error, raised when the command line is built."""
    text = str(f.metadata.get("help", "")).strip()
    if not text:
        raise TypeError(f"{owner.__name__}.{f.name} has no help text; declare it with settings.option(default, help)")
    return text


def require_counts(config: object, names: tuple[str, ...]) -> None:
    """Settings ``names`` of ``config`` must be whole numbers >= 1 (sizes, counts, periods)."""
    for name in names:
        if getattr(config, name) < 1:
            raise UserError(f"{name} must be >= 1, got {getattr(config, name)}")


def require_positive(config: object, names: tuple[str, ...]) -> None:
    """Settings ``names`` of ``config`` must be > 0; None (meaning "learn it" or "off") passes."""
    for name in names:
        value = getattr(config, name)
        if value is not None and not value > 0:
            raise UserError(f"{name} must be > 0, got {value}")


SELECT_MODES = ("auto", "validation", "none")


@dataclasses.dataclass
class SelectionSettings:
    """The fields of a model whose structural settings can be chosen on validation entries
    (``engine.selection``); its config subclasses this and lists the candidates in its
    ``ModelSpec``."""

    select: str = option("auto", "When to choose the model's structural settings (the cap on K+, offsets or not; "
                                 "BMF: IBP or finite priors) on validation entries taken from the training "
                                 "entries: 'auto' when the dataset has held-out entries, 'validation' always, "
                                 "'none' never (fit exactly the given settings). Held-out entries are never "
                                 "used for it.")
    validation_fraction: float = option(0.2, "Fraction of the entries in each validation fold, in (0, 1); the "
                                             "folds are disjoint, so fraction x folds must be <= 1.")
    validation_folds: int = option(3, "Validation folds (>= 1): each candidate is fitted once per fold, and "
                                      "its mean score decides. More folds cost more fits and tell close "
                                      "candidates apart more reliably.")

    def check_selection(self) -> None:
        """``select`` must be one of ``SELECT_MODES``, and the validation folds must fit in the entries
        (``validation_folds`` >= 1 disjoint parts of ``validation_fraction`` each)."""
        if self.select not in SELECT_MODES:
            raise UserError(f"select must be one of {', '.join(SELECT_MODES)}, got {self.select!r}")
        if self.validation_folds < 1:
            raise UserError(f"validation_folds must be >= 1, got {self.validation_folds}")
        if not 0.0 < self.validation_fraction * self.validation_folds <= 1.0:
            raise UserError(f"validation_fraction x validation_folds must be in (0, 1], got "
                            f"{self.validation_fraction} x {self.validation_folds}")
