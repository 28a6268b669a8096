"""Progress lines for long fits: one line per recorded step, through the ``buffet.progress`` logger."""

from __future__ import annotations

import time

from buffet.pipeline.engine.messages import logger

log = logger("progress")


class Progress:
    """Logs ``[model] step i/n  key=value ...  elapsed`` at INFO for every step; silent when ``quiet``."""

    def __init__(self, label: str, total: int | None, quiet: bool = False):
        self.label, self.total, self.quiet = label, total, quiet
        self.start = time.perf_counter()

    def update(self, step: int, record: dict) -> None:
        if self.quiet:
            return
        shown = "  ".join(f"{k}={_fmt(v)}" for k, v in record.items() if k not in ("step", "seconds"))
        total = f"/{self.total}" if self.total else ""
        log.info("[%s] step %d%s  %s  %.1fs", self.label, step, total, shown, time.perf_counter() - self.start)


def _fmt(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
