"""UCI bag-of-words ingest: ``docword.*.txt[.gz]`` with an optional ``vocab.*.txt``.

The docword file starts with three header lines D (documents), W (words) and NNZ (entries),
followed by NNZ lines ``docID wordID count`` (1-based ids, sorted by docID). Documents are
rows of a ``counts`` matrix in the ``csr`` layout; the file is streamed in blocks, so the NYTimes
corpus (~1 GB of text) is ingested in bounded memory.
"""

from __future__ import annotations

import numpy as np

from buffet.data.arrays import DEFAULT_ROWS_PER_CHUNK
from buffet.data.entries import CSRRowStream, EntryCount, check_dimension, check_kind_values, check_range
from buffet.data.errors import InputError
from buffet.data.ingest_store import check_options, finish_store, provenance
from buffet.data.store import CSRWriter, Dataset, StoreWriter, write_strings
from buffet.data.textblocks import (DEFAULT_BLOCK_BYTES, PathLike, RecordSpec, Records, TextSource, at,
                                    read_int_line, read_words, record_blocks)

UCI_RECORD = RecordSpec(("docID", "wordID"), ("count",))
SORT_HINT = ("UCI files must be sorted by docID; sort one with "
             "(head -n 3 FILE; tail -n +4 FILE | sort -k1,1n -k2,2n) > SORTED")


def ingest_uci(docword_path: PathLike, vocab_path: PathLike | None, out: PathLike,
               rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK, overwrite: bool = False,
               holdout: float | None = None, seed: int = 0,
               block_bytes: int = DEFAULT_BLOCK_BYTES,
               storage_options: dict | None = None) -> Dataset:
    """Ingest a UCI bag-of-words corpus into a ``counts``/``csr`` dataset at ``out``.

    Checks, each an ``InputError`` naming file and line: the header (D, W, NNZ) against the
    entries that follow, ids within 1..D and 1..W, docIDs non-decreasing, no repeated
    (docID, wordID), counts that are non-negative integers, malformed lines, an empty file, and a
    vocabulary whose length is not W. Documents without entries become empty rows.
    ``holdout`` stores a ``heldout`` split of whole documents (``test_rows``).
    ``out`` may be a URL (``data.urls``); ``storage_options`` go to its filesystem.
    """
    check_options(rows_per_chunk, holdout, block_bytes)
    vocab = read_words(vocab_path) if vocab_path is not None else None
    with StoreWriter(out, overwrite, storage_options) as w, TextSource(docword_path) as src:
        (n_docs, n_words, nnz), header_lines = _read_header(src)
        if vocab is not None and len(vocab) != n_words:
            raise InputError(at(vocab_path, None, f"{len(vocab)} words, but {docword_path} line "
                                                  f"{header_lines[1]} says W = {n_words}"))
        stream = CSRRowStream(CSRWriter(w.group, n_words, rows_per_chunk, "counts", str(docword_path)),
                              docword_path, lambda r, c: f"entry for docID {r + 1}, wordID {c + 1}")
        count = EntryCount(nnz, docword_path, header_lines[2], "NNZ")
        last_doc = (1, header_lines[2])
        for rec in record_blocks(src, UCI_RECORD, block_bytes):
            count.add(rec.lines)
            _check_entries(rec, n_docs, n_words, header_lines, docword_path)
            last_doc = _check_doc_order(rec, last_doc, docword_path)
            stream.add(rec.ids[:, 0] - 1, rec.ids[:, 1] - 1, rec.values[:, 0], rec.lines)
        count.finish(src.line)
        shape = stream.finish(n_docs)
        if vocab is not None:
            write_strings(w.group, "vocab", vocab)
        prov = provenance("uci", [docword_path, vocab_path], header={"D": n_docs, "W": n_words, "NNZ": nnz},
                          lines=src.line)
        finish_store(w, "csr", "counts", shape, rows_per_chunk, prov, holdout, seed)
    return Dataset(out, storage_options)


def _read_header(src: TextSource) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """D, W, NNZ and the numbers of their lines; D and W must be usable matrix dimensions."""
    values, lines = zip(*(read_int_line(src, (name,)) for name in ("D", "W", "NNZ")))
    (n_docs,), (n_words,), (nnz,) = values
    check_dimension(n_docs, "D", src.path, lines[0])
    check_dimension(n_words, "W", src.path, lines[1])
    return (n_docs, n_words, nnz), lines


def _check_entries(rec: Records, n_docs: int, n_words: int, header_lines: tuple[int, int, int],
                   path: PathLike) -> None:
    """Ids within the header's D and W; counts that are non-negative integers."""
    check_range(rec.ids[:, 0], 1, n_docs, rec.lines, path, "docID", f" (line {header_lines[0]} says D = {n_docs})")
    check_range(rec.ids[:, 1], 1, n_words, rec.lines, path, "wordID", f" (line {header_lines[1]} says W = {n_words})")
    check_kind_values("counts", rec.values, rec.lines, path)


def _check_doc_order(rec: Records, last: tuple[int, int], path: PathLike) -> tuple[int, int]:
    """DocIDs must not decrease (across blocks too); returns the last (docID, line) seen."""
    if len(rec) == 0:
        return last
    docs = np.concatenate(([last[0]], rec.ids[:, 0]))
    drops = np.flatnonzero(docs[1:] < docs[:-1])
    if drops.size:
        k = int(drops[0])
        before = last[1] if k == 0 else int(rec.lines[k - 1])
        raise InputError(at(path, int(rec.lines[k]), f"docID {int(docs[k + 1])} comes after docID "
                                                     f"{int(docs[k])} (line {before}); {SORT_HINT}"))
    return int(docs[-1]), int(rec.lines[-1])
