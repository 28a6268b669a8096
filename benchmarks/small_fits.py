"""Small fits, where the executor's per-step cost decides the wall time: every ``buffet fit`` model on the
smallest data of its reproduction, run three ways:

* ``cli``: ``buffet fit MODEL STORE`` with the defaults (``--executor auto``, which picks this process for
  such data);
* ``estimator``: the matching estimator fitted in a fresh interpreter on the same store with the same
  defaults, the fit alone timed inside it (``fit_seconds``; models without an estimator are left out);
* ``cluster``: ``buffet fit ... --executor cluster``, the embedded LocalCluster forced;

plus the command's start-up alone (``buffet fit MODEL --help``). Each line of ``--out`` (JSON) holds the wall
and CPU seconds and the peak RSS of the process tree, with host and date. The acceptance reads
``cli <= 1.5 x (estimator fit + start-up)``.

    python benchmarks/small_fits.py --workdir /tmp/small [--models inmf bnmf] [--out results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from buffet.data.arrays import from_array
from buffet.data.bmf_data import bars_data
from buffet.data.ibp_synthetic import image_data, noisy_or_data
from buffet.data.splits import add_split, holdout_entries, holdout_rows
from buffet.data.synthetic import bnmf_corpus
from common import machine, record, run_measured

ROLE_FILE = Path(__file__).resolve().parents[1] / "data" / "datasets" / "rolemining" / "domino.txt"

# model -> (store, estimator class or None): the data each reproduction starts from
MODELS = {
    "bnmf": ("corpus", "BayesianNMF"), "cnmf": ("corpus", "CorrelatedNMF"),
    "imf": ("images", "IMF"), "inmf": ("domino", "INMF"), "vfmf": ("images", None), "tvimf": ("images", None),
    "bmf": ("bars", "BinaryMF"),
    "pf-linear-gaussian": ("images", "LinearGaussianParticleFilter"), "pf-noisy-or": ("noisy_or", "NoisyORParticleFilter"),
    "gibbs-linear-gaussian": ("images", "LinearGaussianGibbs"), "gibbs-noisy-or": ("noisy_or", "NoisyORGibbs"),
}

ESTIMATOR_FIT = """
import sys, time, json
from buffet.pipeline import estimators
started = time.perf_counter()
getattr(estimators, sys.argv[1])(seed=0).fit(sys.argv[2])
print(json.dumps({"fit_seconds": time.perf_counter() - started}))
"""


def write_stores(folder: Path) -> dict[str, Path]:
    """The smallest data of each reproduction: a 400-document corpus, 100 rows of the four-image data, the
    bars (100 images), the noisy-OR data of paper 001, Sec. 5.2, and the Domino role matrix."""
    folder.mkdir(parents=True, exist_ok=True)
    stores = {name: folder / f"{name}.zarr" for name in ("corpus", "images", "bars", "noisy_or", "domino")}
    if all(p.exists() for p in stores.values()):
        return stores
    corpus = bnmf_corpus(400, 500, 10, np.random.default_rng(0), tokens_per_doc=80)
    ds = from_array(corpus.X, stores["corpus"], "counts", overwrite=True)
    add_split(ds, "heldout", {"test_rows": holdout_rows(ds.n_rows, 0.1, 0)}, {"kind": "rows"})
    for name, data, kind in (("images", image_data(np.random.default_rng(0)).X, "real"),
                             ("bars", bars_data(100, np.random.default_rng(0), alpha=2.0).X, "real"),
                             ("noisy_or", noisy_or_data(np.random.default_rng(0)).X, "binary")):
        ds = from_array(data.astype(np.float64), stores[name], kind, overwrite=True)
        add_split(ds, "heldout", {"test_mask": holdout_entries(np.ones(data.shape, bool), 0.1, 0)},
                  {"kind": "entries"})
    subprocess.run([sys.executable, "-m", "buffet.pipeline.cli", "ingest", "pairs", str(ROLE_FILE), "--transpose",
                    "--holdout", "0.2", "--out", str(stores["domino"]), "--overwrite"], check=True,
                   capture_output=True)
    return stores


def buffet(*args: object) -> list[str]:
    return [sys.executable, "-m", "buffet.pipeline.cli", *map(str, args)]


def measure(model: str, store: Path, estimator: str | None, workdir: Path) -> list[dict]:
    """The rows of one model (module docstring)."""
    rows = [{"way": "start-up", **run_measured(buffet("fit", model, "--help"))}]
    for way, extra in (("cli", []), ("cluster", ["--executor", "cluster"])):
        rows.append({"way": way, **run_measured(buffet("fit", model, store, "--out", workdir / f"{model}-{way}",
                                                       "--overwrite", "--quiet", *extra))})
    if estimator is not None:
        result = run_measured([sys.executable, "-c", ESTIMATOR_FIT, estimator, str(store)])
        result.update(json.loads(result["output_tail"].strip().splitlines()[-1]))
        rows.append({"way": "estimator", **result})
    return [{"benchmark": "small_fits", "model": model, **row, "host": platform.node(), **machine()} for row in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--out", default=None, help="JSON-lines file to append the rows to")
    args = p.parse_args()
    stores = write_stores(args.workdir / "stores")
    for model in args.models:
        store, estimator = MODELS[model]
        for row in measure(model, stores[store], estimator, args.workdir):
            record(args.out, {k: v for k, v in row.items() if k != "output_tail"})


if __name__ == "__main__":
    main()
