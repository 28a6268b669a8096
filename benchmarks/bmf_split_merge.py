"""The posterior of K+ and L+ on the bars with and without BMF split-merge moves.

For each seed, the bars data of ``buffet reproduce bmf-bars`` (``data.bmf_data.bars_data``: U from
IBP(alpha = 2), V the 16 bars, a quarter of the bottom halves missing) is fitted by the BMF driver
in this process (linear-Gaussian, IBP priors on U and V, the reproduce settings alpha = 2,
lambda = 4, 50 rows per panel) once with ``--split-merge 0`` and once with ``--split-merge N``.
The retained sweeps' K+ and L+ give a 90% posterior interval (5th and 95th percentiles); the table
says whether the truth (K of the generating U, L = 16) lies inside, and counts the seeds where it
does. Same seed, same numbers: the chains are deterministic.

``--start truth`` is the oracle: every chain starts at the generating U, V, W and the true precisions
(theta = phi = 0.5) instead of a draw from the priors, so the intervals show what a sampler of this
posterior gives once it is in the right region, apart from how hard that region is to find.

    python benchmarks/bmf_split_merge.py --seeds 10 --sweeps 300 --moves 10 [--start truth]
"""

from __future__ import annotations

import argparse

import numpy as np

from buffet.data.bmf_data import BarsData, bars_data
from buffet.pipeline.engine.dataset import ArrayRows, source_of
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.models.bmf import BMFConfig, BMFDriver


def feature_trace(data: BarsData, config: BMFConfig, at_truth: bool) -> tuple[np.ndarray, np.ndarray, float]:
    """K+ and L+ of every retained sweep of one chain, and the split-merge moves accepted per sweep; the
    chain starts from the priors, or with ``at_truth`` at the generating state."""
    driver = BMFDriver(config, source_of(ArrayRows(data.X, ~data.missing)), ProcessEngine())
    driver.start()
    if at_truth:
        state = driver.state
        state.U, state.V, state.W = data.U.astype(state.U.dtype), data.V.astype(state.V.dtype), data.W.copy()
        state.theta, state.phi = TRUE_THETA, TRUE_PHI
    k, l, accepted = [], [], 0.0
    for step in range(config.sweeps):
        record = driver.step(step)
        accepted += record["split_merge_accepted"]
        if step >= config.burn_in:
            k.append(record["k_plus"])
            l.append(record["l_plus"])
    return np.array(k), np.array(l), accepted / config.sweeps


TRUE_THETA = TRUE_PHI = 0.5  # the noise and weight precisions the bars are drawn with (passed to bars_data)


def interval(values: np.ndarray) -> tuple[float, float]:
    """The 90% posterior interval of a trace: its 5th and 95th percentiles."""
    low, high = np.percentile(values, [5, 95])
    return float(low), float(high)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0, help="run seeds first-seed, ..., first-seed + seeds - 1")
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--sweeps", type=int, default=300)
    p.add_argument("--burn-in", type=int, default=None, help="default: half the sweeps")
    p.add_argument("--moves", type=int, default=10, help="split-merge moves per sweep and side when on")
    p.add_argument("--scans", type=int, default=2, help="intermediate restricted scans of a move")
    p.add_argument("--start", choices=("prior", "truth"), default="prior",
                   help="where the chains start: a draw from the priors, or the generating state (the oracle)")
    args = p.parse_args()
    burn = args.sweeps // 2 if args.burn_in is None else args.burn_in
    print("| seed | true K | K+ 90% without | K+ 90% with | true L | L+ 90% without | L+ 90% with | "
          "accepted moves per sweep |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    inside = {"without": [0, 0], "with": [0, 0]}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        data = bars_data(args.images, np.random.default_rng(seed), alpha=2.0, theta=TRUE_THETA, phi=TRUE_PHI)
        truth = (data.U.shape[1], data.V.shape[1])
        cells, rate = {}, 0.0
        for label, moves in (("without", 0), ("with", args.moves)):
            config = BMFConfig(sweeps=args.sweeps, burn_in=burn, alpha=2.0, lam=4.0, panel_rows=50, seed=seed,
                               split_merge=moves, split_merge_scans=args.scans, select="none")
            k, l, accepted = feature_trace(data, config, args.start == "truth")
            rate = accepted if moves else rate
            for side, (trace, true) in enumerate(((k, truth[0]), (l, truth[1]))):
                low, high = interval(trace)
                hit = low <= true <= high
                inside[label][side] += hit
                cells[label, side] = f"{low:g}-{high:g}{' *' if hit else ''}"
        print(f"| {seed} | {truth[0]} | {cells['without', 0]} | {cells['with', 0]} | {truth[1]} | "
              f"{cells['without', 1]} | {cells['with', 1]} | {rate:.2f} |", flush=True)
    for label, (k_in, l_in) in inside.items():
        print(f"\n{label} moves: true K inside the 90% interval in {k_in} of {args.seeds} seeds, "
              f"true L in {l_in} of {args.seeds}")


if __name__ == "__main__":
    main()
