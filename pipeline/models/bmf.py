"""Binary matrix factorization on the engine: U by row panels, V by column panels, W globally
(paper 003; docs/models/bmf.md).

The data are held on the workers in two cuts (``engine.hold``): row panels, the data's row blocks
(X and the entries training may see: observed, not held out by the split, not in a validation
sample; ``engine.dataset.dense_blocks``), and column panels, the same entries as rows of X^T, each
regrouped from every row panel (``engine.regroup``). One engine step is one sweep:

1. U side: the designated row panel (panel ``sweep mod P``) runs ``bmf.collapsed_panel_sweep``
   (Gibbs with the collapsed prior and, for the IBP, new features by Metropolis-Hastings) with the
   other panels fixed; then pi_k of the features it uses is drawn on the client and every other
   panel runs ``bmf.conditional_panel_sweep`` in parallel (``kernels.bmf`` docstring: both moves
   are exact, so the sampler is). Features no row uses are dropped. Then, under an IBP prior,
   ``split_merge`` split-merge moves (``kernels.bmf_split_merge``): the pair of entries is drawn on
   the client from the whole of U (which it holds); each move is one task on the rows of the
   support of the moved features, taken from the panels that hold them (its restricted scans
   are sequential over those rows, so the move cannot be spread over panels).
2. V side: the same on the column panels, with W^T and U.
3. W | U, V: Gaussian from tree-reduced A^T A, A^T x (Gaussian model), else ``ess_steps``
   elliptical slice updates whose log likelihoods are summed over the row panels, ``ess_batch``
   candidate angles per round of tasks (``bmf.elliptical_slice``).
4. phi, theta, alpha and lambda from their conjugate Gamma(``hyper_shape``, ``hyper_rate``)
   conditionals, unless ``learn_hyper`` is off.

The binary matrices are small (I x K+, J x L+ bits) and stay on the client, which needs them whole
to form the other side's loadings: with W, the hyperparameters and the count of retained sweeps they
are the driver's client-side values, one ``BMFState``. A panel's task is sent its own rows of U or V
(``engine.from_values``) and, as plain arguments, W and the other side's whole matrix. Every random draw comes from
``stream(seed, purpose, sweep, panel)``, made inside the task that uses it, so a seed gives the same
chain on any number of workers and a step tried again draws the same numbers. After ``burn_in``
sweeps each row panel adds its predictive means E[x_ij | U, V, W] (``bmf.mean_of``) to a running sum,
the named per-block state "pred"; their average over retained sweeps is the posterior predictive
mean of every entry, held-out ones included (paper 003, Sec. 3.4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from buffet.data.errors import InputError, UserError
from buffet.data.splits import EntrySample
from buffet.data.store import DenseRows, check_values
from buffet.kernels import bmf
from buffet.kernels import bmf_split_merge as sm
from buffet.kernels.ibp_prior import sample_ibp
from buffet.pipeline.engine.blas import single_threaded_blas
from buffet.pipeline.engine.dataset import Source, dense_blocks, read_seen_chunk, row_ranges
from buffet.pipeline.engine.engine import BlockSet, Engine
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.selection import Candidate
from buffet.pipeline.engine.settings import (SelectionSettings, checkpoint_option, option, require_counts,
                                             require_positive, split_option)
from buffet.pipeline.models.state import DriverState, StatefulDriver

PRED = "pred"  # the named state of the running sums of predictive means, one block per row panel
FEATURE_CAPS = (2, 4, 8)  # finite K = L tried beside the configured priors when chosen on validation
DATA_KINDS = {"logistic": "binary", "poisson": "counts"}  # values each observation model accepts


@dataclass
class BMFConfig(SelectionSettings):
    """Settings of a BMF fit (the sweep of the module docstring). Why ``move_size`` defaults to
    0: the extra move (paper 003, Sec. 3.3) did not improve the reconstructions of the bars data (3 seeds).
    Why ``split_merge`` defaults to 0: on the bars (10 seeds) the moves
    put the true K+ and L+ inside the chain's 90% interval no more often (2 and 1 of 10 against 1 and 0),
    overshot both, and made a sweep several times slower."""

    likelihood: str = option("gaussian", "Observation model: 'gaussian' for real values, 'logistic' for binary "
                                         "0/1 data, 'poisson' for counts (log link: rate exp(U W V^T)).")
    sweeps: int = option(200, "Gibbs sweeps in all, burn-in included (>= 1); a sweep updates U, V, W and the "
                              "hyperparameters once. Raise it until the traced log joint stops drifting.")
    burn_in: int = option(50, "Sweeps discarded before predictions are averaged, in [0, --sweeps). Raise it if "
                              "the trace still drifts early on.")
    seed: int = option(0, "Seed of every draw of the sampler; the same seed gives the same chain on any number "
                          "of workers.")
    alpha: float = option(1.0, "Concentration alpha of U's prior (> 0): a row of X has about alpha / beta "
                               "features a priori. A start value resampled with --learn-hyper under the IBP, "
                               "else fixed.")
    lam: float = option(1.0, "Concentration lambda of V's prior (> 0), as --alpha for the columns of X: a start "
                             "value resampled with --learn-hyper under the IBP, else fixed.")
    beta: float = option(1.0, "Second IBP parameter beta of both priors, pi_k ~ Beta(alpha/K, beta) (> 0), held "
                              "fixed. Larger beta gives more features in all, each shared by fewer rows.")
    finite_k: int | None = option(None, "Unset: an IBP prior on U, which learns the number of row features K. "
                                        "A number K: a finite Beta-Bernoulli prior with exactly K features.")
    finite_l: int | None = option(None, "Unset: an IBP prior on V, which learns the number of column features "
                                        "L. A number L: a finite Beta-Bernoulli prior with exactly L features.")
    phi: float = option(1.0, "Prior precision phi of the weights, W_kl ~ N(w0, 1/phi) (> 0): a start value, "
                             "resampled with --learn-hyper. Smaller allows larger weights.")
    theta: float = option(1.0, "Gaussian model only: noise precision theta = 1 / noise variance (> 0); a start "
                               "value, resampled with --learn-hyper. Start near 1 / the data's noise variance.")
    w0: float = option(0.0, "Prior mean w0 of the weights, W_kl ~ N(w0, 1/phi). Set it to the typical value "
                            "one feature pair adds to an entry's linear predictor.")
    learn_hyper: bool = option(True, "Resample phi, theta, alpha and lambda every sweep under Gamma(--hyper-shape, "
                                     "--hyper-rate) priors; --no-learn-hyper holds them at the given values.")
    hyper_shape: float = option(1.0, "Shape of the Gamma priors of phi, theta, alpha and lambda (> 0), used with "
                                     "--learn-hyper. The prior mean is shape / rate.")
    hyper_rate: float = option(1.0, "Rate of the Gamma priors of phi, theta, alpha and lambda (> 0), used with "
                                    "--learn-hyper. Larger pulls them towards 0.")
    ess_steps: int = option(5, "Logistic and Poisson models: elliptical slice updates of W per sweep (>= 1). "
                               "More mix W faster; each costs rounds of likelihood tasks over all row panels.")
    ess_batch: int = option(8, "Candidate angles of an elliptical slice update evaluated per round of tasks "
                               "(>= 1). Any value samples exactly; larger means fewer, bigger rounds, some "
                               "evaluations unused.")
    move_size: int = option(0, "Features redrawn at once by one extra Metropolis-Hastings move per row and sweep "
                               "(>= 0; 0 turns the move off). It can help a chain leave poor feature sets.")
    split_merge: int = option(0, "Split-merge moves per sweep on each side with an IBP prior (>= 0; 0 turns them "
                                 "off): a feature split in two, or two merged, by restricted Gibbs scans accepted by "
                                 "Metropolis-Hastings. They help the chain find features that overlap.")
    split_merge_scans: int = option(2, "Intermediate restricted Gibbs scans that set up each split-merge proposal "
                                       "(>= 0); more make proposals likelier to be accepted and cost more.")
    panel_rows: int = option(100, "Rows of X per row panel, one task each on the U side (>= 1); the panel that "
                                  "proposes new features rotates. Changing it changes the chain, not its target.")
    panel_cols: int = option(32, "Columns of X per column panel, one task each on the V side (>= 1). Changing "
                                 "it changes the chain, not its target.")
    split: str | None = split_option("entries")
    checkpoint_every: int = checkpoint_option(10, "sweeps")

    def check(self) -> None:
        self.check_selection()
        if self.likelihood not in bmf.LIKELIHOODS:
            raise UserError(f"likelihood must be one of {', '.join(bmf.LIKELIHOODS)}, got {self.likelihood!r}")
        require_counts(self, ("sweeps", "ess_steps", "ess_batch", "panel_rows", "panel_cols", "checkpoint_every"))
        for name in ("move_size", "split_merge", "split_merge_scans"):
            if getattr(self, name) < 0:
                raise UserError(f"{name} must be >= 0, got {getattr(self, name)}")
        require_counts(self, tuple(n for n in ("finite_k", "finite_l") if getattr(self, n) is not None))
        require_positive(self, ("alpha", "lam", "beta", "phi", "theta", "hyper_shape", "hyper_rate"))
        if not 0 <= self.burn_in < self.sweeps:
            raise UserError(f"burn_in must be in [0, sweeps), got {self.burn_in}")

    def priors(self, alpha: float, lam: float) -> tuple[bmf.BinaryPrior, bmf.BinaryPrior]:
        """The binary priors of U and V at concentrations alpha and lambda."""
        return bmf.BinaryPrior(alpha, self.beta, self.finite_k), bmf.BinaryPrior(lam, self.beta, self.finite_l)


def structural_candidates(config: BMFConfig) -> list[Candidate]:
    """The settings chosen on validation entries (``engine.selection``), in order of preference: the
    priors as configured (IBP on U and V by default), then finite Beta-Bernoulli priors with K = L
    features from the most to the fewest (``FEATURE_CAPS``), a cap on K+ and L+. BMF has no offsets."""
    def label(k: int | None, l: int | None) -> str:
        return "IBP priors" if k is None and l is None else f"finite K = {k}, L = {l}"

    configured = (config.finite_k, config.finite_l)
    options = [configured] + [(k, k) for k in sorted(FEATURE_CAPS, reverse=True) if (k, k) != configured]
    return [Candidate(label(k, l), {"finite_k": k, "finite_l": l}) for k, l in options]


# ----- block tasks (run where the panels are) -----

RandomKey = tuple  # (seed, purpose, sweep): with the panel, the key of a task's ``stream``


def check_task(rows: DenseRows, where: str, kind: str | None) -> str | None:
    """Why the panel's observed values do not suit the observation model, or None.

    Returned rather than raised, so the client raises it as one error without a worker's traceback log.
    """
    try:
        if kind is not None:
            check_values(kind, rows.X, where, rows.mask)
    except InputError as exc:
        return str(exc)
    return None


def panels_of(*row_panels: DenseRows) -> tuple[DenseRows, ...]:
    """Every row panel together, for the column panels to be cut from (``engine.regroup``)."""
    return row_panels


def column_panel(row_panels: tuple[DenseRows, ...], index: int, bounds: list[tuple[int, int]]) -> DenseRows:
    """Column panel ``index`` (columns ``bounds[index]`` of X) as rows of X^T (the V side's panel)."""
    c0, c1 = bounds[index]
    return DenseRows(np.vstack([p.X[:, c0:c1] for p in row_panels]).T.copy(),
                     np.vstack([p.mask[:, c0:c1] for p in row_panels]).T.copy())


def zero_sums(rows: DenseRows) -> np.ndarray:
    """A row panel's running sum of predictive means before the first retained sweep."""
    return np.zeros(rows.X.shape)


def collapsed_task(rows: DenseRows, Z: np.ndarray, panel: int, W: np.ndarray, other: np.ndarray,
                   counts_rest: np.ndarray, n_rows: int, prior: bmf.BinaryPrior, model: bmf.Observation, w0: float,
                   phi: float, key: RandomKey, move_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The designated panel's sweep (``bmf.collapsed_panel_sweep``), drawing from ``stream(*key, panel)``."""
    return bmf.collapsed_panel_sweep(rows.X, rows.mask, Z, W, other, counts_rest, n_rows, prior, model, w0, phi,
                                     stream(*key, panel), move_size)


def conditional_task(rows: DenseRows, Z: np.ndarray, panel: int, W: np.ndarray, other: np.ndarray, pi: np.ndarray,
                     active: np.ndarray, model: bmf.Observation, key: RandomKey, move_size: int) -> np.ndarray:
    """Another panel's sweep given pi (``bmf.conditional_panel_sweep``), drawing from ``stream(*key, panel)``."""
    return bmf.conditional_panel_sweep(rows.X, rows.mask, Z, W, other, pi, active, model, stream(*key, panel),
                                       move_size)


def take_rows(rows: DenseRows, local: np.ndarray) -> DenseRows:
    """The rows ``local`` of a panel (the part of a split-merge move's support it holds)."""
    return DenseRows(rows.X[local], rows.mask[local])


def stack_rows(*parts: DenseRows) -> DenseRows:
    """Rows taken from several panels, in panel order."""
    return DenseRows(np.vstack([p.X for p in parts]), np.vstack([p.mask for p in parts]))


def split_merge_task(rows: DenseRows, Z_S: np.ndarray, W_side: np.ndarray, other: np.ndarray, pair: sm.Pair,
                     support: np.ndarray, nonzero_rest: int, settings: sm.MoveSettings,
                     key: RandomKey) -> tuple[np.ndarray, np.ndarray, bool]:
    """One split-merge move on the rows of its support (``sm.move_on_rows``), drawing from ``stream(*key)``."""
    return sm.move_on_rows(rows.X, rows.mask, Z_S, W_side, other, pair, support, nonzero_rest, settings,
                           stream(*key))


def weight_stats_task(rows: DenseRows, U: np.ndarray, V: np.ndarray) -> dict:
    """The panel's statistics of the Gaussian W conditional (``bmf.weight_stats``), summed by ``engine.reduce``."""
    return bmf.weight_stats(rows.X, rows.mask, U, V)


def log_lik_task(rows: DenseRows, U: np.ndarray, Ws: np.ndarray, V: np.ndarray, model: bmf.Observation) -> np.ndarray:
    """The panel's log likelihood at each candidate W of the stack Ws (B x K x L)."""
    return np.array([bmf.log_likelihood(model.likelihood, rows.X, rows.mask, U @ W @ V.T, model.theta) for W in Ws])


def accumulate_task(total: np.ndarray, U: np.ndarray, W: np.ndarray, V: np.ndarray, likelihood: str) -> np.ndarray:
    """The running sum of the predictive means E[x | U, V, W] of a row panel's entries (paper 003, Sec. 3.4)."""
    return total + bmf.mean_of(likelihood, U @ W @ V.T)


def target_entries(source: Source, r0: int, r1: int, split: str | None, sample: EntrySample | None) -> np.ndarray:
    """The entries of rows [r0, r1) a fit is scored on: those of the validation ``sample`` that training
    could see but for the sample (observed, not held out by ``split``), or, without a sample, the
    held-out entries of ``split``."""
    if sample is None:
        return source.open().read_split_rows(split, "test_mask", r0, r1)
    seen = read_seen_chunk(source, r0, r1, split, None)
    return seen & sample.rows(r0, r1, seen.shape[1])


def target_task(rows: DenseRows, total: np.ndarray, target: np.ndarray, retained: int) -> tuple[np.ndarray, np.ndarray]:
    """A row panel's posterior predictive means and truths of its ``target`` entries (row order)."""
    return total[target] / retained, rows.X[target]


# ----- the driver -----

@dataclass
class BMFState(DriverState):
    """The client-side values of the BMF sampler (module docstring): the last sample of U (I x K+), V (J x L+)
    and W (K+ x L+), the hyperparameters, and the count of retained sweeps with K+ and L+ summed over them."""

    U: np.ndarray
    V: np.ndarray
    W: np.ndarray
    alpha: float
    lam: float
    phi: float
    theta: float
    retained: int = 0
    feature_sums: list[int] = field(default_factory=lambda: [0, 0])

    def __post_init__(self) -> None:
        self.W = np.asarray(self.W, np.float64)
        self.retained, self.feature_sums = int(self.retained), list(self.feature_sums)


class BMFDriver(StatefulDriver):
    """The BMF Gibbs sampler on the engine (module docstring; ``engine.loop.Driver``). ``validation``: an
    entry sample left out of training and scored by ``predictions`` (``engine.selection``)."""

    state_type = BMFState

    def __init__(self, config: BMFConfig, source: Source, engine: Engine, validation: EntrySample | None = None,
                 label: str = "bmf"):
        config.check()
        self.config, self.source, self.engine, self.label = config, source, engine, label
        self.validation = validation
        data = source.open()
        if data.layout != "dense":
            raise UserError(f"{source}: BMF needs a dense dataset, got layout {data.layout}")
        self.split = config.split if config.split and config.split in data.split_names() else None
        self.shape = data.shape
        self.row_bounds = row_ranges(data.n_rows, config.panel_rows)
        self.col_bounds = row_ranges(data.n_cols, config.panel_cols)
        self.rows = engine.hold(dense_blocks(engine, source, self.row_bounds, self.split, validation))
        self._check_values()
        groups = [range(len(self.row_bounds))] * len(self.col_bounds)
        self.cols = engine.hold(engine.map(column_panel, engine.regroup(panels_of, self.rows, groups),
                                           engine.indices(len(self.col_bounds)), self.col_bounds))
        self.state = BMFState(np.zeros((data.n_rows, 0), bool), np.zeros((data.n_cols, 0), bool), np.zeros((0, 0)),
                              config.alpha, config.lam, config.phi, config.theta)

    def _check_values(self) -> None:
        """Refuse observed values the observation model cannot take, naming the panel's rows."""
        where = self.engine.generate(str, [(f"{self.source} (rows {r0}-{r1 - 1})",) for r0, r1 in self.row_bounds])
        problems = self.engine.collect(self.engine.map(check_task, self.rows, where,
                                                      DATA_KINDS.get(self.config.likelihood)))
        if any(problems):
            raise InputError(next(p for p in problems if p))

    # -- state --
    @property
    def model(self) -> bmf.Observation:
        return bmf.Observation(self.config.likelihood, self.state.theta)

    @property
    def k_plus(self) -> int:
        """Features of U in the current sample."""
        return self.state.U.shape[1]

    def full(self, side: str) -> np.ndarray:
        """U (I x K+) or V (J x L+)."""
        return self.state.U if side == "u" else self.state.V

    def panels(self, side: str) -> list[np.ndarray]:
        """U or V cut into the rows of its panels."""
        return split_rows(self.full(side), self.row_bounds if side == "u" else self.col_bounds)

    def start(self) -> None:
        """U and V from their priors, W from N(w0, 1/phi) (paper 003, Sec. 4.1, initialises from the prior),
        the running sums at zero."""
        prior_u, prior_v = self.config.priors(self.state.alpha, self.state.lam)
        U = initial_features(prior_u, self.shape[0], stream(self.config.seed, "bmf-init", 0))
        V = initial_features(prior_v, self.shape[1], stream(self.config.seed, "bmf-init", 1))
        rng = stream(self.config.seed, "bmf-init", 2)
        self.state.W = self.config.w0 + rng.standard_normal((U.shape[1], V.shape[1])) / math.sqrt(self.state.phi)
        self.state.U, self.state.V = U, V
        self.engine.keep(PRED, self.engine.map(zero_sums, self.rows))

    def total_steps(self) -> int:
        return self.config.sweeps

    def finished(self, step: int, trace: list[dict]) -> bool:
        return step >= self.config.sweeps

    def step(self, step: int) -> dict:
        """One sweep: U panels, V panels, W, hyperparameters; predictions after burn-in."""
        state, cfg = self.state, self.config
        accepted = 0
        for side in ("u", "v"):
            self._update_side(side, step)
            accepted += self._split_merge(side, step)
        U_panels = self.engine.from_values(self.panels("u"))
        log_lik, stats = self._update_weights(step, U_panels)
        self._update_hyper(step, stats)
        if stats is not None:  # at the new theta
            log_lik = bmf.gaussian_log_lik(stats, state.W, state.theta)
        prior_u, prior_v = cfg.priors(state.alpha, state.lam)
        U, V = state.U, state.V
        log_joint = (log_lik + prior_u.log_prob(U) + prior_v.log_prob(V)
                     + bmf.weight_log_prior(state.W, cfg.w0, state.phi))
        retained = step >= cfg.burn_in
        if retained:
            self.engine.keep(PRED, self.engine.map(accumulate_task, self.engine.state(PRED), U_panels, state.W, V,
                                                   cfg.likelihood))
            state.retained += 1
            state.feature_sums = [state.feature_sums[0] + U.shape[1], state.feature_sums[1] + V.shape[1]]
        return {"k_plus": float(U.shape[1]), "l_plus": float(V.shape[1]), "log_lik": log_lik, "log_joint": log_joint,
                "phi": state.phi, "theta": state.theta, "alpha": state.alpha, "lam": state.lam,
                "retained": float(retained), "split_merge_accepted": float(accepted)}

    def _update_side(self, side: str, step: int) -> None:
        """Designated panel collapsed, then the other panels given pi; empty features dropped (module
        docstring, steps 1-2)."""
        engine, cfg = self.engine, self.config
        panels, Zs = (self.rows if side == "u" else self.cols), self.panels(side)
        W_side, other = (self.state.W, self.full("v")) if side == "u" else (self.state.W.T, self.full("u"))
        prior = self.config.priors(self.state.alpha, self.state.lam)[0 if side == "u" else 1]
        star = step % len(Zs)
        key = (cfg.seed, f"bmf-{side}", step)
        counts_rest = sum(Z.sum(axis=0) for Z in Zs) - Zs[star].sum(axis=0)
        [(Z_star, W_side)] = engine.collect(engine.map(collapsed_task, engine.select(panels, [star]), Zs[star], star,
                                                      W_side, other, counts_rest, self.shape[side == "v"], prior,
                                                      self.model, cfg.w0, self.state.phi, key, cfg.move_size))
        width = W_side.shape[0]
        Zs = [Z_star if q == star else np.pad(Z, ((0, 0), (0, width - Z.shape[1]))) for q, Z in enumerate(Zs)]
        Zs = self._conditional_panels(side, step, panels, Zs, star, W_side, other, prior)
        keep = sum(Z.sum(axis=0) for Z in Zs) > 0 if prior.infinite else np.ones(width, bool)
        self._set_side(side, np.vstack([Z[:, keep] for Z in Zs]), W_side[keep])

    def _set_side(self, side: str, Z: np.ndarray, W_side: np.ndarray) -> None:
        """U and W (``side`` "u"), or V and W^T, to new values."""
        if side == "u":
            self.state.U, self.state.W = Z, W_side
        else:
            self.state.V, self.state.W = Z, W_side.T

    def _split_merge(self, side: str, step: int) -> int:
        """``split_merge`` moves on one side with an IBP prior (``kernels.bmf_split_merge``); returns how many
        were accepted. The pair is drawn here from the whole binary matrix (the driver's); each move is one
        task on the rows of its support, taken from the panels holding them."""
        cfg = self.config
        prior = cfg.priors(self.state.alpha, self.state.lam)[side == "v"]
        if cfg.split_merge == 0 or not prior.infinite:
            return 0
        panels, bounds = (self.rows, self.row_bounds) if side == "u" else (self.cols, self.col_bounds)
        Z, other = self.full(side), self.full("v" if side == "u" else "u")
        W_side = self.state.W if side == "u" else self.state.W.T
        settings = sm.MoveSettings(self.shape[side == "v"], prior, self.model, cfg.w0, self.state.phi,
                                   cfg.split_merge_scans)
        accepted = 0
        for move in range(cfg.split_merge):
            pair = sm.choose_pair(Z, stream(cfg.seed, f"bmf-sm-{side}-pair", step, move))
            if pair is None:
                continue
            support = pair.support(Z)
            rows = self._support_rows(panels, bounds, support)
            [(columns, W_rows, ok)] = self.engine.collect(self.engine.map(
                split_merge_task, rows, Z[support], W_side, other, pair, support,
                int(Z.sum() - Z[:, pair.columns].sum()), settings, (cfg.seed, f"bmf-sm-{side}", step, move)))
            if ok:
                Z, W_side = sm.apply_move(Z, W_side, pair, support, columns, W_rows)
                accepted += 1
        self._set_side(side, Z, W_side)
        return accepted

    def _support_rows(self, panels: BlockSet, bounds: list[tuple[int, int]], support: np.ndarray) -> BlockSet:
        """One block: the data rows ``support`` (sorted side rows), taken from the panels that hold them."""
        needed = [q for q, (r0, r1) in enumerate(bounds) if np.any((support >= r0) & (support < r1))]
        local = [support[(support >= bounds[q][0]) & (support < bounds[q][1])] - bounds[q][0] for q in needed]
        taken = self.engine.map(take_rows, self.engine.select(panels, needed), self.engine.from_values(local))
        return self.engine.regroup(stack_rows, taken, [list(range(len(needed)))])

    def _conditional_panels(self, side: str, step: int, panels: BlockSet, Zs: list[np.ndarray], star: int,
                            W_side: np.ndarray, other: np.ndarray, prior: bmf.BinaryPrior) -> list[np.ndarray]:
        """pi_k of the features the designated panel ``star`` uses (all, for a finite prior), then every other
        panel's rows in parallel given pi (``bmf.conditional_panel_sweep``)."""
        engine, cfg = self.engine, self.config
        active = Zs[star].any(axis=0) if prior.infinite else np.ones(W_side.shape[0], bool)
        counts = sum(Z.sum(axis=0) for Z in Zs)
        pi = np.full(W_side.shape[0], 0.5)
        pi[active] = bmf.auxiliary_pi(prior, counts[active], self.shape[side == "v"],
                                      stream(cfg.seed, f"bmf-{side}-pi", step))
        others = [q for q in range(len(Zs)) if q != star]
        if not others:
            return Zs
        new = engine.collect(engine.map(conditional_task, engine.select(panels, others),
                                       engine.from_values([Zs[q] for q in others]),
                                       engine.select(engine.indices(len(Zs)), others), W_side, other, pi, active,
                                       self.model, (cfg.seed, f"bmf-{side}", step), cfg.move_size))
        return [Zs[star] if q == star else new[others.index(q)] for q in range(len(Zs))]

    def _panel_log_lik(self, U_panels: BlockSet, V: np.ndarray, Ws: np.ndarray) -> np.ndarray:
        """log p(X | U, V, W) over the observed training entries for each W of the stack Ws: one vector per
        row panel, added in panel order (one round of tasks per call; elliptical slice sampling needs a few)."""
        parts = self.engine.collect(self.engine.map(log_lik_task, self.rows, U_panels, Ws, V, self.model))
        return np.sum(parts, axis=0)

    def _update_weights(self, step: int, U_panels: BlockSet) -> tuple[float, dict | None]:
        """W | rest (module docstring, step 3); returns the new log likelihood and the Gaussian statistics."""
        state, cfg = self.state, self.config
        rng = stream(cfg.seed, "bmf-w", step)
        V = self.full("v")
        if cfg.likelihood == "gaussian":
            stats = self.engine.reduce(self.engine.map(weight_stats_task, self.rows, U_panels, V))
            if state.W.size:
                with single_threaded_blas():  # BLAS threads contend on a shared client
                    state.W = bmf.sample_gaussian_w(stats, state.theta, state.phi, cfg.w0, *state.W.shape, rng)
            return bmf.gaussian_log_lik(stats, state.W, state.theta), stats
        log_lik = partial(self._panel_log_lik, U_panels, V)
        if state.W.size == 0:
            return float(log_lik(state.W[None])[0]), None
        value = None
        for _ in range(cfg.ess_steps):
            state.W, value = bmf.elliptical_slice(state.W, cfg.w0, 1.0 / math.sqrt(state.phi), log_lik, rng, value,
                                                  cfg.ess_batch)
        return value, None

    def _update_hyper(self, step: int, stats: dict | None) -> None:
        """phi, theta, alpha, lambda from their conjugate conditionals (module docstring, step 4)."""
        state, cfg = self.state, self.config
        if not cfg.learn_hyper:
            return
        rng = stream(cfg.seed, "bmf-hyper", step)
        state.phi = bmf.sample_phi(state.W, cfg.w0, cfg.hyper_shape, cfg.hyper_rate, rng)
        if stats is not None:
            state.theta = bmf.sample_theta(bmf.residual_sum_of_squares(stats, state.W), float(stats["n_obs"]),
                                           cfg.hyper_shape, cfg.hyper_rate, rng)
        prior_u, prior_v = cfg.priors(state.alpha, state.lam)
        if prior_u.infinite:
            state.alpha = bmf.sample_concentration(prior_u, state.W.shape[0], self.shape[0], cfg.hyper_shape,
                                                   cfg.hyper_rate, rng)
        if prior_v.infinite:
            state.lam = bmf.sample_concentration(prior_v, state.W.shape[1], self.shape[1], cfg.hyper_shape,
                                                 cfg.hyper_rate, rng)

    # -- what a fit gives --
    def _check_retained(self) -> None:
        if self.state.retained == 0:
            raise UserError("no retained sweeps yet: the run stopped during burn-in (`buffet resume` it)")

    def feature_means(self) -> tuple[float, float]:
        """K+ and L+ averaged over the retained sweeps."""
        self._check_retained()
        sums, retained = self.state.feature_sums, self.state.retained
        return sums[0] / retained, sums[1] / retained

    def predictive_mean(self) -> np.ndarray:
        """E[x_ij | X] averaged over the retained sweeps, every entry (I x J)."""
        self._check_retained()
        return np.vstack(self.engine.collect(self.engine.state(PRED))) / self.state.retained

    def predictions(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior predictive means and truths of every target entry (row order): the validation entries
        of a fit given ``validation``, else the held-out entries of the split."""
        if not self.split and self.validation is None:
            raise UserError(f"{self.source}: no held-out entries to evaluate (ingest with --holdout)")
        self._check_retained()
        engine = self.engine
        targets = engine.generate(target_entries, [(self.source.part(r0, r1), r0, r1, self.split,
                                                    self.validation) for r0, r1 in self.row_bounds])
        parts = engine.collect(engine.map(target_task, self.rows, engine.state(PRED), targets, self.state.retained))
        return np.concatenate([p for p, _ in parts]), np.concatenate([t for _, t in parts])


def split_rows(A: np.ndarray, bounds: list[tuple[int, int]]) -> list[np.ndarray]:
    return [A[r0:r1] for r0, r1 in bounds]


def initial_features(prior: bmf.BinaryPrior, n_rows: int, rng: np.random.Generator) -> np.ndarray:
    """A start for one side: a draw from the IBP (beta = 1 form, ``ibp_prior.sample_ibp``) or from the finite prior."""
    if prior.infinite:
        block = sample_ibp(n_rows, prior.alpha, rng)
        return block.Z[0][:, :block.n_features[0]]
    return rng.random((n_rows, prior.k)) < rng.beta(prior.a(), prior.beta, size=prior.k)
