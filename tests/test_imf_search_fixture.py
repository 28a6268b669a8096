"""The IMF/INMF K+ search gives, bit for bit, what ``tests/data/imf_search.npz`` holds (written by
``tests/data/imf_search_fixture.py``) on a small planted matrix in row blocks: the evidence of every step,
E[Z] and the driver's values at the end. A fit restored part-way through a growth step, from a checkpoint
of that file or of this code, continues to the same end."""

import sys
from pathlib import Path

import numpy as np
import pytest

from buffet.pipeline.engine import codec
from buffet.pipeline.engine.loop import Position, run_loop

sys.path.insert(0, str(Path(__file__).with_name("data")))
from imf_search_fixture import MODELS, OUT, STOP_AFTER, driver, unflat  # noqa: E402


@pytest.fixture(scope="module")
def stored() -> dict[str, np.ndarray]:
    return dict(np.load(OUT))


def assert_identical(value, expected, where: str = "globals") -> None:
    """Equal values of the same structure, arrays bit for bit (NaN equal to NaN)."""
    if isinstance(expected, dict):
        assert set(value) == set(expected), where
        for key in expected:
            assert_identical(value[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(value) == len(expected), where
        for i, (v, e) in enumerate(zip(value, expected)):
            assert_identical(v, e, f"{where}.{i}")
    else:
        np.testing.assert_array_equal(value, expected, err_msg=where, strict=True)


def assert_ends_as_stored(fitted, end: Position, stored: dict[str, np.ndarray], name: str) -> None:
    """The trace's evidence, E[Z] and the values of the search that decide the result, as stored."""
    np.testing.assert_array_equal(np.array([r["evidence"] for r in end.trace]), stored[f"{name}/evidence"])
    np.testing.assert_array_equal(fitted.expected_z(), stored[f"{name}/z"])
    expected, values = unflat(stored, f"{name}/globals"), fitted.global_arrays()
    for key in ("post", "stats", "best", "history", "failures", "done"):
        assert_identical(values[key], expected[key], key)


@pytest.mark.parametrize("name", MODELS)
def test_the_search_ends_as_stored(stored, name):
    fitted = driver(name)
    fitted.start()
    end = run_loop(fitted, None, Position(), checkpoint_every=10 ** 6, quiet=True)
    assert_ends_as_stored(fitted, end, stored, name)


@pytest.mark.parametrize("written_by", ["fixture", "this code"])
@pytest.mark.parametrize("name", MODELS)
def test_a_checkpoint_inside_a_growth_step_continues_to_the_stored_end(stored, name, written_by):
    """The checkpoint's globals and named states go through ``engine.codec`` as a run folder's would."""
    if written_by == "fixture":
        step, trace = int(stored[f"{name}/checkpoint/step"]), unflat(stored, f"{name}/checkpoint/trace")
        globals_, states = unflat(stored, f"{name}/checkpoint/globals"), unflat(stored, f"{name}/checkpoint/states")
    else:
        part = driver(name)
        part.start()
        stopped = run_loop(part, None, Position(), checkpoint_every=10 ** 6, stop_after=STOP_AFTER[name], quiet=True)
        step, trace = stopped.step, stopped.trace
        globals_ = codec.from_arrays(codec.to_arrays(part.global_arrays()))
        states = {state: part.engine.collect(blocks) for state, blocks in part.engine.states.items()}
    assert {"base_nu", "leader_nu", "best_nu"} <= set(states)  # part-way through a growth step
    resumed = driver(name)
    resumed.set_globals(globals_)
    resumed.engine.states = {state: resumed.engine.from_values(blocks) for state, blocks in states.items()}
    end = run_loop(resumed, None, Position(step, trace), checkpoint_every=10 ** 6, quiet=True)
    assert_ends_as_stored(resumed, end, stored, name)
