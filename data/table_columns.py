"""Which columns of a table hold row names and which hold values: the choice of ``--row-names``,
``--columns`` and ``--drop-columns``, shared by every table format (CSV/TSV, Parquet, h5ad)."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Sequence

from buffet.data.errors import InputError
from buffet.data.textblocks import PathLike

NO_ROW_NAMES = "none"  # --row-names none: no column holds row names
PREVIEW = 8  # column names an error message lists


@dataclass(frozen=True)
class ColumnChoice:
    """The options that pick the columns: ``row_names`` (a column name, ``none``, or None for the
    default: the first column when its cells are not numbers), ``columns`` (names or glob patterns of
    the value columns; None = all) and ``drop_columns`` (names or patterns left out)."""

    row_names: str | None = None
    columns: Sequence[str] | None = None
    drop_columns: Sequence[str] | None = None


@dataclass(frozen=True)
class ChosenColumns:
    """Positions in the header: the row-name column (or None) and the value columns, in file order."""

    names: int | None
    values: list[int]


def _preview(header: Sequence[str]) -> str:
    """The first column names, for an error message."""
    shown = ", ".join(repr(h) for h in header[:PREVIEW])
    return shown + (f", ... ({len(header)} columns)" if len(header) > PREVIEW else "")


def _matches(name: str, pattern: str) -> bool:
    """Whether a column name is ``pattern`` itself or matches it as a glob (``call*``)."""
    return name == pattern or fnmatchcase(name, pattern)


def _select(header: Sequence[str], patterns: Sequence[str], option: str, path: PathLike) -> set[int]:
    """Positions of the columns any pattern matches; a pattern that matches none is an error."""
    chosen: set[int] = set()
    for pattern in patterns:
        hits = {i for i, name in enumerate(header) if _matches(name, pattern)}
        if not hits:
            raise InputError(f"{path}: no column matches {option} {pattern!r}; the columns are {_preview(header)}")
        chosen |= hits
    return chosen


def choose_columns(header: Sequence[str], choice: ColumnChoice, first_is_text: bool, path: PathLike) -> ChosenColumns:
    """The row-name and value columns of a table whose column names are ``header``; ``first_is_text`` says
    whether the first column's cells are not numbers (then it holds the row names unless told otherwise).
    Refuses an unknown ``--row-names`` column, patterns that match nothing, no value column left and a
    repeated value-column name."""
    if choice.row_names == NO_ROW_NAMES:
        names = None
    elif choice.row_names is not None:
        if choice.row_names not in header:
            raise InputError(f"{path}: no column named {choice.row_names!r} for --row-names; the columns are "
                             f"{_preview(header)}")
        names = list(header).index(choice.row_names)
    else:
        names = 0 if first_is_text else None
    keep = _select(header, choice.columns, "--columns", path) if choice.columns else set(range(len(header)))
    keep -= _select(header, choice.drop_columns, "--drop-columns", path) if choice.drop_columns else set()
    keep.discard(names)
    values = sorted(keep)
    if not values:
        raise InputError(f"{path}: no value columns left after choosing the row names and --columns/--drop-columns; "
                         f"the columns are {_preview(header)}")
    seen: dict[str, int] = {}
    for i in values:
        if header[i] in seen:
            raise InputError(f"{path}: columns {seen[header[i]] + 1} and {i + 1} have the same name {header[i]!r}; "
                             "column names must be unique (rename one, or leave one out with --drop-columns)")
        seen[header[i]] = i
    return ChosenColumns(names, values)


class UniqueNames:
    """Row names seen so far; a repeated one is an error naming where it first appeared."""

    def __init__(self, path: PathLike, unit: str = "line"):
        """No names yet; ``unit`` is what a position is (a file's ``line``, a Parquet ``row``)."""
        self.path, self.unit = path, unit
        self.first: dict[str, int] = {}
        self.names: list[str] = []

    def add(self, names: Sequence[str], positions: Sequence[int]) -> None:
        """Take a batch of row names at the given positions."""
        for name, pos in zip(names, positions):
            if not name:
                raise InputError(f"{self.path}, {self.unit} {pos}: empty row name; every row needs a name "
                                 "(or pass --row-names none)")
            earlier = self.first.setdefault(name, pos)
            if earlier != pos:
                raise InputError(f"{self.path}, {self.unit} {pos}: row name {name!r} repeats (first on {self.unit} "
                                 f"{earlier}); row names must be unique (or pass --row-names none)")
        self.names.extend(names)
