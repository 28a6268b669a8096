"""Writes ``imf_search.npz``: what the IMF/INMF K+ search gives on a small planted matrix, for
``tests/test_imf_search_fixture.py`` to compare a fit with (to rounding: see that test).

For each model: the trace's evidence, E[Z] and the driver's globals at the end, and a checkpoint taken
part-way through a growth step (a later candidate under way): the globals and every block of every named
state, each flattened by ``engine.codec``. The committed file was written by the search as it was before
the driver's values became one typed object, so the test also checks that a checkpoint of that code
still restores and continues to the same end.

Run from the repository root: ``python tests/data/imf_search_fixture.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from buffet.data.ibp_synthetic import planted_features
from buffet.pipeline.engine import codec
from buffet.pipeline.engine.dataset import ArrayRows, source_of
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.loop import Position, run_loop
from buffet.pipeline.models.imf import IMFConfig, IMFDriver, INMFConfig

OUT = Path(__file__).with_name("imf_search.npz")
MODELS = {"imf": IMFConfig, "inmf": INMFConfig}
N_ROWS, N_COLS, N_FEATURES = 120, 10, 3
STOP_AFTER = {"imf": 60, "inmf": 60}  # steps before the checkpoint: inside a growth step, past its first candidate


def planted(name: str) -> np.ndarray:
    """The planted matrix of ``name``'s fit (nonnegative bases for INMF)."""
    return planted_features(np.random.default_rng(7), N_ROWS, N_COLS, N_FEATURES, nonnegative=name == "inmf").X


def config(name: str) -> IMFConfig:
    """Growth with two residual directions and the ICA restart per step, in row blocks of 50."""
    return MODELS[name](max_k=5, n_candidates=2, tol=1e-5, max_iter=200, chunk_rows=50, split=None, select="none")


def driver(name: str) -> IMFDriver:
    return IMFDriver(config(name), source_of(ArrayRows(planted(name))), ProcessEngine())


def flat(prefix: str, value: object) -> dict[str, np.ndarray]:
    """``value`` flattened by ``engine.codec``, its keys under ``prefix``."""
    return {f"{prefix}/{key}": array for key, array in codec.to_arrays(value).items()}


def unflat(arrays: dict[str, np.ndarray], prefix: str) -> object:
    """The value ``flat`` stored under ``prefix``."""
    start = f"{prefix}/"
    return codec.from_arrays({key[len(start):]: value for key, value in arrays.items() if key.startswith(start)})


def fixture(name: str) -> dict[str, np.ndarray]:
    """The fit of ``name`` to the end, and its checkpoint after ``STOP_AFTER`` steps."""
    whole = driver(name)
    whole.start()
    end = run_loop(whole, None, Position(), checkpoint_every=10 ** 6, quiet=True)
    part = driver(name)
    part.start()
    stopped = run_loop(part, None, Position(), checkpoint_every=10 ** 6, stop_after=STOP_AFTER[name], quiet=True)
    states = {state: part.engine.collect(blocks) for state, blocks in part.engine.states.items()}
    return {f"{name}/evidence": np.array([r["evidence"] for r in end.trace]), f"{name}/z": whole.expected_z(),
            **flat(f"{name}/globals", whole.global_arrays()),
            f"{name}/checkpoint/step": np.array(stopped.step),
            **flat(f"{name}/checkpoint/trace", stopped.trace),
            **flat(f"{name}/checkpoint/globals", part.global_arrays()),
            **flat(f"{name}/checkpoint/states", states)}


if __name__ == "__main__":
    np.savez_compressed(OUT, **{key: value for name in MODELS for key, value in fixture(name).items()})
    print(f"wrote {OUT}")
