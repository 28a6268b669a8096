"""INMF's choice of the cap on K+ and offsets on a panel of generated role matrices, judged by the worst case.

The panel: users x permissions matrices with planted roles (each role a set of permissions, each user
holding 1-3 roles, an optional base role most users hold, then flip noise), stored permissions x users as
``buffet ingest pairs --transpose`` stores the real ones. ``PANEL`` lists every member's shape, density
target, role count, noise and seed; its ``half`` says whether a member tunes the rule ("tuning") or only
checks it ("held-back"). Domino and Firewall (``buffet.data.bundled``) are a further check.

For each member and split seed (the held-out entries of ``buffet ingest --holdout 0.2 --seed S``,
``data.splits.holdout_entries``), ``scores`` fits INMF once per offsets setting under the widest cap on
the training entries (held-out AUC of every candidate, the lower caps read off that fit as
``engine.selection`` does) and once per offsets setting and validation fold (the validation AUC of every
candidate). A selection rule is then a function of the fold scores, so every rule is judged on the same
fits: ``table`` applies each rule of ``RULES`` and prints, per member, the held-out AUC of the candidate
it picks (mean over splits) and its shortfall against the best rule on that member.

    OMP_NUM_THREADS=1 python benchmarks/role_panel.py scores --out /tmp/panel.jsonl [--members T1 T2] [--seeds 0 1 2]
    python benchmarks/role_panel.py table /tmp/panel.jsonl [--compare OLD_RULE NEW_RULE]
"""

from __future__ import annotations

import sys
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from buffet.data.arrays import from_array
from buffet.data.bundled import rolemining_path
from buffet.data.splits import add_split, holdout_entries
from buffet.kernels.metrics import auc
from buffet.pipeline.engine.dataset import Source, source_of
from buffet.pipeline.engine.loop import Position, run_loop
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.selection import fit_fold, one_standard_error_choice, validation_folds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import panel_commands
from buffet.pipeline.models.imf import IMFDriver, INMFConfig, structural_candidates
from buffet.pipeline.registry import spec_for

FOLDS = 5  # validation folds scored; a rule on fewer folds uses the first ones (the folds of 3 x 0.2 are these)
FRACTION = 0.2


@dataclass(frozen=True)
class Member:
    """A generated role matrix: ``rows`` permissions x ``cols`` users, ``roles`` planted roles whose
    permission sets give about ``density`` ones, a base role held by most users when ``base`` > 0 (the
    fraction of permissions in it), flip noise ``noise``, drawn from ``seed``."""

    name: str
    half: str
    rows: int
    cols: int
    density: float
    roles: int
    noise: float
    base: float
    seed: int


PANEL = [
    Member("T1", "tuning", 46, 46, 0.70, 6, 0.01, 0.3, 11),
    Member("T2", "tuning", 30, 60, 0.60, 5, 0.02, 0.2, 12),
    Member("T3", "tuning", 231, 79, 0.04, 12, 0.005, 0.0, 13),
    Member("T4", "tuning", 80, 40, 0.50, 8, 0.03, 0.1, 14),
    Member("T5", "tuning", 250, 120, 0.12, 15, 0.01, 0.05, 15),
    Member("T6", "tuning", 46, 46, 0.70, 14, 0.0, 0.4, 16),
    Member("H1", "held-back", 60, 30, 0.75, 5, 0.01, 0.4, 21),
    Member("H2", "held-back", 40, 40, 0.55, 7, 0.03, 0.1, 22),
    Member("H3", "held-back", 200, 100, 0.05, 10, 0.005, 0.0, 23),
    Member("H4", "held-back", 50, 80, 0.80, 4, 0.01, 0.5, 24),
    Member("H5", "held-back", 300, 150, 0.10, 18, 0.01, 0.05, 25),
    Member("H6", "held-back", 50, 40, 0.65, 12, 0.002, 0.3, 26),
]
REAL = {"Domino": "domino.txt", "Firewall": "fire1.txt"}


