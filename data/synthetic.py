"""Synthetic corpora: drawn from Bayesian NMF itself, or LDA-shaped at any size, or short documents dealt
from the tokens of real ones.

``write_uci_corpus`` streams an LDA-shaped corpus of the New York Times shape of paper 002
(V = 8000, about 300 tokens per document) to a UCI ``docword`` file in blocks, so a
1.8M-document corpus is written in bounded memory.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class SyntheticCorpus:
    """Counts (documents x words, CSR) and the generating parameters."""

    X: sp.csr_matrix
    topics: np.ndarray   # (V, K) beta for BNMF; topic-word distributions for LDA
    weights: np.ndarray  # (D, K) theta


def bnmf_corpus(n_docs: int, n_words: int, n_topics: int, rng: np.random.Generator,
                topic_shape: float = 0.1, doc_shape: float = 0.5, tokens_per_doc: float = 100.0,
                ) -> SyntheticCorpus:
    """Draw X_dv ~ Poisson(sum_k beta_vk theta_kd) with gamma beta and theta (paper 002, eq. 11.6).

    beta_vk ~ Gamma(topic_shape, 1) normalised per topic (sparse, distinct topics) and
    theta_kd ~ Gamma(doc_shape, doc_shape K / tokens_per_doc), so a document has about
    ``tokens_per_doc`` tokens.
    """
    beta = rng.gamma(topic_shape, 1.0, size=(n_words, n_topics))
    beta /= beta.sum(axis=0, keepdims=True)
    theta = rng.gamma(doc_shape, tokens_per_doc / (doc_shape * n_topics), size=(n_docs, n_topics))
    X = sp.csr_matrix(rng.poisson(theta @ beta.T).astype(np.float64))
    return SyntheticCorpus(X, beta, theta)


def lda_topics(n_words: int, n_topics: int, rng: np.random.Generator, eta: float = 0.05) -> np.ndarray:
    """Topic-word distributions (V x K) drawn from a symmetric Dirichlet(eta)."""
    return rng.dirichlet(np.full(n_words, eta), size=n_topics).T


def lda_documents(topics: np.ndarray, n_docs: int, rng: np.random.Generator, alpha: float,
                  mean_length: float) -> sp.csr_matrix:
    """LDA documents: theta ~ Dir(alpha), length ~ Poisson(mean_length), each token's topic
    from theta and its word from that topic, sampled token-wise by inverse CDF per topic."""
    n_words, n_topics = topics.shape
    theta = rng.dirichlet(np.full(n_topics, alpha), size=n_docs)
    topic_counts = rng.multinomial(rng.poisson(mean_length, size=n_docs), theta)
    doc_of = np.repeat(np.repeat(np.arange(n_docs), n_topics), topic_counts.ravel())
    topic_of = np.repeat(np.tile(np.arange(n_topics), n_docs), topic_counts.ravel())
    cdf = np.cumsum(topics, axis=0)
    word_of = np.empty_like(topic_of)
    for k in range(n_topics):
        at = topic_of == k
        word_of[at] = np.searchsorted(cdf[:, k], rng.uniform(0.0, cdf[-1, k], size=int(at.sum())))
    word_of = np.minimum(word_of, n_words - 1)
    ones = np.ones(len(doc_of))
    return sp.csr_matrix((ones, (doc_of, word_of)), shape=(n_docs, n_words))


def deal_tokens(X: sp.csr_matrix, pieces: int, rng: np.random.Generator) -> sp.csr_matrix:
    """Short documents from long ones: each row's tokens dealt uniformly at random into ``pieces`` rows
    (row i becomes rows i * pieces ... i * pieces + pieces - 1; empty rows are dropped)."""
    C = X.tocoo()
    parts = rng.multinomial(C.data.astype(np.int64), np.full(pieces, 1.0 / pieces))
    rows = np.concatenate([C.row * pieces + j for j in range(pieces)])
    Y = sp.csr_matrix((parts.T.ravel().astype(np.float64), (rows, np.tile(C.col, pieces))),
                      shape=(X.shape[0] * pieces, X.shape[1]))
    Y.eliminate_zeros()
    return Y[np.diff(Y.indptr) > 0]


def write_uci_corpus(path: str | os.PathLike, n_docs: int, n_words: int = 8000, n_topics: int = 100,
                     mean_length: float = 300.0, alpha: float | None = None, seed: int = 0,
                     block_docs: int = 5000, vocab_path: str | os.PathLike | None = None) -> dict:
    """Write an LDA-shaped corpus (NYT shape by default) as a UCI docword file, block by block.

    The header's NNZ is only known at the end, so the body goes to a temporary file first
    and the header is written in front of it; ``.gz`` paths are compressed. Returns sizes.
    """
    rng = np.random.default_rng(seed)
    topics = lda_topics(n_words, n_topics, rng)
    alpha = 1.0 / n_topics if alpha is None else alpha
    path = Path(path)
    body = path.with_name(path.name + ".body")
    nnz = 0
    with open(body, "w") as out:
        for start in range(0, n_docs, block_docs):
            block = lda_documents(topics, min(block_docs, n_docs - start), rng, alpha, mean_length).tocoo()
            lines = np.column_stack([block.row + start + 1, block.col + 1, block.data.astype(np.int64)])
            out.write(("%d %d %d\n" * len(lines)) % tuple(lines.ravel().tolist()))
            nnz += block.nnz
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as out, open(body) as src:
        out.write(f"{n_docs}\n{n_words}\n{nnz}\n")
        for chunk in iter(lambda: src.read(1 << 24), ""):
            out.write(chunk)
    body.unlink()
    if vocab_path is not None:
        Path(vocab_path).write_text("".join(f"word{v}\n" for v in range(n_words)))
    return {"docs": n_docs, "words": n_words, "nnz": nnz, "path": str(path)}
