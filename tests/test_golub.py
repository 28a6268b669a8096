"""The shipped leukemia table (data/golub.py): merged, ordered, labelled as data/datasets/golub/README.md says."""

import csv
import gzip

import numpy as np
import pytest

from buffet.data.bundled import shipped_path
from buffet.data.errors import UserError
from buffet.data.golub import load_golub


def test_the_table_has_72_patients_in_id_order_and_their_labels():
    data = load_golub()
    assert data.levels.shape == (72, 7129) and len(data.probes) == 7129
    np.testing.assert_array_equal(data.patients, np.arange(1, 73))
    assert data.labels.count("ALL") == 47 and data.labels.count("AML") == 25
    assert data.is_aml.sum() == 25 and data.labels[0] == "ALL" and data.labels[49] == "AML"
    assert data.probes[0] == "AFFX-BioB-5_at" and len(set(data.probes)) == 7129


@pytest.mark.parametrize("name,column", [("data_set_ALL_AML_train.csv.gz", "34"),
                                         ("data_set_ALL_AML_independent.csv.gz", "72")])
def test_levels_are_read_by_patient_id_not_by_column_position(name, column):
    """Patient 34 is the 28th patient column of the first file and 72 the 14th of the second: each one's
    levels must land in its own row, and the calls (letters) nowhere."""
    with gzip.open(shipped_path("golub", name), "rt", newline="") as handle:
        rows = list(csv.reader(handle))
    at = rows[0].index(column)
    want = np.array([float(row[at]) for row in rows[1:]])
    np.testing.assert_array_equal(load_golub().levels[int(column) - 1], want)


def test_only_the_shipped_files_are_offered():
    with pytest.raises(UserError, match="unknown leukemia expression file 'x.csv'; the package ships"):
        shipped_path("golub", "x.csv")
