"""Round trips of file ingest against NumPy/SciPy references, streaming, and the dispatcher."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
import zarr

from buffet.data.bundled import rolemining_path
from buffet.data.errors import InputError, UserError
from buffet.data.ingest_text import ingest
from buffet.data import ldac
from buffet.data.ldac import ingest_ldac
from buffet.data.mtx import ingest_mtx
from buffet.data.pairs import ingest_pairs
from buffet.data.ratings import ingest_dense_ratings, ingest_ratings
from buffet.data.store import Dataset
from buffet.data.textblocks import (Block, Records, RecordSpec, _parse_records_fast, _parse_records_slowly,
                                    pack_records, unpack_records)
from buffet.data.uci import ingest_uci

def random_counts(n_rows: int, n_cols: int, density: float, seed: int) -> sp.csr_matrix:
    """A sparse count matrix with some empty rows (documents without words)."""
    rng = np.random.default_rng(seed)
    X = sp.random(n_rows, n_cols, density=density, format="csr", random_state=rng,
                  data_rvs=lambda n: rng.integers(1, 9, n))
    keep = np.ones(n_rows)
    keep[rng.choice(n_rows, size=max(1, n_rows // 10), replace=False)] = 0
    X = sp.csr_matrix(sp.diags(keep) @ X)
    X.eliminate_zeros()
    return X


def uci_text(X: sp.csr_matrix) -> str:
    """``X`` in the UCI docword format (1-based, sorted by docID then wordID)."""
    coo = X.tocoo()
    order = np.lexsort((coo.col, coo.row))
    lines = [f"{r + 1} {c + 1} {int(v)}" for r, c, v in zip(coo.row[order], coo.col[order], coo.data[order])]
    return "\n".join([str(X.shape[0]), str(X.shape[1]), str(X.nnz), *lines]) + "\n"


def all_rows(ds: Dataset) -> np.ndarray:
    """The stored matrix as a dense array (0 where a mask says unobserved)."""
    block = ds.read_rows(0, ds.n_rows)
    return block.to_scipy().toarray() if ds.layout == "csr" else block.X


def test_uci_round_trip(tmp_path: Path) -> None:
    X = random_counts(40, 25, 0.2, seed=1)
    (tmp_path / "docword.txt").write_text(uci_text(X))
    ds = ingest_uci(tmp_path / "docword.txt", None, tmp_path / "store", rows_per_chunk=7)
    assert (ds.layout, ds.kind, ds.shape) == ("csr", "counts", X.shape)
    np.testing.assert_array_equal(all_rows(ds), X.toarray())
    for r0, r1 in ds.row_bounds():
        np.testing.assert_array_equal(ds.read_rows(r0, r1).to_scipy().toarray(), X[r0:r1].toarray())
    prov = ds.attrs["provenance"]
    assert prov["format"] == "uci" and prov["header"] == {"D": 40, "W": 25, "NNZ": X.nnz}
    assert prov["sources"][0]["file"] == "docword.txt" and prov["sources"][0]["bytes"] > 0


def test_uci_gzip_with_vocab_and_holdout(tmp_path: Path) -> None:
    X = random_counts(30, 12, 0.3, seed=2)
    with gzip.open(tmp_path / "docword.kos.txt.gz", "wt") as fh:
        fh.write(uci_text(X))
    vocab = [f"word{j}" for j in range(12)]
    (tmp_path / "vocab.kos.txt").write_text("\n".join(vocab) + "\n")
    ds = ingest_uci(tmp_path / "docword.kos.txt.gz", tmp_path / "vocab.kos.txt", tmp_path / "store",
                    holdout=0.2, seed=5)
    np.testing.assert_array_equal(all_rows(ds), X.toarray())
    assert ds.strings("vocab") == vocab
    test_rows = ds.split("heldout")["test_rows"]
    assert test_rows.size == 6 and np.all(np.diff(test_rows) > 0)
    assert [s["file"] for s in ds.attrs["provenance"]["sources"]] == ["docword.kos.txt.gz", "vocab.kos.txt"]


def test_uci_streaming_blocks_much_smaller_than_file(tmp_path: Path) -> None:
    X = random_counts(300, 50, 0.15, seed=3)
    text = uci_text(X)
    (tmp_path / "docword.txt").write_text(text)
    assert len(text) > 50 * 200
    ds = ingest_uci(tmp_path / "docword.txt", None, tmp_path / "store", rows_per_chunk=16, block_bytes=200)
    np.testing.assert_array_equal(all_rows(ds), X.toarray())
    whole = ingest_uci(tmp_path / "docword.txt", None, tmp_path / "whole", rows_per_chunk=16)
    for name in ("indptr", "indices", "data", "chunk_offsets"):
        np.testing.assert_array_equal(ds.group[name][:], whole.group[name][:])


@pytest.mark.parametrize("as_text", [None, False, True], ids=["when-waiting", "never", "always"])
def test_uci_parsed_in_a_second_process_gives_the_same_store(tmp_path: Path, monkeypatch, as_text) -> None:
    """Blocks read in a second process (the default for large files, ``textblocks.record_blocks``) make the same
    arrays, in file order, as blocks read and parsed in this one, and the same line count, whichever of them the
    reader parses and packs and whichever it sends as text (``None``: as it decides, when this side waits)."""
    from buffet.data import textblocks

    X = random_counts(300, 50, 0.15, seed=5)
    (tmp_path / "docword.txt").write_text(uci_text(X))
    here = ingest_uci(tmp_path / "docword.txt", None, tmp_path / "here", rows_per_chunk=16, block_bytes=200)
    monkeypatch.setattr(textblocks, "BACKGROUND_MIN_BYTES", 0)
    if as_text is not None:
        monkeypatch.setattr(textblocks, "_send_as_text", lambda waiting: as_text)
    parser_pid, pack = tmp_path / "parser.pid", textblocks.pack_records
    monkeypatch.setattr(textblocks, "pack_records", lambda r: parser_pid.write_text(str(os.getpid())) and pack(r))
    there = ingest_uci(tmp_path / "docword.txt", None, tmp_path / "there", rows_per_chunk=16, block_bytes=200)
    for name in ("indptr", "indices", "data", "chunk_offsets"):
        np.testing.assert_array_equal(there.group[name][:], here.group[name][:])
    assert there.attrs["provenance"]["lines"] == here.attrs["provenance"]["lines"]
    if as_text is False:
        assert int(parser_pid.read_text()) != os.getpid()  # the parser ran, in another process
    if as_text is True:
        assert not parser_pid.exists()  # nothing was packed: every block came as text


def test_a_reading_process_that_dies_is_one_clear_error(tmp_path: Path, monkeypatch) -> None:
    """If the second process dies without a word (killed, out of memory), the ingest fails with a message
    naming the file and the exit code, and leaves no store."""
    from buffet.data import textblocks

    (tmp_path / "docword.txt").write_text(uci_text(random_counts(300, 50, 0.15, seed=6)))
    monkeypatch.setattr(textblocks, "BACKGROUND_MIN_BYTES", 0)
    monkeypatch.setattr(textblocks.TextSource, "blocks", lambda *args: os._exit(3))  # runs in the reading process
    with pytest.raises(UserError, match=r"docword\.txt: the process reading it stopped unexpectedly \(exit code 3"):
        ingest_uci(tmp_path / "docword.txt", None, tmp_path / "store", block_bytes=200)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docword.txt"]  # no store, no hidden partial one


@pytest.mark.parametrize("ids, values, lines", [
    ([[1, 2], [3, 2 ** 40]], [[1.0], [0.1]], [4, 5]),         # int64 ids, a value float32 cannot hold
    ([[1, 2], [3, 4]], [[2.0], [np.nan]], [4, 9]),            # NaN, lines with a gap
    ([[1, 2], [3, 4]], [[2.0], [np.inf]], [7, 8]),
    (np.zeros((0, 2)), np.zeros((0, 1)), []),
])
def test_records_packed_for_the_reading_process_come_back_the_same(ids, values, lines) -> None:
    records = Records(np.asarray(ids, dtype=np.int64), np.asarray(values, dtype=np.float64),
                      np.asarray(lines, dtype=np.int64))
    back = unpack_records(pack_records(records))
    for field in ("ids", "values", "lines"):
        np.testing.assert_array_equal(getattr(back, field), getattr(records, field))
        assert getattr(back, field).dtype == getattr(records, field).dtype


def test_a_count_store_records_its_total_while_it_is_written(tmp_path: Path) -> None:
    """The total number of tokens (what a topic model's fit needs first) is counted during the ingest, so a
    fit never reads the whole store for it; a store written without it is summed as before."""
    X = random_counts(300, 50, 0.15, seed=4)
    (tmp_path / "docword.txt").write_text(uci_text(X))
    ds = ingest_uci(tmp_path / "docword.txt", None, tmp_path / "store", rows_per_chunk=16, block_bytes=200,
                    holdout=0.1, seed=0)
    assert ds.attrs["total"] == ds.total() == X.sum() and ds.split_names() == ["heldout"]
    group = zarr.open_group(tmp_path / "store", mode="r+")
    del group.attrs["total"]
    assert Dataset(tmp_path / "store").total() == X.sum()


def test_uci_accepts_unsorted_words_blank_lines_and_crlf(tmp_path: Path) -> None:
    text = "3\r\n5\r\n4\r\n\r\n1 4 2\r\n1 2 1\r\n   \r\n3 5 7\r\n3 1 1\r\n\r\n"
    (tmp_path / "docword.txt").write_bytes(text.encode())
    ds = ingest_uci(tmp_path / "docword.txt", None, tmp_path / "store")
    expected = np.zeros((3, 5))
    expected[0, [3, 1]] = [2, 1]
    expected[2, [4, 0]] = [7, 1]
    np.testing.assert_array_equal(all_rows(ds), expected)
    np.testing.assert_array_equal(ds.read_rows(0, 1).indices, [1, 3])


@pytest.mark.parametrize("data, values, lines, fast_applies", [
    (b"1 2 3\n4 5 6\n", [3.0, 6.0], [10, 11], True),
    (b"1 2 3\n4 5  6\n", [3.0, 6.0], [10, 11], True),             # two spaces: not single-spaced, still fast
    (b"1 2 3\n4 5 6 \n", [3.0, 6.0], [10, 11], True),             # trailing space
    (b"1 2 3\n\n 4\t5 6 \r\n", [3.0, 6.0], [10, 12], True),       # blank line, tab, CRLF
    (b"1 2 3.5\n4 5 -6e1\n", [3.5, -60.0], [10, 11], True),
    (b"1,2,3\n4,5,6\r\n", [3.0, 6.0], [10, 11], True),
    (b"1,2,3\n4, 5 ,6\n", [3.0, 6.0], [10, 11], False),            # spaces around a delimiter
])
def test_fast_and_line_by_line_parsers_give_the_records(data: bytes, values: list, lines: list,
                                                        fast_applies: bool) -> None:
    """Ids (1, 2) and (4, 5) with the given values, on lines numbered from the block's first line (10)."""
    spec = RecordSpec(("a", "b"), ("v",), b"," if b"," in data else None)
    fast = _parse_records_fast(Block(data, 10), spec)
    parsed = [_parse_records_slowly(Block(data, 10), spec, "f")] + ([fast] if fast_applies else [])
    assert (fast is not None) == fast_applies
    for records in parsed:
        np.testing.assert_array_equal(records.ids, [[1, 2], [4, 5]])
        np.testing.assert_array_equal(records.values, np.reshape(values, (2, 1)))
        np.testing.assert_array_equal(records.lines, lines)
        assert (records.ids.dtype, records.values.dtype, records.lines.dtype) == (np.int64, np.float64, np.int64)


@pytest.mark.parametrize("data", [b"1,2,3\n1,,2 3\n", b"1,2,3\n1,2,3,\n", b"1 2 3\n1 2\n3\n", b"1 2 x\n",
                                  b"1 2 3\n4 5 6 7\n8 9\n",  # 9 tokens on 3 lines, not 3 on each
                                  # two fields with three separators: the digit-line check passes, the count does not
                                  b"1 2 3\n4  5\n", b"1 2 3\n 4 5\n", b"1 2 3\n4 5 \n"])
def test_fast_parser_leaves_malformed_blocks_to_the_line_parser(data: bytes) -> None:
    spec = RecordSpec(("a", "b"), ("v",), b"," if b"," in data else None)
    assert _parse_records_fast(Block(data, 1), spec) is None
    with pytest.raises(InputError, match=r"^f, line 2: |^f, line 1: 'x'"):
        _parse_records_slowly(Block(data, 1), spec, "f")


def test_ldac_fast_and_line_by_line_parsers_give_the_records() -> None:
    """Four documents (one empty) on lines 4, 6, 7, 8; ids are (document in the block, word)."""
    block = Block(b"2 0:1 3:2\r\n\n0\n1\t5:3 \n  2 7:1  2:4\n", 4)
    fast, slow = ldac._parse_fast(block), ldac._parse_slowly(block, "f")
    assert fast is not None
    for records, n_docs in (fast, slow):
        assert n_docs == 4
        np.testing.assert_array_equal(records.ids, [[0, 0], [0, 3], [2, 5], [3, 7], [3, 2]])
        np.testing.assert_array_equal(records.values, [[1.0], [2.0], [3.0], [1.0], [4.0]])
        np.testing.assert_array_equal(records.lines, [4, 4, 7, 8, 8])


def test_ldac_round_trip_without_vocab(tmp_path: Path) -> None:
    (tmp_path / "corpus.ldac").write_text("2 0:1 3:2\n0\n3 5:1 1:4 2:2\n\n1 3:3\n")
    ds = ingest_ldac(tmp_path / "corpus.ldac", None, tmp_path / "store", block_bytes=8)
    expected = np.array([[1, 0, 0, 2, 0, 0], [0] * 6, [0, 4, 2, 0, 0, 1], [0, 0, 0, 3, 0, 0]])
    np.testing.assert_array_equal(all_rows(ds), expected)
    assert ds.strings("vocab") is None


def test_ldac_reuters_matches_lda_package(tmp_path: Path) -> None:
    lda_datasets = pytest.importorskip("lda.datasets")
    folder = Path(lda_datasets.__file__).parent / "tests"
    ds = ingest_ldac(folder / "reuters.ldac", folder / "reuters.tokens", tmp_path / "store")
    X = lda_datasets.load_reuters()
    assert ds.shape == X.shape == (395, 4258)
    np.testing.assert_array_equal(all_rows(ds), X)
    assert ds.strings("vocab") == list(lda_datasets.load_reuters_vocab())


def test_mtx_coordinate_fields(tmp_path: Path) -> None:
    counts = random_counts(9, 7, 0.3, seed=4)
    scipy.io.mmwrite(tmp_path / "counts.mtx", counts.astype(np.int64), field="integer", symmetry="general")
    ds = ingest_mtx(tmp_path / "counts.mtx", tmp_path / "counts")
    assert (ds.layout, ds.kind) == ("csr", "counts")
    np.testing.assert_array_equal(all_rows(ds), scipy.io.mmread(tmp_path / "counts.mtx").toarray())

    real = sp.random(6, 4, density=0.5, format="coo", random_state=0)
    scipy.io.mmwrite(tmp_path / "real.mtx", real, field="real", symmetry="general")
    ds = ingest_mtx(tmp_path / "real.mtx", tmp_path / "real", holdout=0.25, seed=1)
    assert (ds.layout, ds.kind, ds.has_mask) == ("dense", "real", False)
    np.testing.assert_allclose(all_rows(ds), scipy.io.mmread(tmp_path / "real.mtx").toarray())
    assert ds.split("heldout")["test_mask"].sum() == 6

    scipy.io.mmwrite(tmp_path / "pattern.mtx", (real != 0).astype(np.int64), field="pattern", symmetry="general")
    ds = ingest_mtx(tmp_path / "pattern.mtx", tmp_path / "pattern")
    assert (ds.layout, ds.kind) == ("dense", "binary")
    np.testing.assert_array_equal(all_rows(ds), (real.toarray() != 0).astype(float))


def shuffled_mtx(path: Path, X: sp.coo_matrix, field: str, seed: int) -> None:
    """X as a coordinate Matrix Market file listing its entries in random order."""
    order = np.random.default_rng(seed).permutation(X.nnz)
    value = (lambda v: f" {int(v)}") if field == "integer" else (lambda v: f" {float(v)!r}")
    body = "".join(f"{X.row[k] + 1} {X.col[k] + 1}{value(X.data[k])}\n" for k in order)
    path.write_text(f"%%MatrixMarket matrix coordinate {field} general\n{X.shape[0]} {X.shape[1]} {X.nnz}\n{body}")


@pytest.mark.parametrize("field, layout", [("integer", "csr"), ("real", "dense")])
def test_mtx_in_any_order_is_assembled_bucket_by_bucket(tmp_path: Path, field: str, layout: str) -> None:
    """Entries in random order, read in ~20-line blocks and spilled into 3-row buckets (``RowBuckets``),
    give the matrix itself; a cell repeated in another block and bucket run is still named by its lines."""
    X = sp.coo_matrix(random_counts(23, 11, 0.35, seed=5)) if field == "integer" else \
        sp.random(23, 11, density=0.35, format="coo", random_state=5)
    shuffled_mtx(tmp_path / "m.mtx", X, field, seed=6)
    ds = ingest_mtx(tmp_path / "m.mtx", tmp_path / "store", rows_per_chunk=3, block_bytes=200)
    assert ds.layout == layout
    np.testing.assert_array_equal(all_rows(ds), X.toarray())

    lines = (tmp_path / "m.mtx").read_text().splitlines()
    n = len(lines) - 2
    lines[1] = f"{X.shape[0]} {X.shape[1]} {n + 1}"
    (tmp_path / "dup.mtx").write_text("\n".join(lines + [lines[3]]) + "\n")
    with pytest.raises(InputError, match=f"line {n + 3}: duplicate entry .* \\(already on line 4\\)"):
        ingest_mtx(tmp_path / "dup.mtx", tmp_path / "dup", rows_per_chunk=3, block_bytes=200)
    assert not (tmp_path / "dup").exists()


def test_mtx_array_format_is_column_major(tmp_path: Path) -> None:
    A = np.arange(12, dtype=float).reshape(3, 4) / 4
    scipy.io.mmwrite(tmp_path / "dense.mtx", A, field="real")
    ds = ingest_mtx(tmp_path / "dense.mtx", tmp_path / "store")
    np.testing.assert_array_equal(all_rows(ds), A)
    ds = ingest_mtx(tmp_path / "dense.mtx", tmp_path / "binary", kind="real")
    assert ds.kind == "real"


def test_ratings_csv_with_header(tmp_path: Path) -> None:
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n"
                                          "u7,m1,4.5,100\nu3,m2,1,101\n\"u7\",m3,-2,102\nu3,m1,3,103\n")
    ds = ingest_ratings(tmp_path / "ratings.csv", tmp_path / "store", holdout=0.5, seed=0)
    assert (ds.layout, ds.kind, ds.has_mask) == ("dense", "real", True)
    assert ds.strings("row_labels") == ["u7", "u3"] and ds.strings("col_labels") == ["m1", "m2", "m3"]
    block = ds.read_rows(0, 2)
    np.testing.assert_array_equal(block.X, [[4.5, 0, -2], [3, 1, 0]])
    np.testing.assert_array_equal(block.mask, [[True, False, True], [True, True, False]])
    test = ds.split("heldout")["test_mask"]
    assert test.sum() == 2 and not (test & ~block.mask).any()
    assert ds.attrs["provenance"]["header"] == ["userId", "movieId", "rating", "timestamp"]


