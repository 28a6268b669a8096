"""Print benchmarks/results.jsonl as a table (one line per run)."""
import json
import sys
from pathlib import Path

path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results.jsonl")
for line in path.read_text().splitlines():
    r = json.loads(line)
    if r["bench"] == "bnmf_vs_lda":
        print(f"{r['time']} {r['system'] + ('-f32' if r.get('float32_view') or r.get('precision') == 'float32' else ''):11s} {r.get('gensim_class', ''):12s} {r['tag']:8s} K={r['k']:<4d} "
              f"w={r['workers']} {r['seconds']:7.1f}s {r['docs_per_second']:7.0f} docs/s "
              f"peak {r['peak_rss_mb']:6.0f} MB  cpu {r.get('cpu_seconds', 0):6.1f}s "
              f"foreign {r.get('foreign_load_cores', float('nan')):.2f}  ll {r['heldout_ll']:.4f}")
    else:
        print(f"{r['time']} scale {r['docs']} {r['stage']:8s} {r['seconds']:7.1f}s peak {r['peak_rss_mb']:6.0f} MB "
              + (f"{r.get('docs_per_second_driver', 0):.0f} docs/s (driver) ll {r.get('heldout_ll')}" if r['stage'] == 'fit' else ""))
