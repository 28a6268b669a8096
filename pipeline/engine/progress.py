"""Progress lines for long fits: one line per recorded step on stderr."""

from __future__ import annotations

import sys
import time


class Progress:
    """Prints ``[model] step i/n  key=value ...  elapsed`` lines; silent when ``quiet``."""

    def __init__(self, label: str, total: int | None, quiet: bool = False):
        self.label, self.total, self.quiet = label, total, quiet
        self.start = time.perf_counter()

    def update(self, step: int, record: dict) -> None:
        if self.quiet:
            return
        shown = "  ".join(f"{k}={_fmt(v)}" for k, v in record.items() if k not in ("step", "seconds"))
        total = f"/{self.total}" if self.total else ""
        print(f"[{self.label}] step {step}{total}  {shown}  {time.perf_counter() - self.start:.1f}s",
              file=sys.stderr, flush=True)


def _fmt(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
