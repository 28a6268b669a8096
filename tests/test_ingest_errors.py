"""Every bad-input case of file ingest (malformed lines, values the data kind forbids, ids out of
range, empty files, wrong header counts), for every format where it applies.

Each case asserts that the ``InputError`` names the file and the line (or says why there is
none), that no store and no hidden partial folder is left, and that an existing store survives
a failed ``overwrite``.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from buffet.data.arrays import from_array
from buffet.data.errors import InputError
from buffet.data.ingest_text import ingest
from buffet.data.store import Dataset, first_invalid

DW = "docword.txt"
LDAC = "corpus.ldac"
MTX_INT = "%%MatrixMarket matrix coordinate integer general\n% a comment\n"
MTX_REAL = "%%MatrixMarket matrix coordinate real general\n"
UNSORTED_LATE = "9\n2\n9\n" + "".join(f"{d} 1 1\n" for d in (1, 2, 3, 4, 5, 6, 7, 3, 8))  # line 11 goes back

# (format, files written in source order, options, fragments the message must contain)
CASES = {
    # UCI bag of words
    "uci-negative-count": ("uci", {DW: "2\n3\n2\n1 1 2\n2 3 -1\n"}, {}, [f"{DW}, line 5:", "negative count"]),
    "uci-non-integer-count": ("uci", {DW: "2\n3\n2\n1 1 2.5\n2 3 1\n"}, {}, [f"{DW}, line 4:", "non-integer count"]),
    "uci-nan-count": ("uci", {DW: "2\n3\n2\n1 1 1\n2 3 nan\n"}, {}, [f"{DW}, line 5:", "NaN/inf"]),
    "uci-docid-beyond-D": ("uci", {DW: "2\n3\n2\n1 1 2\n3 1 1\n"}, {},
                           [f"{DW}, line 5:", "docID 3 is out of range 1..2", "line 1 says D = 2"]),
    "uci-wordid-beyond-W": ("uci", {DW: "2\n3\n2\n1 4 2\n2 1 1\n"}, {},
                            [f"{DW}, line 4:", "wordID 4 is out of range 1..3", "line 2 says W = 3"]),
    "uci-wordid-zero": ("uci", {DW: "2\n3\n1\n1 0 2\n"}, {}, [f"{DW}, line 4:", "wordID 0 is out of range"]),
    "uci-empty-file": ("uci", {DW: ""}, {}, [f"{DW}: the file is empty"]),
    "uci-header-only-two-lines": ("uci", {DW: "2\n3\n"}, {},
                                  [f"{DW}: the file ends before the header line giving NNZ"]),
    "uci-nnz-larger-than-entries": ("uci", {DW: "2\n3\n3\n1 1 2\n2 3 1\n"}, {},
                                    [f"{DW}: the file ends (line 5) after 2 entries", "line 3 announced NNZ = 3"]),
    "uci-nnz-smaller-than-entries": ("uci", {DW: "2\n3\n1\n1 1 2\n2 3 1\n"}, {},
                                     [f"{DW}, line 5: more entries than the NNZ = 1 announced on line 3"]),
    "uci-zero-documents": ("uci", {DW: "0\n3\n0\n"}, {}, [f"{DW}, line 1: D = 0; it must be between 1 and"]),
    "uci-absurd-vocabulary": ("uci", {DW: "1\n99999999999\n0\n"}, {}, [f"{DW}, line 2: W = 99999999999"]),
    "uci-header-not-integer": ("uci", {DW: "2\nthree\n2\n"}, {}, [f"{DW}, line 2:", "'three' is not an integer W"]),
    "uci-header-two-numbers": ("uci", {DW: "2 3\n3\n2\n"}, {}, [f"{DW}, line 1:", "header line should hold D"]),
    "uci-missing-field": ("uci", {DW: "2\n3\n2\n1 1 2\n2 3\n"}, {},
                          [f"{DW}, line 5:", "expected 3 fields (docID wordID count), found 2"]),
    "uci-text-in-id": ("uci", {DW: "2\n3\n2\n1 x 2\n2 3 1\n"}, {}, [f"{DW}, line 4:", "'x' is not an integer wordID"]),
    "uci-unsorted-docids": ("uci", {DW: "3\n3\n3\n2 1 1\n1 2 1\n3 1 1\n"}, {},
                            [f"{DW}, line 5:", "docID 1 comes after docID 2 (line 4)", "sort -k1,1n -k2,2n"]),
    "uci-duplicate-entry": ("uci", {DW: "2\n3\n3\n1 2 1\n1 1 1\n1 2 5\n"}, {},
                            [f"{DW}, line 6:", "duplicate entry for docID 1, wordID 2 (already on line 4)"]),
    "uci-vocab-too-short": ("uci", {DW: "1\n3\n1\n1 1 1\n", "vocab.txt": "a\nb\n"}, {},
                            ["vocab.txt: 2 words", f"{DW} line 2 says W = 3"]),
    "uci-vocab-empty-line": ("uci", {DW: "1\n3\n1\n1 1 1\n", "vocab.txt": "a\n\nb\n"}, {},
                             ["vocab.txt, line 2: empty line"]),
    "uci-vocab-empty-file": ("uci", {DW: "1\n3\n1\n1 1 1\n", "vocab.txt": ""}, {},
                             ["vocab.txt: 0 words", f"{DW} line 2 says W = 3"]),
    "uci-unsorted-across-blocks": ("uci", {DW: UNSORTED_LATE},
                                   {"block_bytes": 7}, [f"{DW}, line 11:", "docID 3 comes after docID 7 (line 10)"]),
    "uci-duplicate-across-blocks": ("uci", {DW: "1\n5\n5\n1 1 1\n1 2 1\n1 3 1\n1 4 1\n1 2 1\n"}, {"block_bytes": 6},
                                    [f"{DW}, line 8:", "duplicate entry for docID 1, wordID 2 (already on line 5)"]),
    # LDA-C
    "ldac-negative-count": ("ldac", {LDAC: "1 0:2\n1 3:-1\n"}, {}, [f"{LDAC}, line 2:", "negative count"]),
    "ldac-non-integer-count": ("ldac", {LDAC: "1 0:2.5\n"}, {}, [f"{LDAC}, line 1:", "non-integer count"]),
    "ldac-n-differs-from-pairs": ("ldac", {LDAC: "2 0:1 1:1\n3 0:1 2:2\n"}, {},
                                  [f"{LDAC}, line 2:", "N = 3 but the line holds 2 id:count pairs"]),
    "ldac-not-a-pair": ("ldac", {LDAC: "1 0:1\n2 0:1 5\n"}, {}, [f"{LDAC}, line 2:", "'5' is not an id:count pair"]),
    "ldac-text-count": ("ldac", {LDAC: "1 0:x\n"}, {}, [f"{LDAC}, line 1:", "'x' is not a number (count)"]),
    "ldac-id-beyond-vocab": ("ldac", {LDAC: "1 1:1\n1 3:1\n", "vocab.txt": "a\nb\nc\n"}, {},
                             [f"{LDAC}, line 2:", "word id 3 is out of range 0..2", "vocab.txt has 3 words"]),
    "ldac-negative-id": ("ldac", {LDAC: "1 -1:2\n"}, {}, [f"{LDAC}, line 1:", "word id -1 is out of range"]),
    "ldac-duplicate-id": ("ldac", {LDAC: "1 1:1\n3 0:1 4:1 0:2\n"}, {},
                          [f"{LDAC}, line 2:", "duplicate word id 0 in document 2 (already on line 2)"]),
    "ldac-empty-file": ("ldac", {LDAC: "\n\n"}, {}, [f"{LDAC}: no documents"]),
    # Matrix Market
    "mtx-negative-count": ("mtx", {"m.mtx": MTX_INT + "2 2 2\n1 1 3\n2 2 -1\n"}, {},
                           ["m.mtx, line 5:", "negative count"]),
    "mtx-non-integer-count": ("mtx", {"m.mtx": MTX_REAL + "2 2 1\n1 1 1.5\n"}, {"kind": "counts"},
                              ["m.mtx, line 3:", "non-integer count"]),
    "mtx-not-binary": ("mtx", {"m.mtx": MTX_INT + "2 2 2\n1 1 1\n2 1 2\n"}, {"kind": "binary"},
                       ["m.mtx, line 5:", "value 2.0 is not 0 or 1"]),
    "mtx-nan": ("mtx", {"m.mtx": MTX_REAL + "2 2 2\n1 1 nan\n2 2 1\n"}, {}, ["m.mtx, line 3:", "NaN/inf"]),
    "mtx-array-inf": ("mtx", {"m.mtx": "%%MatrixMarket matrix array real general\n2 1\n1.0\n-inf\n"}, {},
                      ["m.mtx, line 4:", "NaN/inf"]),
    "mtx-row-out-of-range": ("mtx", {"m.mtx": MTX_REAL + "2 2 1\n3 1 1\n"}, {},
                             ["m.mtx, line 3:", "row index 3 is out of range 1..2", "line 2 gives the size 2 x 2"]),
    "mtx-column-zero": ("mtx", {"m.mtx": MTX_REAL + "2 2 1\n1 0 1\n"}, {},
                        ["m.mtx, line 3:", "column index 0 is out of range 1..2"]),
    "mtx-fewer-entries": ("mtx", {"m.mtx": MTX_REAL + "2 2 3\n1 1 1\n2 2 1\n"}, {},
                          ["m.mtx: the file ends (line 4) after 2 entries", "line 2 announced entries = 3"]),
    "mtx-more-entries": ("mtx", {"m.mtx": MTX_REAL + "2 2 1\n1 1 1\n2 2 1\n"}, {},
                         ["m.mtx, line 4: more entries than the entries = 1 announced on line 2"]),
    "mtx-array-too-few-values": ("mtx", {"m.mtx": "%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n"}, {},
                                 ["m.mtx: the file ends (line 5) after 3 entries", "rows x columns = 4"]),
    "mtx-bad-banner": ("mtx", {"m.mtx": "%%MatrixMarket tensor coordinate real general\n1 1 0\n"}, {},
                       ["m.mtx, line 1: not a Matrix Market banner"]),
    "mtx-symmetric": ("mtx", {"m.mtx": "%%MatrixMarket matrix coordinate real symmetric\n1 1 0\n"}, {},
                      ["m.mtx, line 1:", "symmetry 'symmetric' is not supported"]),
    "mtx-complex": ("mtx", {"m.mtx": "%%MatrixMarket matrix coordinate complex general\n1 1 0\n"}, {},
                    ["m.mtx, line 1:", "field 'complex' is not supported"]),
    "mtx-no-columns": ("mtx", {"m.mtx": MTX_REAL + "2 0 0\n"}, {}, ["m.mtx, line 2: columns = 0"]),
    "mtx-empty-file": ("mtx", {"m.mtx": ""}, {}, ["m.mtx: the file is empty"]),
    "mtx-no-size-line": ("mtx", {"m.mtx": MTX_INT + "% only comments\n"}, {},
                         ["m.mtx: the file ends before the header line giving rows columns entries"]),
    "mtx-missing-value": ("mtx", {"m.mtx": MTX_REAL + "2 2 1\n1 1\n"}, {},
                          ["m.mtx, line 3:", "expected 3 fields (row column value), found 2"]),
    "mtx-duplicate": ("mtx", {"m.mtx": MTX_REAL + "2 2 2\n1 1 2\n1 1 3\n"}, {},
                      ["m.mtx, line 4:", "duplicate entry (1, 1) (already on line 3)"]),
    "mtx-duplicate-counts": ("mtx", {"m.mtx": MTX_INT + "2 2 3\n2 1 2\n1 1 3\n2 1 3\n"}, {},
                             ["m.mtx, line 6:", "duplicate entry (2, 1) (already on line 4)"]),
    # long-form ratings
    "ratings-duplicate": ("ratings", {"r.csv": "u1,i1,3\nu2,i1,4\nu1,i1,5\n"}, {},
                          ["r.csv, line 3:", "duplicate rating for user 'u1' and item 'i1' (already on line 1)"]),
    "ratings-nan": ("ratings", {"r.csv": "user,item,rating\nu1,i1,3\nu2,i1,nan\n"}, {}, ["r.csv, line 3:", "NaN/inf"]),
    "ratings-missing-field": ("ratings", {"r.tsv": "a\tb\t1\nc\td\n"}, {},
                              ["r.tsv, line 2:", "expected user, item, rating"]),
    "ratings-not-a-number": ("ratings", {"r.csv": "a,b,1\n\nc,d,x\n"}, {}, ["r.csv, line 3:", "'x' is not a number"]),
    "ratings-empty-file": ("ratings", {"r.csv": ""}, {}, ["r.csv: no ratings (the file is empty)"]),
    "ratings-header-only": ("ratings", {"r.csv": "user,item,rating\n"}, {}, ["r.csv: no ratings (the file holds only"]),
    # dense ratings tables
    "dense-ragged-row": ("dense-ratings", {"t.txt": "1 2 3\n4 5\n"}, {}, ["t.txt, line 2:", "expected 3 fields"]),
    "dense-inf": ("dense-ratings", {"t.txt": "1 2 3\n1 inf 3\n"}, {}, ["t.txt, line 2: column 2: NaN/inf"]),
    "dense-nan-not-sentinel": ("dense-ratings", {"t.txt": "1 nan 3\n"}, {}, ["t.txt, line 1: column 2: NaN/inf"]),
    "dense-wrong-count-column": ("dense-ratings", {"t.csv": "2,1,99\n"}, {"first_column_count": True},
                                 ["t.csv, line 1:", "the first column says 2 rated items but the row has 1"]),
    "dense-not-a-number": ("dense-ratings", {"t.txt": "1 2 3\n1 2 x\n"}, {}, ["t.txt, line 2:", "'x' is not a number"]),
    "dense-empty-field": ("dense-ratings", {"t.csv": "1,2,3\n1,,3\n"}, {}, ["t.csv, line 2:", "'' is not a number"]),
    "dense-count-without-ratings": ("dense-ratings", {"t.txt": "\n\n3\n"}, {"first_column_count": True},
                                    ["t.txt, line 3: first_column_count needs a count column"]),
    "dense-empty-file": ("dense-ratings", {"t.txt": " \n"}, {}, ["t.txt: no rows (the file is empty)"]),
    # role-mining pairs
    "pairs-duplicate": ("pairs", {"p.txt": "1 2\n2 2\n1 2\n"}, {},
                        ["p.txt, line 3:", "duplicate pair (user 1, permission 2) (already on line 1)"]),
    "pairs-zero-id": ("pairs", {"p.txt": "1 1\n0 1\n"}, {}, ["p.txt, line 2:", "user id 0 is out of range", "1-based"]),
    "pairs-three-fields": ("pairs", {"p.txt": "1 2\n1 2 3\n"}, {},
                           ["p.txt, line 2:", "expected 2 fields (user permission), found 3"]),
    "pairs-non-integer": ("pairs", {"p.txt": "1 2.5\n"}, {}, ["p.txt, line 1:", "'2.5' is not an integer permission"]),
    "pairs-empty-file": ("pairs", {"p.txt": ""}, {}, ["p.txt: no user permission pairs"]),
}


def write_sources(folder: Path, files: dict[str, str]) -> list[Path]:
    """Write the case's files; return them in source order."""
    paths = []
    for name, text in files.items():
        (folder / name).write_text(text)
        paths.append(folder / name)
    return paths


