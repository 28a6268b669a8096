"""Time ``kernels.bnmf.local_step`` on one 1000-document NYT-shaped chunk with K = 100,
for the working-tree kernel and (optionally) the kernel of a git revision, in CPU seconds
of one thread (robust to other load on a shared host).

    python benchmarks/profile_local_step.py STORE [--baseline HEAD] [--profile]

Topics: the q(beta) reached after 20 SVI minibatches of 1000 documents on STORE (computed
in-process once and cached next to the store as ``.profile_topics.npz``), plus the random
start of a fit. Each kernel is timed in a fresh subprocess with OPENBLAS_NUM_THREADS=1,
once plainly and once with MALLOC_TRIM_THRESHOLD_=65536, the setting Dask's nanny gives
its workers (distributed.nanny.pre-spawn-environ).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import importlib.util, json, sys, time
import numpy as np
from buffet.data.store import Dataset
spec = importlib.util.spec_from_file_location("kernel_under_test", sys.argv[1])
m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m)
topics = np.load(sys.argv[2]); store = sys.argv[3]; profile = sys.argv[4] == "1"
rows = Dataset(store).read_rows(0, 1000)
V, K = topics["g"].shape
hyper = m.Hyper.paper_defaults(V, K)
out = {}
for name in ("start", "step20"):
    view = m.TopicView.from_params(topics["g_" + name] if name == "start" else topics["g"],
                                   topics["h_" + name] if name == "start" else topics["h"])
    best = None
    for _ in range(3):
        c0 = time.process_time()
        res = m.local_step(rows.indptr, rows.indices, rows.data, view, hyper)
        dt = time.process_time() - c0
        best = dt if best is None else min(best, dt)
    out[name] = {"cpu_seconds": best, "docs_per_cpu_second": 1000 / best,
                 "mean_sweeps": float(res.sweeps.mean()),
                 "us_per_doc_sweep": best / res.sweeps.sum() * 1e6}
if profile:
    import cProfile, pstats, io
    pr = cProfile.Profile(); pr.enable()
    m.local_step(rows.indptr, rows.indices, rows.data, view, hyper)
    pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(8)
    print(s.getvalue(), file=sys.stderr)
print(json.dumps(out))
'''


def topics_for(store: str) -> Path:
    path = Path(store) / ".profile_topics.npz"
    if path.exists():
        return path
    import numpy as np
    from buffet.kernels import bnmf
    from buffet.pipeline.engine.dataset import source_of
    from buffet.pipeline.engine.process_executor import ProcessEngine
    from buffet.pipeline.models.bnmf import BNMFConfig
    from buffet.pipeline.reports.bnmf import make_driver

    drv = make_driver(BNMFConfig(n_topics=100, batch_size=1000, chunk_rows=500), source_of(store), ProcessEngine())
    drv.eval_rows = None  # no held-out scoring on the way
    drv.start()
    g0, h0 = drv.state.g.copy(), drv.state.h.copy()
    for s in range(20):
        drv.step(s)
    assert isinstance(drv.model.hyper, bnmf.Hyper)
    np.savez(path, g=drv.state.g, h=drv.state.h, g_start=g0, h_start=h0)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--baseline", default=None, help="git revision whose kernels/bnmf.py to time as well")
    p.add_argument("--profile", action="store_true", help="print a cProfile of the working-tree kernel")
    args = p.parse_args()
    repo = Path(__file__).resolve().parent.parent
    topics = topics_for(args.store)
    kernels = {"working tree": repo / "kernels" / "bnmf.py"}
    tmp = tempfile.TemporaryDirectory()
    if args.baseline:
        old = Path(tmp.name) / "bnmf_baseline.py"
        old.write_text(subprocess.run(["git", "-C", str(repo), "show", f"{args.baseline}:kernels/bnmf.py"],
                                      check=True, capture_output=True, text=True).stdout)
        kernels[f"git {args.baseline}"] = old
    child = Path(tmp.name) / "child.py"
    child.write_text(CHILD)
    for label, path in kernels.items():
        for trim in (None, "65536"):
            env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
            env.pop("MALLOC_TRIM_THRESHOLD_", None)
            if trim:
                env["MALLOC_TRIM_THRESHOLD_"] = trim
            prof = "1" if args.profile and label == "working tree" and trim is None else "0"
            r = subprocess.run([sys.executable, str(child), str(path), str(topics), args.store, prof],
                               env=env, capture_output=True, text=True, check=True)
            if prof == "1":
                print(r.stderr)
            res = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{label:14s} MALLOC_TRIM_THRESHOLD_={trim or 'unset':6s} "
                  + "  ".join(f"{k}: {v['cpu_seconds']:.3f} cpu-s ({v['docs_per_cpu_second']:.0f} docs/cpu-s, "
                              f"{v['mean_sweeps']:.1f} sweeps, {v['us_per_doc_sweep']:.2f} us/doc-sweep)"
                              for k, v in res.items()))


if __name__ == "__main__":
    main()
