"""``buffet ingest table`` (CSV/TSV, gzip, Parquet) and ``buffet ingest h5ad``: values, masks and names
stored as the files say; the column options; the preprocessing options against ``data.expression`` on the
whole table; every kind of bad input refused in one line naming file, line and column, with no store left."""

from __future__ import annotations

import gzip
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from buffet.data import expression, tables
from buffet.data.errors import InputError
from buffet.data.ingest_text import ingest
from buffet.data.store import Dataset
from helpers import exported, run_main

# The layout of the Golub et al. leukemia files: a description and an accession column, then each patient's
# value column followed by its call column of letters.
GOLUB = ("Gene Description,Gene Accession Number,1,call,2,call.1,3,call.2\n"
         "first probe,AFFX-1,-214,A,-139,A,-76,A\n"
         "second probe,AFFX-2,153,P,,A,42,P\n"
         "third probe,AFFX-3,58,A,7,A,NA,M\n")
GOLUB_OPTIONS = {"row_names": "Gene Accession Number", "drop_columns": ["Gene Description", "call*"]}


def stored(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The whole stored matrix, NaN where masked, and the mask."""
    rows = ds.read_rows(0, ds.n_rows)
    return np.where(rows.mask, rows.X, np.nan), rows.mask


def leftovers(out: Path) -> list[str]:
    """The store and any hidden partial folder a failed write to ``out`` could leave."""
    return sorted(p.name for p in out.parent.iterdir() if p.name == out.name or p.name.startswith(f".{out.name}."))


def test_golub_layout_with_call_columns_dropped(tmp_path: Path) -> None:
    path = tmp_path / "golub.csv"
    path.write_text(GOLUB)
    ds = ingest("table", [path], tmp_path / "store", **GOLUB_OPTIONS)
    values, mask = stored(ds)
    np.testing.assert_array_equal(values, [[-214, -139, -76], [153, np.nan, 42], [58, 7, np.nan]])
    assert mask.sum() == 7 and ds.kind == "real" and ds.layout == "dense"
    assert ds.strings("row_labels") == ["AFFX-1", "AFFX-2", "AFFX-3"] and ds.strings("col_labels") == ["1", "2", "3"]
    assert ds.attrs["provenance"]["row_names"] == "Gene Accession Number"


def test_gzip_tsv_default_row_names_missing_marker_and_column_choice(tmp_path: Path) -> None:
    path = tmp_path / "expr.tsv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("gene\ts_a\ts_b\tother\n\ng1\t1.5\t-999\t9\ng2\t2\t3e2\t9\n")
    ds = ingest("table", [path], tmp_path / "store", missing=["-999.0"], columns=["s_*"])
    values, _ = stored(ds)
    np.testing.assert_array_equal(values, [[1.5, np.nan], [2, 300]])
    assert ds.strings("row_labels") == ["g1", "g2"] and ds.strings("col_labels") == ["s_a", "s_b"]


def test_numeric_first_column_and_r_style_header(tmp_path: Path) -> None:
    plain, r_style = tmp_path / "plain.csv", tmp_path / "r.csv"
    plain.write_text("a,b\n1,2\n3,4\n")
    r_style.write_text('"x","y"\n"r1",1,2\n"r2",3,4\n')  # R's write.table: no header over the row names
    ds = ingest("table", [plain], tmp_path / "plain")
    assert ds.strings("row_labels") is None and ds.shape == (2, 2)
    ds = ingest("table", [r_style], tmp_path / "r")
    assert ds.strings("row_labels") == ["r1", "r2"] and ds.strings("col_labels") == ["x", "y"]
    ds = ingest("table", [plain], tmp_path / "named", row_names="a")
    assert ds.strings("row_labels") == ["1", "3"] and ds.strings("col_labels") == ["b"]
    (tmp_path / "semi.dat").write_text("k;v,w\nr;2.5\n")
    ds = ingest("table", [tmp_path / "semi.dat"], tmp_path / "semi", delimiter="semicolon")
    assert ds.strings("row_labels") == ["r"] and ds.strings("col_labels") == ["v,w"] and stored(ds)[0][0, 0] == 2.5


def test_transpose_swaps_names(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tables, "BATCH_CELLS", 4)  # batches of one row: the scratch file gathers them all
    path = tmp_path / "t.txt"
    path.write_text("probe\tp1\tp2\tp3\nx\t1\t2\t3\nflat\t5\t5\t5\ny\t4\t\t6\n")
    ds = ingest("table", [path], tmp_path / "store", transpose=True, rows_per_chunk=2, min_range=1)
    values, _ = stored(ds)  # the filter acts on the file's rows (probes), before the transpose
    np.testing.assert_array_equal(values, [[1, 4], [2, np.nan], [3, 6]])
    assert ds.strings("row_labels") == ["p1", "p2", "p3"] and ds.strings("col_labels") == ["x", "y"]


def test_parquet_with_nulls(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"gene": ["a", "b", "c"], "s1": [1.0, None, 2.5],
                             "s2": pa.array([3, 4, None], pa.int32()), "note": ["x", "y", "z"]}), path)
    ds = ingest("table", [path], tmp_path / "store", drop_columns=["note"])
    values, _ = stored(ds)
    np.testing.assert_array_equal(values, [[1, 3], [np.nan, 4], [2.5, np.nan]])
    assert ds.strings("row_labels") == ["a", "b", "c"] and ds.strings("col_labels") == ["s1", "s2"]
    assert ds.attrs["provenance"]["file_format"] == "parquet"


def write_h5ad(path: Path, X, layers: dict | None = None) -> None:
    n, d = X.shape
    adata = anndata.AnnData(X=X, obs=pd.DataFrame(index=[f"cell{i}" for i in range(n)]),
                            var=pd.DataFrame(index=[f"gene{j}" for j in range(d)]), layers=layers)
    adata.write_h5ad(path)


def test_h5ad_sparse_counts_dense_reals_and_a_layer(tmp_path: Path) -> None:
    counts = np.array([[1, 0, 3, 0], [0, 2, 0, 0], [5, 0, 0, 1]])
    write_h5ad(tmp_path / "a.h5ad", sp.csr_matrix(counts.astype(np.float32)), {"lognorm": np.log1p(counts)})
    ds = ingest("h5ad", [tmp_path / "a.h5ad"], tmp_path / "counts")
    assert (ds.layout, ds.kind) == ("csr", "counts")
    np.testing.assert_array_equal(ds.read_rows(0, 3).to_scipy().toarray(), counts)
    assert ds.strings("row_labels") == ["cell0", "cell1", "cell2"] and ds.strings("col_labels")[3] == "gene3"
    ds = ingest("h5ad", [tmp_path / "a.h5ad"], tmp_path / "layer", layer="lognorm")
    assert (ds.layout, ds.kind) == ("dense", "real")
    np.testing.assert_allclose(stored(ds)[0], np.log1p(counts))
    reals = np.array([[0.5, np.nan], [1.5, 2.0]])
    write_h5ad(tmp_path / "b.h5ad", reals)
    ds = ingest("h5ad", [tmp_path / "b.h5ad"], tmp_path / "reals")
    values, mask = stored(ds)
    np.testing.assert_array_equal(values, reals)
    assert not mask[0, 1] and ds.strings("col_labels") == ["gene0", "gene1"]


def test_preprocessing_matches_the_expression_functions_on_the_whole_table(tmp_path: Path, monkeypatch) -> None:
    """Floor, ceiling, both filters, log, then centring and scaling of columns (statistics gathered over all
    batches of two rows) give what the functions give on the whole table at once."""
    monkeypatch.setattr(tables, "BATCH_CELLS", 8)
    rng = np.random.default_rng(3)
    levels = rng.uniform(-50, 3000, size=(9, 4))
    levels[2, 1] = np.nan
    levels[5] = [120, 130, 125, 128]  # a flat probe the filters drop
    path = tmp_path / "levels.csv"
    pd.DataFrame(levels, index=[f"p{i}" for i in range(9)], columns=list("abcd")).to_csv(path, na_rep="NA")
    options = {"floor": 100, "ceiling": 2500, "min_fold": 2, "min_range": 300, "log": "2"}
    ds = ingest("table", [path], tmp_path / "store", center="columns", scale="columns", **options)
    clipped = expression.clip_levels(levels, 100, 2500)
    keep = expression.fold_change_rows(clipped, 2) & expression.range_rows(clipped, 300)
    expected = expression.scale(expression.centre(expression.log_levels(clipped[keep], "2"), "column"), "column")
    values, mask = stored(ds)
    np.testing.assert_allclose(values, expected, rtol=1e-12)
    assert not keep[5] and ds.strings("row_labels") == [f"p{i}" for i in np.flatnonzero(keep)]
    steps = ds.attrs["provenance"]["preprocessing"]
    assert [s["step"] for s in steps] == ["floor", "ceiling", "min_fold", "min_range", "log", "center", "scale"]
    assert steps[3]["rows_kept"] == keep.sum() and steps[3]["rows_in"] == 9
    rows = ingest("table", [path], tmp_path / "rows", center="rows", scale="rows", **options)
    np.testing.assert_allclose(stored(rows)[0], expression.scale(expression.centre(
        expression.log_levels(clipped[keep], "2"), "row"), "row"), rtol=1e-12)


BAD = {
    "non-numeric-cell": ("t.csv", "g,a,b\nx,1,2\ny,3,oops\n", {}, ["t.csv, line 3: column 3 ('b'): 'oops' is not a number",
                                                              "--drop-columns"]),
    "call-columns-kept": ("g.csv", GOLUB, {"row_names": "Gene Accession Number", "drop_columns": ["Gene Description"]},
                          ["g.csv, line 2: column 4 ('call'): 'A' is not a number"]),
    "ragged-row": ("t.csv", "g,a,b\nx,1,2\ny,3\n", {}, ["t.csv, line 3: 2 fields, but the header has 3"]),
    "duplicate-row-name": ("t.tsv", "g\ta\nx\t1\ny\t2\nx\t3\n", {}, ["t.tsv, line 4: row name 'x' repeats (first on line 2)"]),
    "duplicate-column-name": ("t.csv", "g,a,a\nx,1,2\n", {}, ["t.csv: columns 2 and 3 have the same name 'a'"]),
    "empty-file": ("t.csv", "\n\n", {}, ["t.csv: the table is empty"]),
    "header-only": ("t.csv", "g,a\n", {}, ["t.csv: the table has a header but no rows"]),
    "infinite-cell": ("t.csv", "g,a\nx,inf\n", {}, ["t.csv, line 2: column 2 ('a'): 'inf' is not a finite number"]),
    "unknown-row-names": ("t.csv", "g,a\nx,1\n", {"row_names": "gene"}, ["no column named 'gene' for --row-names"]),
    "pattern-matches-nothing": ("t.csv", "g,a\nx,1\n", {"drop_columns": ["call*"]},
                                ["no column matches --drop-columns 'call*'"]),
    "no-delimiter": ("t.dat", "g,a\nx,1\n", {}, ["cannot tell the delimiter", "--delimiter"]),
    "log-of-negative": ("t.csv", "g,a\nx,-1\n", {"log": "10"}, ["t.csv: ", "logarithm is undefined"]),
    "filter-keeps-none": ("t.csv", "g,a,b\nx,1,1\n", {"min_range": 5}, ["no row passes --min-range 5"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_tables_leave_no_store(tmp_path: Path, case: str) -> None:
    name, text, options, fragments = BAD[case]
    (tmp_path / name).write_text(text)
    out = tmp_path / "store"
    with pytest.raises(InputError) as err:
        ingest("table", [tmp_path / name], out, **options)
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    assert leftovers(out) == []


def test_bad_parquet_and_h5ad_leave_no_store(tmp_path: Path) -> None:
    pq.write_table(pa.table({"gene": ["a"], "s1": ["high"]}), tmp_path / "t.parquet")
    with pytest.raises(InputError, match=r"t.parquet: column 2 \('s1'\) holds string values, not numbers"):
        ingest("table", [tmp_path / "t.parquet"], tmp_path / "store")
    write_h5ad(tmp_path / "a.h5ad", np.ones((2, 2)))
    with pytest.raises(InputError, match="a.h5ad: no layer named 'raw' \\(layers: none\\)"):
        ingest("h5ad", [tmp_path / "a.h5ad"], tmp_path / "store", layer="raw")
    with pytest.raises(InputError, match="do not apply to format h5ad"):
        ingest("h5ad", [tmp_path / "a.h5ad"], tmp_path / "store", drop_columns=["x"])
    assert leftovers(tmp_path / "store") == []


def test_command_line_names_reach_the_fit_and_the_export(tmp_path: Path, capsys) -> None:
    """The Golub options on the command line; an h5ad count matrix fitted by Bayesian NMF prints its topics
    in gene names, and the export carries the row and column names."""
    (tmp_path / "golub.csv").write_text(GOLUB)
    run_main(capsys, "ingest", "table", tmp_path / "golub.csv", "--out", tmp_path / "golub",
             "--drop-columns", "call*", "--row-names", "Gene Accession Number", "--drop-columns", "Gene Description")
    assert Dataset(tmp_path / "golub").strings("col_labels") == ["1", "2", "3"]
    rng = np.random.default_rng(0)
    write_h5ad(tmp_path / "c.h5ad", sp.csr_matrix(rng.poisson(2.0, size=(40, 12)).astype(np.int32)))
    run_main(capsys, "ingest", "h5ad", tmp_path / "c.h5ad", "--out", tmp_path / "counts")
    fit = run_main(capsys, "fit", "bnmf", tmp_path / "counts", "--out", tmp_path / "run", "--k", 2,
                   "--batch-size", 20, "--passes", 1, "--executor", "process", "--quiet")
    assert "topic" in fit and "gene" in fit
    arrays = exported(capsys, tmp_path / "run", tmp_path / "fit.npz")
    assert list(arrays["row_labels"][:2]) == ["cell0", "cell1"] and arrays["col_labels"][11] == "gene11"
    assert arrays["vocab"][0] == "gene0"