def role_matrix(m: Member) -> np.ndarray:
    """The member's binary matrix, permissions x users (module docstring). Role sizes vary (a Beta draw per
    role), scaled so that users holding two roles see about the target density outside the base role."""
    rng = np.random.default_rng(m.seed)
    users, perms = m.cols, m.rows
    base = rng.random(perms) < m.base
    rest = max(m.density - m.base, 0.01) / max(1.0 - m.base, 0.01)
    per_role = 1.0 - np.sqrt(1.0 - min(rest, 0.95))  # two roles of this size cover ``rest``
    sizes = np.clip(rng.beta(2.0, 2.0, m.roles) * 2.0 * per_role, 0.01, 0.95)
    roles = rng.random((m.roles, perms)) < sizes[:, None]
    held = np.zeros((users, m.roles), dtype=bool)
    for u in range(users):
        held[u, rng.choice(m.roles, size=rng.integers(1, 4), replace=False)] = True
    x = (held.astype(float) @ roles.astype(float)) > 0
    x |= (rng.random(users) < 0.9)[:, None] & base[None, :]
    flips = rng.random(x.shape) < m.noise
    return (x ^ flips).T.astype(np.float64)


def real_matrix(file: str) -> np.ndarray:
    """A shipped role-mining matrix, permissions x users (``buffet ingest pairs --transpose``)."""
    pairs = np.loadtxt(rolemining_path(file), dtype=np.int64) - 1
    x = np.zeros((pairs[:, 1].max() + 1, pairs[:, 0].max() + 1))
    x[pairs[:, 1], pairs[:, 0]] = 1.0
    return x


def heldout_aucs(config: INMFConfig, source: Source, caps: list[int]) -> list[float]:
    """Held-out AUC of the fit under ``config`` and of the fits under each lower cap in ``caps`` (read off it)."""
    driver = IMFDriver(config, source, ProcessEngine())
    driver.watch_caps(caps)
    driver.start()
    run_loop(driver, None, Position(), config.checkpoint_every, quiet=True)
    own = auc(*driver.predictions())
    return [own] + [auc(*driver.fits_at_caps[c][:2]) if c in driver.fits_at_caps else own for c in caps]


def member_scores(name: str, x: np.ndarray, seed: int, workdir: Path) -> dict:
    """Held-out AUC and validation AUC per fold of every candidate on one split of ``x``."""
    store = workdir / f"{name}-{seed}.zarr"
    ds = from_array(x, store, "binary", overwrite=True)
    add_split(ds, "heldout", {"test_mask": holdout_entries(np.ones(x.shape, bool), 0.2, seed)}, {"kind": "entries"})
    source = source_of(store)
    base = INMFConfig(select="validation", validation_folds=FOLDS, validation_fraction=FRACTION)
    candidates = structural_candidates(base)
    widest = [c for c in candidates if c.settings["max_k"] == base.max_k]
    heldout: dict[str, float] = {}
    fold_scores: dict[str, list[float]] = {c.label: [] for c in candidates}
    k_plus: dict[str, list[int]] = {c.label: [] for c in candidates}
    start = time.perf_counter()
    for top in widest:
        family = [c for c in candidates if c.same_but_cap(top) or c is top]
        caps = [c.settings["max_k"] for c in family[1:]]
        for c, value in zip(family, heldout_aucs(top.config(base), source, caps)):
            heldout[c.label] = value
        for fold in validation_folds(base):
            for c, result in zip(family, fit_fold(top.config(base), spec_for("inmf").make_driver, source, fold,
                                                  "binary", caps)):
                fold_scores[c.label].append(result.score)
                k_plus[c.label].append(result.k_plus)
    return {"member": name, "seed": seed, "shape": list(x.shape), "density": float(x.mean()),
            "labels": [c.label for c in candidates], "heldout": heldout, "fold_scores": fold_scores,
            "k_plus": k_plus, "seconds": round(time.perf_counter() - start, 1)}


# ----- selection rules: (labels in preference order, fold scores per label) -> chosen label -----

Rule = Callable[[list[str], dict[str, list[float]]], str]


def records(labels: list[str], scores: dict[str, list[float]], folds: int) -> list[dict]:
    """The candidates' records on the first ``folds`` folds as ``one_standard_error_choice`` reads them."""
    return [{"score": float(np.mean(scores[l][:folds])), "fold_scores": scores[l][:folds]} for l in labels]


def one_standard_error(folds: int) -> Rule:
    """``one_standard_error_choice`` on the first ``folds`` folds, candidates in the model's order."""
    return lambda labels, scores: labels[one_standard_error_choice(records(labels, scores, folds))[0]]


def paired(folds: int, width: float = 1.0) -> Rule:
    """The first candidate (model's order) whose fold-by-fold shortfall against the best mean is within
    ``width`` standard errors of the paired differences (the folds are shared, so their noise cancels)."""
    def rule(labels: list[str], scores: dict[str, list[float]]) -> str:
        s = np.array([scores[l][:folds] for l in labels])
        best = int(np.argmax(s.mean(axis=1)))
        for i in range(len(labels)):
            d = s[best] - s[i]
            if d.mean() <= width * d.std(ddof=1) / np.sqrt(folds):
                return labels[i]
        return labels[best]
    return rule


