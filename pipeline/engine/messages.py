"""Messages to the person running buffet: the ``buffet`` logger (progress, notices) and the one-line
account of a failure (what happened and what to do, no traceback without ``--debug``).

Progress and notices go through ``logging`` under the ``buffet`` logger, so a library user silences
or redirects them with the standard tools; the command line attaches a plain stderr handler
(``console``). Failures a user can meet in normal use (bad input, an unreachable or lost cluster, a
full disk, a store written by a newer buffet, Ctrl-C) become one line saying what happened and what
to do (``explain``); the traceback is shown only with ``--debug``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import sys
import threading
from typing import Callable, TextIO

from buffet.data.errors import UserError

log = logging.getLogger("buffet")
log.addHandler(logging.NullHandler())  # library default: silent unless the application configures logging


def logger(part: str) -> logging.Logger:
    """The logger of one part of buffet, e.g. ``logger("progress")`` is ``buffet.progress``."""
    return log.getChild(part)


def console(level: int = logging.INFO, stream: TextIO | None = None) -> logging.Handler:
    """Send buffet's messages at ``level`` and above to ``stream`` (stderr) as bare lines; returns the
    handler so the caller can remove it."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(level)
    return handler


class ClusterLostError(UserError):
    """The Dask cluster could not finish a step: a worker died or left, or the scheduler went away."""


CONNECT_TIMED_OUT = "Timed out trying to connect"  # how distributed's OSError for an unreachable peer begins
WORKER_ADDRESS = re.compile(r"(tcp|tls|inproc|ucx|ws|wss)://\S+$")  # a Dask worker's address, e.g. tls://10.0.0.2:4000


def is_cluster_failure(exc: BaseException) -> bool:
    """True for the errors ``distributed`` raises when workers or the scheduler are lost mid-computation."""
    try:
        from distributed.client import FutureCancelledError
        from distributed.comm.core import CommClosedError
        from distributed.scheduler import KilledWorker
    except ImportError:  # distributed is a dependency; without it there is no cluster to lose
        return False
    from concurrent.futures import CancelledError

    if isinstance(exc, OSError) and str(exc).startswith(CONNECT_TIMED_OUT):
        return True  # a transfer to or from a worker that died meanwhile
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str) and \
            WORKER_ADDRESS.match(exc.args[0]):
        return True  # the scheduler's record of a worker that left: a value scattered to it as it retired
    return isinstance(exc, (FutureCancelledError, CancelledError, KilledWorker, CommClosedError))


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the command (a job scheduler ending or preempting the job, ``kill``). It is a
    ``KeyboardInterrupt`` so that it stops a fit as Ctrl-C does (the run marked interrupted, its checkpoints
    kept, the cluster closed); ``explain`` names it as what it was."""


STOP_GRACE_SECONDS = 60.0  # the longest a stopped command may take to mark its run and close its cluster


class StopRequest:
    """Ctrl-C or SIGTERM, once it reached the command. The handler (``on_signal``) raises the exception at
    once, wherever the main thread happens to be, and remembers it. Where that is a ``__del__`` method, a
    weakref callback (a Dask future released) or a garbage-collector callback (distributed's), Python cannot
    raise it and goes on (``unraisable`` keeps it from printing a traceback); a loop that calls ``check``
    between steps stops all the same. A command that has not ended ``STOP_GRACE_SECONDS``
    after the signal (its clean-up stuck), or that receives a second one, ends at once with the same status:
    what it committed (checkpoints, ``engine.runstore``) is complete either way."""

    _received: type[KeyboardInterrupt] | None = None
    _deadline: threading.Timer | None = None

    @classmethod
    def on_signal(cls, signum: int, frame: object) -> None:
        """Handler of SIGINT and SIGTERM in the ``buffet`` command."""
        stop = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        if cls._received is not None:
            end_now(stop, "a second signal came while it was stopping")
        cls._received = stop
        cls._deadline = threading.Timer(STOP_GRACE_SECONDS, end_now,
                                        (stop, f"it had not stopped {STOP_GRACE_SECONDS:g} s after the signal"))
        cls._deadline.daemon = True
        cls._deadline.start()
        raise stop()

    @classmethod
    def unraisable(cls, unraisable: sys.UnraisableHookArgs) -> None:
        """``sys.unraisablehook`` of the ``buffet`` command: the exception of a received signal, raised where
        Python cannot pass it on (a ``__del__`` method, a weakref or garbage-collector callback), is dropped
        without a word, as ``check`` raises it again; anything else goes to Python's own hook."""
        if cls._received is not None and isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        sys.__unraisablehook__(unraisable)

    @classmethod
    def check(cls) -> None:
        """Raise the exception of a signal the command received, if any."""
        if cls._received is not None:
            raise cls._received()

    @classmethod
    def forget(cls) -> None:
        """The command has ended: a later command in this process starts with no signal pending."""
        if cls._deadline is not None:
            cls._deadline.cancel()
        cls._received, cls._deadline = None, None


_BEFORE_ENDING: dict[int, Callable[[], None]] = {}  # what ``end_now`` still does, by the id of its owner
RELEASE_SECONDS = 5.0  # the most ``end_now`` waits for those actions


def before_ending(owner: object, action: Callable[[], None] | None) -> None:
    """Have ``end_now`` run ``action`` before it ends the process (a held run's lease released), or with
    None, no longer."""
    if action is None:
        _BEFORE_ENDING.pop(id(owner), None)
    else:
        _BEFORE_ENDING[id(owner)] = action


def end_now(stop: type[KeyboardInterrupt], why: str) -> None:
    """End this process at once with the status of ``stop`` (``explain``), after one line saying so and the
    ``before_ending`` actions (given ``RELEASE_SECONDS`` at most: a run's lease not released by then
    expires by itself)."""
    line, status = explain(stop(), None)
    actions = list(_BEFORE_ENDING.values())

    def release() -> None:
        for action in actions:
            with contextlib.suppress(Exception):
                action()

    releasing = threading.Thread(target=release, daemon=True)
    releasing.start()
    releasing.join(RELEASE_SECONDS)
    then = ": its checkpoints are kept, and `buffet resume RUN` continues its run" if actions else ""
    print(f"buffet: {line}; ended at once, as {why}{then}", file=sys.stderr, flush=True)
    os._exit(status)


def explain(exc: BaseException, resume_hint: str | None) -> tuple[str, int]:
    """The one line shown for ``exc`` and the exit status (1, or 130 for Ctrl-C and 143 for SIGTERM).
    ``resume_hint`` says how to continue the run the command was working on, e.g. "the run is checkpointed at
    step 40: `buffet resume runs/x`", or None when the command has no run."""
    then = f"; {resume_hint}" if resume_hint else ""
    if isinstance(exc, Terminated):
        return f"stopped by SIGTERM (a job scheduler or kill){then}", 143
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted{then}", 130
    if isinstance(exc, UserError):
        return f"{exc}{then if isinstance(exc, ClusterLostError) else ''}", 1
    if is_cluster_failure(exc):
        return f"the Dask cluster lost a worker or its scheduler mid-step ({type(exc).__name__}){then}", 1
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        where = f" writing {exc.filename}" if exc.filename else ""
        return f"no space left on the device{where}: free some space{then or ' and run the command again'}", 1
    if isinstance(exc, MemoryError):
        return (f"out of memory: use smaller blocks (--chunk-rows), fewer threads per worker, or a larger "
                f"machine{then}"), 1
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc} ({exc.filename or type(exc).__name__}){then}", 1
    return (f"unexpected error {type(exc).__name__}: {exc}{then} (run the command again with --debug to "
            f"see the traceback, and please report it)"), 1