def test_ratings_tsv_without_header(tmp_path: Path) -> None:
    (tmp_path / "u.data").write_text("196\t242\t3\t881250949\n186\t302\t3\t891717742\n196\t302\t1\t878887116\n")
    ds = ingest_ratings(tmp_path / "u.data", tmp_path / "store")
    assert ds.strings("row_labels") == ["196", "186"] and ds.strings("col_labels") == ["242", "302"]
    np.testing.assert_array_equal(ds.read_rows(0, 2).X, [[3, 1], [0, 3]])


def test_dense_ratings_jester_layout(tmp_path: Path) -> None:
    (tmp_path / "jester.csv").write_text("2,1.5,99,-9.2\n2,99,0,7\n3,1,2,3\n")
    ds = ingest_dense_ratings(tmp_path / "jester.csv", tmp_path / "store", first_column_count=True,
                              rows_per_chunk=2, block_bytes=5, holdout=0.3, seed=2)
    block = ds.read_rows(0, 3)
    np.testing.assert_array_equal(block.mask, [[True, False, True], [False, True, True], [True, True, True]])
    np.testing.assert_array_equal(block.X, [[1.5, 0, -9.2], [0, 0, 7], [1, 2, 3]])
    assert ds.split("heldout")["test_mask"].sum() == 2
    (tmp_path / "plain.txt").write_text("1 -1 nan\n2 nan 4\n")
    ds = ingest_dense_ratings(tmp_path / "plain.txt", tmp_path / "plain", sentinel=float("nan"))
    np.testing.assert_array_equal(ds.read_rows(0, 2).mask, [[True, True, False], [True, False, True]])


