"""LDA-C ingest: Blei's format, one document per line ``N id:count id:count ...``.

Word ids are 0-based; N must equal the number of pairs on its line. Documents are rows of a
``counts`` matrix in the ``csr`` layout, streamed in blocks. Blank lines are skipped (a
document without words is written ``0``).
"""

from __future__ import annotations

import re

import numpy as np

from buffet.data.arrays import DEFAULT_ROWS_PER_CHUNK
from buffet.data.entries import MAX_INDEX, CSRRowStream, check_kind_values, check_range
from buffet.data.errors import InputError
from buffet.data.ingest_store import check_options, finish_store, provenance
from buffet.data.store import CSRWriter, Dataset, StoreWriter, write_strings
from buffet.data.textblocks import (DEFAULT_BLOCK_BYTES, ID_LIMIT, Block, PathLike, Records, TextSource, at,
                                    parse_float, parse_int, read_words, show, tokens_per_line)

_WELL_FORMED = re.compile(rb"(?:[ \t]*(?:[0-9]+(?:[ \t]+[0-9]+:[0-9]+)*)?[ \t]*\r?\n)*")


def ingest_ldac(path: PathLike, vocab_path: PathLike | None, out: PathLike,
                rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK, overwrite: bool = False,
                holdout: float | None = None, seed: int = 0,
                block_bytes: int = DEFAULT_BLOCK_BYTES,
                storage_options: dict | None = None) -> Dataset:
    """Ingest an LDA-C corpus into a ``counts``/``csr`` dataset at ``out``.

    With a vocabulary the matrix has one column per word and ids must be below its length;
    without one it has ``max id + 1`` columns. Errors name file and line: N differing from the
    number of pairs, malformed pairs, ids out of range, repeated ids in a document, counts that
    are not non-negative integers, an empty file. ``holdout`` stores a ``heldout`` split of whole
    documents (``test_rows``).
    ``out`` may be a URL (``data.urls``); ``storage_options`` go to its filesystem.
    """
    check_options(rows_per_chunk, holdout, block_bytes)
    vocab = read_words(vocab_path) if vocab_path is not None else None
    max_id = len(vocab) - 1 if vocab is not None else MAX_INDEX - 1
    context = f" ({vocab_path} has {len(vocab)} words)" if vocab is not None else ""
    with StoreWriter(out, overwrite, storage_options) as w, TextSource(path) as src:
        writer = CSRWriter(w.group, None if vocab is None else len(vocab), rows_per_chunk, "counts", str(path))
        stream = CSRRowStream(writer, path, lambda r, c: f"word id {c} in document {r + 1}")
        n_docs = 0
        for block in src.blocks(block_bytes):
            rec, block_docs = parse_ldac_block(block, path)
            check_range(rec.ids[:, 1], 0, max_id, rec.lines, path, "word id", context)
            check_kind_values("counts", rec.values, rec.lines, path)
            stream.add(rec.ids[:, 0] + n_docs, rec.ids[:, 1], rec.values[:, 0], rec.lines)
            n_docs += block_docs
        if n_docs == 0:
            raise InputError(at(path, None, "no documents (the file is empty)"))
        shape = stream.finish(n_docs)
        if vocab is not None:
            write_strings(w.group, "vocab", vocab)
        prov = provenance("ldac", [path, vocab_path], documents=n_docs, lines=src.line)
        finish_store(w, "csr", "counts", shape, rows_per_chunk, prov, holdout, seed)
    return Dataset(out, storage_options)


def parse_ldac_block(block: Block, path: PathLike) -> tuple[Records, int]:
    """The (document within the block, word id) pairs and counts of a block, and its number of
    documents. Raises ``InputError`` naming the first malformed line."""
    fast = _parse_fast(block)
    return fast if fast is not None else _parse_slowly(block, path)


def _parse_fast(block: Block) -> tuple[Records, int] | None:
    """Vectorised parse of a well-formed block, or None (the slow parser then names the fault)."""
    if _WELL_FORMED.fullmatch(block.data) is None:
        return None
    per_line = tokens_per_line(block.data)
    doc_lines = np.flatnonzero(per_line)
    n_pairs = per_line[doc_lines] - 1
    flat = np.fromstring(block.data.replace(b":", b" "), dtype=np.int64, sep=" ")
    sizes = 1 + 2 * n_pairs
    heads = np.cumsum(sizes) - sizes
    if flat.size != int(sizes.sum()) or (flat[heads] != n_pairs).any() or (flat >= ID_LIMIT).any():
        return None
    is_pair = np.ones(flat.size, dtype=bool)
    is_pair[heads] = False
    pairs = flat[is_pair].reshape(-1, 2)
    docs = np.repeat(np.arange(doc_lines.size, dtype=np.int64), n_pairs)
    lines = np.repeat(doc_lines + block.first_line, n_pairs)
    return Records(np.column_stack((docs, pairs[:, 0])), pairs[:, 1:].astype(np.float64), lines), doc_lines.size


def _parse_slowly(block: Block, path: PathLike) -> tuple[Records, int]:
    """Line-by-line parse naming the first malformed line."""
    ids: list[tuple[int, int]] = []
    counts: list[float] = []
    lines: list[int] = []
    n_docs = 0
    for offset, raw in enumerate(block.data.split(b"\n")[:-1]):
        line = block.first_line + offset
        fields = raw.split()
        if not fields:
            continue
        n = parse_int(fields[0], "N (number of id:count pairs)", path, line)
        if n != len(fields) - 1:
            raise InputError(at(path, line, f"N = {n} but the line holds {len(fields) - 1} id:count pairs"))
        for field in fields[1:]:
            word, colon, count = field.partition(b":")
            if not colon:
                raise InputError(at(path, line, f"{show(field)} is not an id:count pair"))
            ids.append((n_docs, parse_int(word, "word id", path, line)))
            counts.append(parse_float(count, "count", path, line))
            lines.append(line)
        n_docs += 1
    return Records(np.array(ids, dtype=np.int64).reshape(-1, 2), np.array(counts, dtype=np.float64).reshape(-1, 1),
                   np.array(lines, dtype=np.int64)), n_docs
