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