@pytest.mark.parametrize("name, users, perms, ones", [("domino.txt", 79, 231, 730), ("fire1.txt", 365, 709, 31951)])
def test_rolemining_pairs(tmp_path: Path, name: str, users: int, perms: int, ones: int) -> None:
    source = rolemining_path(name)
    ds = ingest_pairs(source, tmp_path / "users")
    assert (ds.layout, ds.kind, ds.shape, ds.has_mask) == ("dense", "binary", (users, perms), False)
    X = all_rows(ds)
    pairs = np.loadtxt(source, dtype=np.int64).reshape(-1, 2) - 1
    assert X.sum() == ones == len(pairs)
    assert X[pairs[:, 0], pairs[:, 1]].all()
    transposed = ingest_pairs(source, tmp_path / "perms", transpose=True, holdout=0.2, seed=0)
    assert transposed.shape == (perms, users)
    np.testing.assert_array_equal(all_rows(transposed), X.T)
    assert transposed.split("heldout")["test_mask"].sum() == round(0.2 * users * perms)


def test_only_the_shipped_rolemining_files_are_offered() -> None:
    with pytest.raises(UserError, match="unknown role-mining file 'apj.txt'; the package ships domino.txt, fire1.txt"):
        rolemining_path("apj.txt")


def test_dispatcher(tmp_path: Path) -> None:
    X = random_counts(10, 6, 0.4, seed=6)
    (tmp_path / "docword.txt").write_text(uci_text(X))
    (tmp_path / "vocab.txt").write_text("\n".join("abcdef") + "\n")
    ds = ingest("uci", [str(tmp_path / "docword.txt"), str(tmp_path / "vocab.txt")], tmp_path / "store",
                holdout=0.3, seed=1, transpose=False, sentinel=None, rows_per_chunk=4)
    np.testing.assert_array_equal(all_rows(ds), X.toarray())
    assert ds.strings("vocab") == list("abcdef") and ds.rows_per_chunk == 4
    (tmp_path / "pairs.txt").write_text("1 2\n2 1\n")
    assert ingest("pairs", [tmp_path / "pairs.txt"], tmp_path / "pairs", transpose=True).shape == (2, 2)
    with pytest.raises(InputError, match="unknown ingest format 'csv'"):
        ingest("csv", [tmp_path / "pairs.txt"], tmp_path / "x")
    with pytest.raises(InputError, match="takes the source file"):
        ingest("pairs", [tmp_path / "pairs.txt", tmp_path / "pairs.txt"], tmp_path / "x")
    with pytest.raises(InputError, match="--transpose do not apply to format uci"):
        ingest("uci", [tmp_path / "docword.txt"], tmp_path / "x", transpose=True)
    assert not (tmp_path / "x").exists()
