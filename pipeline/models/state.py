"""A model driver's client-side values as one typed object, and the two methods through which the engine's
fit loop checkpoints and restores them (``engine.loop.Driver``'s ``global_arrays``/``set_globals``).

A driver keeps everything a checkpoint must hold besides its named block states in ``self.state``, a
dataclass derived from ``DriverState``. The checkpoint holds the state's fields under their names
(``engine.codec`` flattens the values: arrays, numbers, lists, dicts), so a field keeps its name for as
long as checkpoints written under that name should restore.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import Any, Mapping, TypeVar

State = TypeVar("State", bound="DriverState")


@dataclass
class DriverState:
    """The base of a driver's state: its checkpoint values are its fields, by name."""

    def to_arrays(self) -> dict[str, Any]:
        """The values a checkpoint holds, by name. They may share memory with the state (a checkpoint writes
        them at once): a caller that keeps them past the next step keeps a copy."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_arrays(cls: type[State], arrays: Mapping[str, Any]) -> State:
        """The state ``to_arrays`` gave (names ``arrays`` holds besides the fields are ignored)."""
        return cls(**{field.name: arrays[field.name] for field in fields(cls)})

    def mark(self) -> Any:
        """The values of now, for ``from_mark`` to give back (the fit loop takes one at the start of every step,
        to try the step again after lost workers): a deep copy of ``to_arrays``. A state that changes large
        arrays in place can keep less (``models.bnmf.BNMFState``)."""
        return copy.deepcopy(self.to_arrays())

    @classmethod
    def from_mark(cls: type[State], mark: Any) -> State:
        """The state ``mark`` kept; the mark stays usable."""
        return cls.from_arrays(copy.deepcopy(mark))


class StatefulDriver:
    """``global_arrays`` and ``set_globals`` of a driver whose client-side values are ``self.state``, of the
    class ``state_type``."""

    state_type: type[DriverState]
    state: DriverState

    def global_arrays(self) -> dict[str, Any]:
        return self.state.to_arrays()

    def set_globals(self, arrays: Mapping[str, Any]) -> None:
        self.state = self.state_type.from_arrays(arrays)

    def recovery_values(self) -> Any:
        """What ``recover`` takes to go back to the values of now: the state's ``mark``."""
        return self.state.mark()

    def recover(self, mark: Any) -> None:
        """Back to the values ``recovery_values`` gave, through ``set_globals`` (and what a driver does there)."""
        self.set_globals(copy.deepcopy(mark))
