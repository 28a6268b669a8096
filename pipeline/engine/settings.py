"""Checks of model settings shared by every config: a bad value is a UserError naming it."""

from __future__ import annotations

from buffet.data.errors import UserError


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


def check_selection(config: object) -> None:
    """``select`` must be one of ``SELECT_MODES``, and the validation folds must fit in the entries
    (``validation_folds`` >= 1 disjoint parts of ``validation_fraction`` each; issue #10)."""
    if config.select not in SELECT_MODES:
        raise UserError(f"select must be one of {', '.join(SELECT_MODES)}, got {config.select!r}")
    if config.validation_folds < 1:
        raise UserError(f"validation_folds must be >= 1, got {config.validation_folds}")
    if not 0.0 < config.validation_fraction * config.validation_folds <= 1.0:
        raise UserError(f"validation_fraction x validation_folds must be in (0, 1], got "
                        f"{config.validation_fraction} x {config.validation_folds}")