def default_unless_beaten(folds: int) -> Rule:
    """The first candidate (the default) unless another beats it on every fold; then the best mean."""
    def rule(labels: list[str], scores: dict[str, list[float]]) -> str:
        s = np.array([scores[l][:folds] for l in labels])
        best = int(np.argmax(s.mean(axis=1)))
        return labels[best] if (s[best] > s[0]).all() else labels[0]
    return rule


def best_mean(folds: int) -> Rule:
    """The candidate with the best mean score over the first ``folds`` folds."""
    return lambda labels, scores: max(labels, key=lambda l: np.mean(scores[l][:folds]))


RULES: dict[str, Rule] = {
    "none": lambda labels, scores: labels[0],
    "today (3 folds, 1 SE)": one_standard_error(3),
    "5 folds, 1 SE": one_standard_error(5),
    "3 folds, paired 1 SE": paired(3),
    "5 folds, paired 1 SE": paired(5),
    "5 folds, paired 2 SE": paired(5, 2.0),
    "5 folds, default unless beaten on all": default_unless_beaten(5),
    "5 folds, best mean": best_mean(5),
}


def half_of(member: str) -> str:
    """A member's half of the panel; the shipped matrices are "real"."""
    return next((m.half for m in PANEL if m.name == member), "real")


def table(rows: list[dict], half: str) -> str:
    """Per member of ``half``: each rule's mean held-out AUC over splits, and each rule's worst shortfall
    against the best rule on a member."""
    members = sorted({r["member"] for r in rows if half_of(r["member"]) == half})
    names = list(RULES)
    lines = [f"**{half}**", "", "| member | shape | ones | " + " | ".join(names) + " |",
             "|---" * (len(names) + 3) + "|"]
    worst = {n: 0.0 for n in names}
    for member in members:
        runs = [r for r in rows if r["member"] == member]
        means = {n: float(np.mean([r["heldout"][RULES[n](r["labels"], r["fold_scores"])] for r in runs]))
                 for n in names}
        top = max(means.values())
        for n in names:
            worst[n] = max(worst[n], top - means[n])
        shape = "x".join(map(str, runs[0]["shape"]))
        lines.append(f"| {member} ({len(runs)} splits) | {shape} | {runs[0]['density']:.2f} | "
                     + " | ".join(f"{means[n]:.4f}" for n in names) + " |")
    lines.append("| worst shortfall | | | " + " | ".join(f"{worst[n]:.4f}" for n in names) + " |")
    return "\n".join(lines)


def differences(rows: list[dict], old: str, new: str) -> list[str]:
    """The splits where rules ``old`` and ``new`` choose differently: the choices and their held-out AUCs."""
    out = []
    for r in rows:
        a, b = RULES[old](r["labels"], r["fold_scores"]), RULES[new](r["labels"], r["fold_scores"])
        if a != b:
            out.append(f"- {r['member']} split {r['seed']}: {old} -> {a} ({r['heldout'][a]:.4f}), "
                       f"{new} -> {b} ({r['heldout'][b]:.4f})")
    return out


def main() -> None:
    parser, _, show = panel_commands(__doc__.split("\n\n")[0], [m.name for m in PANEL], [0, 1, 2])
    show.add_argument("--compare", nargs=2, default=["today (3 folds, 1 SE)", "5 folds, 1 SE"],
                      metavar=("OLD", "NEW"), help="two rules whose differing choices are listed")
    args = parser.parse_args()
    if args.command == "table":
        rows = [json.loads(line) for line in args.results.read_text().splitlines()]
        halves = [h for h in ("tuning", "held-back", "real") if any(half_of(r["member"]) == h for r in rows)]
        print("\n\n".join(table(rows, h) for h in halves))
        print("\n".join(["", f"Splits where '{args.compare[0]}' and '{args.compare[1]}' differ:",
                         *differences(rows, *args.compare)]))
        return
    panel = {m.name: m for m in PANEL}
    with tempfile.TemporaryDirectory() as work:
        for name in args.members:
            x = real_matrix(REAL[name]) if name in REAL else role_matrix(panel[name])
            for seed in args.seeds:
                record = member_scores(name, x, seed, Path(work))
                with open(args.out, "a") as f:
                    f.write(json.dumps(record) + "\n")
                print(name, seed, record["shape"], f"{record['density']:.3f}", record["seconds"], "s", flush=True)


if __name__ == "__main__":
    main()
