"""BLAS thread pools: one thread wherever block tasks run, so every block's arithmetic is the same
whether it runs in this process, on a thread worker or on a worker process (a run gives the same numbers on
any workers). A multi-threaded BLAS splits long dot products across threads and sums the parts in
another order, which moves results in their last digit."""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import threadpoolctl


_lock = threading.Lock()
_depth = 0  # how many single_threaded_blas contexts are open in this process


@functools.lru_cache(maxsize=1)
def blas_controller() -> "threadpoolctl.ThreadpoolController":
    """This process's BLAS thread pools, inspected once (``threadpool_limits`` re-inspects them at every call)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """BLAS limited to one thread in this process while block tasks run, as Dask's nannies do for
    worker processes (OMP/OPENBLAS/MKL_NUM_THREADS=1); two task threads each calling a BLAS that
    starts threads of its own would also oversubscribe the cores. Nested uses cost nothing: only the
    outermost one sets and restores the limit (the in-process executor enters it around every block task,
    and a command around all of its work)."""
    global _depth
    with _lock:
        _depth += 1
        limiter = blas_controller().limit(limits=1, user_api="blas") if _depth == 1 else None
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if limiter is not None:
                limiter.restore_original_limits()
