"""A wide-vocabulary corpus whose minibatches touch a fraction of the vocabulary, as real text's do.

``buffet generate`` spreads its topics over the whole vocabulary, so at V = 100,000 a minibatch of 1000
documents holds nine tenths of the words. Real text has a head of common words and a long tail of rare
ones. This takes a counts store (e.g. a generated V = 8000 corpus), moves each nonzero's word, with
probability ``--moved``, to a tail word of ids V_in .. V_out - 1 drawn by Zipf(``--zipf``) rank (ranks past
the tail drawn uniformly), sums the duplicates and writes a UCI docword file for ``buffet ingest uci``.

    buffet generate --docs 30000 --seed 1 --out v8000.txt
    buffet ingest uci v8000.txt --out v8000.zarr --holdout 0.005
    python benchmarks/long_tail_corpus.py v8000.zarr --words 100000 --out tail100000.txt
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp

from buffet.pipeline.engine.dataset import source_of


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--words", type=int, default=100_000, help="vocabulary size of the output")
    p.add_argument("--moved", type=float, default=0.1, help="fraction of nonzeros moved to tail words")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the tail words' ranks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    src = source_of(args.store).open()
    rows = src.read_rows(0, src.n_rows)
    X = sp.csr_matrix((rows.data, rows.indices, rows.indptr), shape=src.shape).tocoo()
    rng = np.random.default_rng(args.seed)
    tail = args.words - src.n_cols
    move = rng.random(X.nnz) < args.moved
    ranks = rng.zipf(args.zipf, int(move.sum()))
    ranks = np.where(ranks > tail, rng.integers(1, tail + 1, len(ranks)), ranks)
    cols = X.col.astype(np.int64)
    cols[move] = src.n_cols - 1 + ranks
    Y = sp.csr_matrix((X.data, (X.row, cols)), shape=(X.shape[0], args.words))
    Y.sum_duplicates()
    Y = Y.tocoo()
    with open(args.out, "w") as out:
        out.write(f"{Y.shape[0]}\n{Y.shape[1]}\n{Y.nnz}\n")
        np.savetxt(out, np.column_stack([Y.row + 1, Y.col + 1, Y.data.astype(np.int64)]), fmt="%d")
    print(f"{args.out}: {Y.shape[0]} documents, {args.words} words, {Y.nnz} nonzeros")


if __name__ == "__main__":
    main()
