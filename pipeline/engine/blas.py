"""BLAS thread pools: one thread wherever block tasks run, so every block's arithmetic is the same
whether it runs in this process, on a thread worker or on a worker process (SPEC 2: same numbers on
any workers). A multi-threaded BLAS splits long dot products across threads and sums the parts in
another order, which moves results in their last digit."""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threadpoolctl


@functools.lru_cache(maxsize=1)
def blas_controller() -> "threadpoolctl.ThreadpoolController":
    """This process's BLAS thread pools, inspected once (``threadpool_limits`` re-inspects them at every call)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def single_threaded_blas() -> contextlib.AbstractContextManager:
    """BLAS limited to one thread in this process while block tasks run, as Dask's nannies do for
    worker processes (OMP/OPENBLAS/MKL_NUM_THREADS=1); two task threads each calling a BLAS that
    starts threads of its own would also oversubscribe the cores."""
    return blas_controller().limit(limits=1, user_api="blas")