def leftovers(out: Path) -> list[str]:
    """Hidden partial or old folders a write to ``out`` could leave beside it."""
    return [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def assert_rejected(fmt: str, sources: list[Path], out: Path, options: dict, fragments: list[str]) -> None:
    """The ingest fails with an InputError holding every fragment and leaves nothing behind."""
    with pytest.raises(InputError) as info:
        ingest(fmt, sources, out, **options)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    assert not out.exists() or Dataset(out).attrs["provenance"]["source"] == "in-memory array"
    assert leftovers(out) == []


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_rejected_without_a_store(tmp_path: Path, case: str) -> None:
    fmt, files, options, fragments = CASES[case]
    sources = write_sources(tmp_path, files)
    out = tmp_path / "store"
    assert_rejected(fmt, sources, out, options, fragments)
    assert not out.exists()


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("uci-") and "vocab" not in c and "header" not in c])
def test_bad_uci_input_gives_the_same_error_when_parsed_in_a_second_process(tmp_path: Path, monkeypatch,
                                                                            case: str) -> None:
    """A large file's blocks are parsed in a second process (``textblocks.record_blocks``); an error found
    there names the same file and line."""
    from buffet.data import textblocks

    monkeypatch.setattr(textblocks, "BACKGROUND_MIN_BYTES", 0)
    fmt, files, options, fragments = CASES[case]
    assert_rejected(fmt, write_sources(tmp_path, files), tmp_path / "store", {"block_bytes": 4, **options}, fragments)


