"""The IMF/INMF K+ search gives what ``tests/data/imf_search.npz`` holds (written by
``tests/data/imf_search_fixture.py``) on a small planted matrix in row blocks: the same steps and the same
decisions (every integer and flag exactly), and the evidence of every step, E[Z] and the driver's values at
the end to ``RTOL`` of each array's largest magnitude. A fit restored part-way through a growth step, from a
checkpoint of that file or of this code, continues to the same end.

The file was written on another CPU: BLAS kernels chosen for the processor (AVX2 or AVX-512) round sums in
another order, which moves the evidence by a few parts in 1e15 on the same path (measured: at most 3.1e-15
relative). ``RTOL`` allows a million times that, and still fails any change of the search itself."""

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


RTOL = 1e-9  # of each float array's largest magnitude (module docstring)


def assert_same_array(value, expected, where: str) -> None:
    """Integers and flags exactly; floats within ``RTOL`` of the array's largest magnitude (NaN equal to NaN)."""
    value, expected = np.asarray(value), np.asarray(expected)
    assert value.dtype == expected.dtype and value.shape == expected.shape, where
    if np.issubdtype(expected.dtype, np.floating):
        scale = np.nanmax(np.abs(expected), initial=0.0)
        np.testing.assert_allclose(value, expected, rtol=RTOL, atol=RTOL * scale, err_msg=where)
    else:
        np.testing.assert_array_equal(value, expected, err_msg=where, strict=True)


def assert_identical(value, expected, where: str = "globals") -> None:
    """Values of the same structure, their arrays as ``assert_same_array`` compares them."""
    if isinstance(expected, dict):
        assert set(value) == set(expected), where
        for key in expected:
            assert_identical(value[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(value) == len(expected), where
        for i, (v, e) in enumerate(zip(value, expected)):
            assert_identical(v, e, f"{where}.{i}")
    else:
        assert_same_array(value, expected, where)


def assert_ends_as_stored(fitted, end: Position, stored: dict[str, np.ndarray], name: str) -> None:
    """The trace's evidence, E[Z] and the values of the search that decide the result, as stored."""
    assert_same_array(np.array([r["evidence"] for r in end.trace]), stored[f"{name}/evidence"], "evidence")
    assert_same_array(fitted.expected_z(), stored[f"{name}/z"], "E[Z]")
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
