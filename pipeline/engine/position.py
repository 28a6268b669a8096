"""Where a fit is, as the loop (``engine.loop``) advances it and a checkpoint (``engine.checkpoints``) restores it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Position:
    """Where a fit is: the steps done, the trace so far, the seconds spent before this process started."""

    step: int = 0
    trace: list[dict] = field(default_factory=list)
    seconds: float = 0.0
