"""Randomness for a run: one SeedSequence, spawned per purpose and step, so a fit gives the same numbers
whatever the workers and the chunking.

Every random draw of a fit comes from ``stream(seed, purpose, *key)``, a generator that
depends only on the run's seed and on the logical position (iteration, pass, block of rows),
never on the number of workers or on the order in which tasks happen to run.
"""

from __future__ import annotations

import zlib

import numpy as np


def stream(seed: int, purpose: str, *key: int) -> np.random.Generator:
    """A generator for ``purpose`` (e.g. "init", "order") at logical position ``key``."""
    tag = zlib.crc32(purpose.encode())
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(tag, *key)))
