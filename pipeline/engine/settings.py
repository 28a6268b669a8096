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
