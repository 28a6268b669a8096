"""Markdown tables for benchmarks/README.md from results.jsonl."""
import json
import sys
from pathlib import Path

path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results.jsonl")
rows = [json.loads(line) for line in path.read_text().splitlines()]


def name(r):
    if r["system"] == "buffet":
        return "buffet (float32 sweeps)" if r.get("float32_view") or r.get("precision") == "float32" else "buffet (float64)"
    if r["system"] == "gensim":
        return f"gensim {r['gensim_class']}" + (f"(workers={r['workers']})" if r["workers"] else "")
    return f"scikit-learn (n_jobs={r['workers']})"


for tag in ("speed", "quality"):
    print(f"\n{tag}:\n")
    print("| finished | system | pass s | docs/s | CPU-s (own tree) | foreign load (cores) | peak MB | held-out ll/word |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["bench"] == "bnmf_vs_lda" and r["tag"] == tag and "foreign_load_cores" in r:
            print(f"| {r['time'][11:16]} | {name(r)} | {r['seconds']:.1f} | {r['docs_per_second']:.0f} | "
                  f"{r['cpu_seconds']:.1f} | {r['foreign_load_cores']:.2f} | {r['peak_rss_mb']:.0f} | {r['heldout_ll']:.4f} |")
print("\nscale:\n")
print("| docs | stage | wall s | peak MB (summed tree) | notes |")
print("|---:|---|---:|---:|---|")
for r in rows:
    if r["bench"] == "bnmf_scale":
        note = ""
        if r["stage"] == "fit":
            note = (f"{r['steps']} minibatches, {r['docs_seen']} docs, driver {r['driver_seconds']:.0f} s = "
                    f"{r['docs_per_second_driver']:.0f} docs/s, held-out ll {r['heldout_ll']:.4f}")
        if r["stage"] == "ingest":
            note = f"docword {r['docword_bytes'] / 1e9:.2f} GB"
        print(f"| {r['docs']} | {r['stage']} | {r['seconds']:.1f} | {r['peak_rss_mb']:.0f} | {note} |")
