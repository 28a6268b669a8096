"""One entry point for file ingest, called by ``buffet ingest FMT SOURCE... --out STORE``."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from buffet.data.errors import InputError
from buffet.data.h5ad import ingest_h5ad
from buffet.data.ldac import ingest_ldac
from buffet.data.mtx import ingest_mtx
from buffet.data.pairs import ingest_pairs
from buffet.data.ratings import ingest_dense_ratings, ingest_ratings
from buffet.data.store import Dataset
from buffet.data.tables import ingest_table
from buffet.data.textblocks import PathLike
from buffet.data.uci import ingest_uci

# format -> (ingest function, its source files: required, and optional after them)
FORMATS: dict[str, tuple[Callable[..., Dataset], tuple[str, ...], tuple[str, ...]]] = {
    "uci": (ingest_uci, ("DOCWORD",), ("VOCAB",)),
    "ldac": (ingest_ldac, ("CORPUS",), ("VOCAB",)),
    "mtx": (ingest_mtx, ("MATRIX",), ()),
    "ratings": (ingest_ratings, ("RATINGS",), ()),
    "dense-ratings": (ingest_dense_ratings, ("TABLE",), ()),
    "pairs": (ingest_pairs, ("PAIRS",), ()),
    "table": (ingest_table, ("TABLE",), ()),
    "h5ad": (ingest_h5ad, ("H5AD",), ()),
}


def ingest(fmt: str, sources: list[PathLike], out: PathLike, **options: Any) -> Dataset:
    """Ingest ``sources`` in format ``fmt`` into a dataset store at ``out``.

    ``fmt`` is one of uci, ldac, mtx, ratings, dense-ratings, pairs, table, h5ad; for uci and ldac
    a second source is the vocabulary. ``options`` are the keyword options of the format's function
    (holdout, seed, rows_per_chunk, overwrite, block_bytes, and transpose, sentinel,
    first_column_count, kind, the table options or the preprocessing options where they apply). An option left unset (None, or False for a
    flag) is ignored; one that does not apply to the format is an ``InputError``.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown ingest format {fmt!r}; expected one of {', '.join(FORMATS)}")
    func, required, optional = FORMATS[fmt]
    if not len(required) <= len(sources) <= len(required) + len(optional):
        usage = " ".join(required + tuple(f"[{name}]" for name in optional))
        raise InputError(f"format {fmt} takes the source file(s) {usage}; got {len(sources)}")
    given = {name: value for name, value in options.items() if value is not None and value is not False}
    stray = sorted(set(given) - _option_names(func))
    if stray:
        flags = ", ".join("--" + name.replace("_", "-") for name in stray)
        raise InputError(f"option(s) {flags} do not apply to format {fmt}")
    padded = list(sources) + [None] * (len(required) + len(optional) - len(sources))
    return func(*padded, out, **given)


def _option_names(func: Callable[..., Dataset]) -> set[str]:
    """The keyword options of an ingest function: its parameters after ``out``."""
    names = list(inspect.signature(func).parameters)
    return set(names[names.index("out") + 1:])
