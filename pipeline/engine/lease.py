"""One writer per run: the lease a fit or resume holds on its run folder while it writes there.

The lease is one small JSON object, ``RUN/lease.json``, naming its holder (a random id, the host and
the pid), the time of its last heartbeat and when it expires. It is always written whole (a file
renamed into place on disk, one PUT on an object store), so the same scheme holds on local folders and
on ``s3://`` and other fsspec stores, which have no locks and no rename.

Taking the lease: read it; a live lease of another holder refuses the command with one line naming
that holder, unless ``force``; an expired one (no heartbeat for its lifetime: the holder was killed)
is taken over with a one-line warning. Then write our own, wait twice as long as that read and write
took (at least ``MIN_SETTLE``), and read it back: a process that read the old lease at the same
moment has written its own by then, so at most one of two racing processes finds itself there; the
other refuses. While held, a daemon thread renews the heartbeat every sixth of the lifetime, and the
run store reads the lease back before every commit (a checkpoint's manifest, run.json); once either
finds another holder there (a ``--force`` took the run over) the lease is lost: the heartbeat stops
and the run store refuses every further write. Release (at the end of the command, on an error,
Ctrl-C or SIGTERM) deletes the lease if it is still ours.

The lifetime is ``DEFAULT_LIFETIME`` seconds, or the ``BUFFET_LEASE_SECONDS`` environment variable,
or the ``lifetime`` parameter. Expiry compares the holder's clock with the reader's, so the hosts
sharing a run need clocks within a fraction of the lifetime of each other (as NTP keeps them).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from buffet.data.errors import UserError
from buffet.data.urls import join, normalise, read_bytes, remove, write_bytes
from buffet.pipeline.engine.messages import before_ending, logger

LEASE_FILE = "lease.json"
LEASE_FORMAT = 1
DEFAULT_LIFETIME = 30.0  # seconds without a heartbeat after which a lease is expired
LIFETIME_VARIABLE = "BUFFET_LEASE_SECONDS"
BEATS_PER_LIFETIME = 6  # heartbeats per lifetime: a holder misses five before it loses the lease
MIN_SETTLE = 0.05  # seconds, the least wait between writing the lease and reading it back

log = logger("lease")


def lease_lifetime(given: float | None = None) -> float:
    """``given``, else ``BUFFET_LEASE_SECONDS``, else ``DEFAULT_LIFETIME``; a bad value is a ``UserError``."""
    text = os.environ.get(LIFETIME_VARIABLE)
    value = given if given is not None else (DEFAULT_LIFETIME if not text else _seconds(text))
    if not value > 0:
        raise UserError(f"the lease lifetime must be a positive number of seconds, not {value}")
    return float(value)


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{LIFETIME_VARIABLE}={text!r} is not a number of seconds") from None


@dataclass(frozen=True)
class Holder:
    """What a lease records: who holds the run and until when."""

    holder: str
    host: str
    pid: int
    heartbeat: float  # time.time() of the last renewal
    expires: float  # time.time() after which the lease may be taken over

    def expired(self, now: float) -> bool:
        return now > self.expires

    def describe(self, now: float) -> str:
        """e.g. "pid 4242 on host node7, last heartbeat 3 s ago"."""
        return f"pid {self.pid} on host {self.host}, last heartbeat {max(0.0, now - self.heartbeat):.0f} s ago"


def read_holder(run_path: str, storage_options: dict[str, Any] | None = None) -> Holder | None:
    """The lease of the run folder ``run_path`` (normalised), or None when there is none. A lease that
    cannot be parsed (not written by this format) counts as none."""
    try:
        record = json.loads(read_bytes(join(run_path, LEASE_FILE), storage_options))
        return Holder(str(record["holder"]), str(record["host"]), int(record["pid"]), float(record["heartbeat"]),
                      float(record["expires"]))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        log.warning("%s: its lease is unreadable; treating the run as not held", run_path)
        return None


def in_use(run_path: str, holder: Holder, now: float) -> UserError:
    """The one-line refusal of a run that ``holder`` holds."""
    return UserError(f"{run_path} is in use by another buffet command ({holder.describe(now)}); wait for it to "
                     f"end (if it was killed, the run is free in {max(0.0, holder.expires - now):.0f} s), or "
                     "pass --force to take the run over")


def check_free(location: str, force: bool = False, storage_options: dict[str, Any] | None = None) -> None:
    """Refuse (``UserError``) a run that a live lease holds, unless ``force``: the check a command makes
    before starting a cluster. Taking the lease (``Lease.acquire``) checks again."""
    path = normalise(location)
    holder = read_holder(path, storage_options)
    now = time.time()
    if holder is not None and not force and not holder.expired(now):
        raise in_use(path, holder, now)


class LeaseLost(UserError):
    """Another command took over the run this process was writing."""


class Lease:
    """This process's lease on one run folder: ``with Lease(path).acquired(force): ...`` holds it."""

    def __init__(self, location: str, storage_options: dict[str, Any] | None = None, lifetime: float | None = None):
        self.path = normalise(location)
        self.url = join(self.path, LEASE_FILE)
        self.storage_options = storage_options
        self.lifetime = lease_lifetime(lifetime)
        self.id = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost: str | None = None  # who took the lease from us, once a read found another in our place

    def acquire(self, force: bool = False) -> None:
        """Take the lease (see the module docstring) and start renewing it; refuse with a ``UserError``."""
        started = time.monotonic()
        current = read_holder(self.path, self.storage_options)
        now = time.time()
        if current is not None and current.holder != self.id:
            if not force and not current.expired(now):
                raise in_use(self.path, current, now)
            why = "its lease expired" if current.expired(now) else "as --force asks"
            log.warning("%s: taking the run over from %s (%s)", self.path, current.describe(now), why)
        self._write()
        time.sleep(max(MIN_SETTLE, 2 * (time.monotonic() - started)))
        found = read_holder(self.path, self.storage_options)
        if found is None:
            raise UserError(f"{self.path}: another buffet command took and released the run at the same moment; "
                            "try again")
        if found.holder != self.id:
            raise in_use(self.path, found, time.time())
        self._thread = threading.Thread(target=self._beat, name=f"buffet-lease {self.path}", daemon=True)
        self._thread.start()
        before_ending(self, self.release)  # a command ended at once still releases the run

    def release(self) -> None:
        """Stop renewing and delete the lease, unless another holder has taken it over. A store out of reach
        is a warning: the lease then expires by itself."""
        before_ending(self, None)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            found = read_holder(self.path, self.storage_options)
            if found is not None and found.holder == self.id:
                remove(self.url, self.storage_options)
        except OSError as exc:
            log.warning("%s: could not release the run's lease (%s); it expires in %.0f s", self.path, exc,
                        self.lifetime)

    def check(self) -> None:
        """Raise ``LeaseLost`` unless this process still holds the lease: read back before every commit to
        the run (a manifest, run.json), so a command that was taken over never commits again."""
        if self._lost is None:
            self._confirm(read_holder(self.path, self.storage_options))
        if self._lost is not None:
            raise LeaseLost(f"{self.path}: {self._lost}; this command stopped writing to the run")

    def _confirm(self, found: Holder | None) -> bool:
        """Whether ``found``, the lease as just read, is ours; if not, the lease is lost, and says to whom."""
        if found is not None and found.holder == self.id:
            return True
        self._lost = (f"another buffet command took the run over ({found.describe(time.time())})" if found is not None
                      else "another buffet command deleted the run's lease")
        return False

    @contextlib.contextmanager
    def acquired(self, force: bool = False) -> Iterator["Lease"]:
        """Hold the lease for a ``with`` block: taken on entry, released however the block ends (also when
        Ctrl-C comes while it is being taken; a lease that another command holds is left alone)."""
        try:
            self.acquire(force)
            yield self
        finally:
            self.release()

    def _write(self) -> None:
        now = time.time()
        record = Holder(self.id, socket.gethostname(), os.getpid(), now, now + self.lifetime)
        write_bytes(self.url, json.dumps({"buffet_lease": LEASE_FORMAT, **asdict(record)}).encode("utf-8"),
                    self.storage_options)

    def _beat(self) -> None:
        """Renew the heartbeat until released, or until another holder is found in our place."""
        while not self._stop.wait(self.lifetime / BEATS_PER_LIFETIME):
            try:
                if not self._confirm(read_holder(self.path, self.storage_options)):
                    log.warning("%s: %s; this command stops at its next write", self.path, self._lost)
                    return
                self._write()
            except Exception as exc:  # noqa: BLE001 - a store briefly out of reach: the next beat tries again
                log.warning("%s: could not renew the run's lease (%s)", self.path, exc)
