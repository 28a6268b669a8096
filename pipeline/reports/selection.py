"""How a run's structural settings were chosen on validation entries (``engine.selection``), as a user
reads it in ``buffet evaluate`` and in a report's summary."""

from __future__ import annotations

from buffet.pipeline.engine.runstore import RunStore


def chosen(run: RunStore) -> dict:
    """``{"selected": label}`` for ``evaluate`` when the run chose its settings on validation, else ``{}``."""
    return {"selected": run.selection["chosen"]} if run.selection else {}


def summary_lines(run: RunStore) -> list[str]:
    """A markdown section with every candidate's mean and fold validation scores (none without a choice)."""
    record = run.selection
    if not record:
        return []
    lines = ["", "## Settings chosen on validation", "",
             f"{record['folds']} folds of {record['validation_fraction']:g} of the training entries "
             f"({record['entries']} validation entries in all), metric {record['metric']} (larger is better); "
             f"chosen: the first candidate within one standard error ({record['tolerance']:.4g}) of the best.",
             "", "| candidate | mean score | fold scores | K+ per fold |", "| --- | --- | --- | --- |"]
    for c in record["candidates"]:
        mark = " (chosen)" if c["label"] == record["chosen"] else ""
        folds = ", ".join(f"{v:.4f}" for v in c["fold_scores"])
        lines.append(f"| {c['label']}{mark} | {c['score']:.4f} | {folds} | {', '.join(map(str, c['k_plus']))} |")
    return lines
