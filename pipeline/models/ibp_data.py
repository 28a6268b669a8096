"""The data of the IBP samplers (particle filters, Gibbs samplers): every row of a dense
dataset, read once on the client. These models visit all rows at every step, and their data are small
(hundreds to a few thousand rows), so the drivers send the rows to the cluster once
(``Engine.share``) instead of cutting them into blocks."""

from __future__ import annotations

from buffet.data.errors import UserError
from buffet.data.store import DenseRows, check_values
from buffet.pipeline.engine.dataset import Source


def read_dense_rows(source: Source, binary: bool) -> DenseRows:
    """All rows of the dense dataset ``source``, checked to be 0/1 (where observed) if ``binary``."""
    data = source.open()
    if data.layout != "dense":
        raise UserError(f"{source}: the IBP models need a dense dataset (real or binary)")
    rows = data.read_rows(0, data.n_rows)
    if binary:
        check_values("binary", rows.X, str(source), rows.mask)
    return rows
