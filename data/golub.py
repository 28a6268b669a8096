"""The leukemia expression data of Golub et al. (1999) that ship with the package (``datasets/golub/``, whose
README.md gives their source, layout and licence note), read into one table.

The two shipped CSV files (patients 1-38 and 39-72, patient columns in no particular order, each level
followed by a detection call) become a 72 x 7,129 array of levels with patients in id order, the calls
dropped, and each patient's ALL/AML label from ``actual.csv``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from buffet.data.bundled import GOLUB_FILES, shipped_path
from buffet.data.errors import InputError
from buffet.data.table_columns import ColumnChoice
from buffet.data.tables import MISSING, CsvTable

CLASSES = ("ALL", "AML")


@dataclass(frozen=True)
class Golub:
    """The leukemia table: ``levels`` (patients x probes, float64), the probes' accession numbers, the patient
    ids (1-72, ascending) and each patient's label, "ALL" or "AML"."""

    levels: np.ndarray
    probes: list[str]
    patients: np.ndarray
    labels: list[str]

    @property
    def is_aml(self) -> np.ndarray:
        """True for the AML patients (the labels as 0/1 targets)."""
        return np.array([label == "AML" for label in self.labels])


def read_levels(path: Path) -> tuple[list[str], dict[int, np.ndarray]]:
    """One expression file: the probes' accession numbers in file order and each patient's levels by id, read
    as ``buffet ingest table`` reads it (``data.tables.CsvTable``: the description and call columns left out)."""
    choice = ColumnChoice(row_names="Gene Accession Number", drop_columns=("Gene Description", "call*"))
    table = CsvTable(path, ",", choice, MISSING)
    batches = list(table.batches())
    values = np.vstack([batch.values for batch in batches])
    probes = [name for batch in batches for name in batch.names]
    return probes, {int(pid): values[:, c] for c, pid in enumerate(table.columns)}


def read_labels(path: Path) -> dict[int, str]:
    """``actual.csv``: each patient id's label."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    labels = {int(row["patient"]): row["cancer"] for row in rows}
    bad = sorted(set(labels.values()) - set(CLASSES))
    if bad:
        raise InputError(f"{path}: unknown labels {', '.join(bad)}; expected {' or '.join(CLASSES)}")
    return labels


def load_golub() -> Golub:
    """The shipped table: both files merged, patients in id order, detection calls dropped."""
    train_file, independent_file, labels_file = (shipped_path("golub", name) for name in GOLUB_FILES)
    probes, columns = read_levels(train_file)
    more_probes, more_columns = read_levels(independent_file)
    if more_probes != probes:
        raise InputError(f"{independent_file}: its probes differ from those of {train_file}")
    columns.update(more_columns)
    labels = read_labels(labels_file)
    patients = np.array(sorted(columns))
    if set(labels) != set(columns):
        raise InputError(f"{labels_file}: its patient ids differ from those of the expression files")
    return Golub(np.vstack([columns[p] for p in patients]), probes, patients, [labels[p] for p in patients])