@pytest.mark.parametrize("case", ["uci-unsorted-docids", "ldac-n-differs-from-pairs", "mtx-nan", "ratings-duplicate",
                                  "dense-ragged-row", "pairs-duplicate", "uci-vocab-too-short"])
def test_failed_overwrite_keeps_the_existing_store(tmp_path: Path, case: str) -> None:
    fmt, files, options, fragments = CASES[case]
    sources = write_sources(tmp_path, files)
    out = tmp_path / "store"
    old = np.arange(6.0).reshape(2, 3)
    from_array(old, out, kind="real")
    assert_rejected(fmt, sources, out, {**options, "overwrite": True}, fragments)
    np.testing.assert_array_equal(Dataset(out).read_rows(0, 2).X, old)


def test_existing_store_needs_overwrite(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("1 1\n")
    from_array(np.ones((1, 1)), tmp_path / "store", kind="binary")
    with pytest.raises(InputError, match="already exists"):
        ingest("pairs", [tmp_path / "p.txt"], tmp_path / "store")
    assert ingest("pairs", [tmp_path / "p.txt"], tmp_path / "store", overwrite=True).attrs["provenance"]["format"] \
        == "pairs"


def test_corrupt_gzip_names_the_file(tmp_path: Path) -> None:
    body = "1\n2\n2\n" + "1 1 1\n1 2 1\n" * 1
    data = gzip.compress(body.encode())
    (tmp_path / "docword.txt.gz").write_bytes(data[: len(data) // 2])
    assert_rejected("uci", [tmp_path / "docword.txt.gz"], tmp_path / "store", {},
                    ["docword.txt.gz", "cannot read the file"])


def test_missing_source_file(tmp_path: Path) -> None:
    assert_rejected("pairs", [tmp_path / "nope.txt"], tmp_path / "store", {}, ["nope.txt: cannot open"])


@pytest.mark.parametrize("options, fragment", [({"holdout": 1.5}, "holdout fraction must be in (0, 1)"),
                                               ({"rows_per_chunk": 0}, "rows_per_chunk must be >= 1"),
                                               ({"block_bytes": -1}, "block_bytes must be >= 1")])
def test_bad_options_fail_before_reading(tmp_path: Path, options: dict, fragment: str) -> None:
    (tmp_path / "p.txt").write_text("1 1\n")
    assert_rejected("pairs", [tmp_path / "p.txt"], tmp_path / "store", options, [fragment])


def test_holdout_leaving_no_training_rows(tmp_path: Path) -> None:
    (tmp_path / DW).write_text("1\n1\n1\n1 1 1\n")
    assert_rejected("uci", [tmp_path / DW], tmp_path / "store", {"holdout": 0.9}, ["leaves no training rows"])


EDGE_VALUES = [0.0, -0.0, 1.0, 2.0, 0.5, -1.0, 1e300, -1e300, np.inf, -np.inf, np.nan]
VALID = {"counts": lambda x: np.isfinite(x) and x >= 0 and x == np.round(x),
         "binary": lambda x: x in (0.0, 1.0),
         "real": lambda x: bool(np.isfinite(x))}


@pytest.mark.parametrize("kind", sorted(VALID))
@pytest.mark.parametrize("edge", EDGE_VALUES)
def test_first_invalid_finds_exactly_the_values_a_kind_cannot_take(kind: str, edge: float) -> None:
    """One edge value among valid ones: ``first_invalid`` names its position when the kind cannot take it
    and nothing otherwise (its quick all-valid test must never pass a bad value)."""
    values = np.array([1.0, 0.0, 1.0, edge, 0.0])
    found = first_invalid(kind, values)
    if VALID[kind](edge):
        assert found is None
    else:
        assert found is not None and found[0] == 3
