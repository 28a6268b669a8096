"""IMF and INMF on planted linear-Gaussian structure: does the K+ search find it?

Each draw: K features (K = 5..10, cycling with the draw), each used by a row with probability
p_k ~ U(0.2, 0.4), bases N(0, 1) for IMF and |N(0, 1)| for INMF, noise sd 0.5
(``data.ibp_synthetic.planted_features``). The engine's driver fits it in process
(``models.imf.fit_to_end``, the search of ``buffet fit imf|inmf``, max_k = K + 2, other settings at
their defaults). A draw is recovered when K+ equals K and E[Z] thresholded at 0.5 agrees with the
true Z on at least 99% of the entries after matching features (``kernels.metrics.z_agreement``).

    python benchmarks/imf_planted_recovery.py --draws 10 [--rows 5000 --cols 50] [--no-restart]

Prints one JSON line per draw and a summary line per model (recovered draws out of ``--draws``).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from buffet.data.ibp_synthetic import planted_features
from buffet.kernels.metrics import z_agreement
from buffet.pipeline.engine.dataset import ArrayRows
from buffet.pipeline.models.imf import IMFConfig, INMFConfig, fit_to_end

MODELS = {"imf": IMFConfig, "inmf": INMFConfig}
MIN_AGREEMENT = 0.99
FEATURES = (5, 6, 7, 8, 9, 10)  # K of draw i is FEATURES[i % 6]


def fit_draw(model: str, draw: int, n_rows: int, n_cols: int, restart: bool) -> dict:
    """One draw of planted data fitted by ``model``: true and learned K+, agreement and whether it is recovered."""
    k = FEATURES[draw % len(FEATURES)]
    data = planted_features(np.random.default_rng(draw), n_rows, n_cols, k, nonnegative=model == "inmf")
    config = MODELS[model](max_k=k + 2, chunk_rows=1000, split=None, select="none", restart=restart)
    driver = fit_to_end(config, ArrayRows(data.X))
    agreement = z_agreement(data.Z, driver.expected_z())
    return {"model": model, "draw": draw, "true_k": k, "k_plus": driver.k_plus, "agreement": agreement,
            "recovered": bool(driver.k_plus == k and agreement >= MIN_AGREEMENT)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=10)
    p.add_argument("--rows", type=int, default=5000)
    p.add_argument("--cols", type=int, default=50)
    p.add_argument("--models", nargs="+", choices=tuple(MODELS), default=list(MODELS))
    p.add_argument("--no-restart", action="store_true",
                   help="growth without the ICA restart candidate (IMFConfig.restart = False; the row exchanges stay)")
    args = p.parse_args()
    for model in args.models:
        rows = []
        for draw in range(args.draws):
            rows.append(fit_draw(model, draw, args.rows, args.cols, not args.no_restart))
            print(json.dumps(rows[-1]), flush=True)
        print(json.dumps({"summary": model, "rows": args.rows, "cols": args.cols, "restart": not args.no_restart,
                          "recovered": sum(r["recovered"] for r in rows), "draws": len(rows)}), flush=True)


if __name__ == "__main__":
    main()
