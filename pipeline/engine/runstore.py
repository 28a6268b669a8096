"""The run store: a folder holding a fit's parameters, checkpoints, trace and results, on a local
path or any URL fsspec reaches.

Layout::

    RUN/run.json                    model, dataset location, parameters, status (each write replaces it
                                    whole: a temporary file renamed on disk, one PUT on an object store)
    RUN/lease.json                  while a fit or resume writes the run: who it is (``engine.lease``)
    RUN/ckpt-SSSSSSSS-TOKEN/        one checkpoint of step S, under a new name every time
        globals.npz                 the client-side arrays
        state.json                  step, trace and seconds (``engine.checkpoints``)
        blocks/NAME/IIIIII.npz      block I of the named state NAME (``engine.keep``), written by the worker
                                    that holds the block (``write_block_file``)
        manifest.json               written last: every file above with its size and CRC-32, and the blocks

Nothing is overwritten in place and there is no rename, so this holds on object stores. A reader trusts
only what a manifest names: a folder without a manifest was cut short and is not a checkpoint; one whose
files do not match its manifest is skipped, with a warning, for the one before it. After each commit
all but the two newest complete checkpoints are removed.
"""

from __future__ import annotations

import contextlib
import io
import json
import posixpath
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from buffet.data.errors import StoreError, UserError
from buffet.data.store import check_format
from buffet.data.urls import (Location, exists, filesystem, is_url, join, normalise, read_bytes, remove, write_bytes,
                              writing)
from buffet.pipeline.engine.lease import LEASE_FILE, Lease
from buffet.pipeline.engine.messages import logger

RUN_FORMAT = 2  # 2: checkpoints under new names with a manifest written last
RUN_FILE = "run.json"
MANIFEST = "manifest.json"
CHECKPOINT_FORMAT = 1
KEEP = 2  # complete checkpoints kept after a commit
CRC_PIECE = 16 << 20  # bytes read at a time to check a local file's size and CRC-32

log = logger("runs")


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in JSON")


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, indent=1, default=_json_default).encode("utf-8")


@dataclass(frozen=True)
class FileRecord:
    """A file of a checkpoint: its location, size in bytes and CRC-32 (what the manifest keeps)."""

    path: str
    size: int
    crc32: int

    @classmethod
    def of(cls, path: str, data: bytes | memoryview) -> "FileRecord":
        """The record of ``data`` written at ``path``."""
        return cls(path, len(data), zlib.crc32(data))

    @classmethod
    def of_local_file(cls, path: str) -> "FileRecord":
        """The record of the local file at ``path``, read in pieces of ``CRC_PIECE`` bytes."""
        crc, size = 0, 0
        with open(path, "rb") as handle:
            while piece := handle.read(CRC_PIECE):
                crc, size = zlib.crc32(piece, crc), size + len(piece)
        return cls(path, size, crc)

    def mismatch(self, data: bytes) -> str | None:
        """What differs between ``data`` and this record, or None."""
        return self.mismatch_file(FileRecord.of(self.path, data))

    def mismatch_file(self, found: "FileRecord") -> str | None:
        """What differs between the file as ``found`` and this record, or None."""
        if found.size != self.size:
            return f"{found.size} bytes where the manifest says {self.size}"
        if found.crc32 != self.crc32:
            return "its checksum differs from the manifest's"
        return None


@dataclass
class Checkpoint:
    """A checkpoint read back: its step, client-side arrays, state, per-block files and folder. A local run's
    arrays are read from its files when asked for (``FileArrays``): ask while the run is there."""

    step: int
    globals: Mapping[str, np.ndarray]
    state: dict
    blocks: dict[str, list[FileRecord]]
    url: str


def encode_arrays(arrays: dict[str, np.ndarray]) -> memoryview:
    """Arrays as the bytes of an ``.npz`` file (no pickled objects), a view of the buffer they were written
    to rather than a copy of it: a checkpoint of a wide vocabulary's topics is hundreds of MB."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getbuffer()


def write_arrays(location: str, arrays: dict[str, np.ndarray],
                 storage_options: dict[str, Any] | None = None) -> FileRecord:
    """``arrays`` as an ``.npz`` file at ``location``, whole or not at all (``write_bytes``), and its record. On
    local disk they are saved straight into the file and the record is read back from it, so no copy of the
    file is held in memory (a wide vocabulary's topics make hundreds of MB); elsewhere one PUT of the bytes."""
    if is_url(location):
        data = encode_arrays(arrays)
        write_bytes(location, data, storage_options)
        return FileRecord.of(location, data)
    with writing(location) as handle:
        np.savez(handle, **arrays)
    return FileRecord.of_local_file(location)


def _from_npz(source: Any, where: str, take: Callable[[Any], Any]) -> Any:
    """``take`` of the ``.npz`` content ``source`` (a path or a file object) opened with NumPy (no pickled
    objects); unreadable content is a ``StoreError`` naming ``where``."""
    try:
        with np.load(source, allow_pickle=False) as npz:
            return take(npz)
    except (OSError, ValueError, EOFError, zlib.error) as exc:
        raise StoreError(f"{where}: not a readable .npz file ({exc})") from None


def decode_arrays(data: bytes, where: str) -> dict[str, np.ndarray]:
    """The arrays of ``.npz`` bytes; unreadable bytes are a ``StoreError`` naming ``where``."""
    return _from_npz(io.BytesIO(data), where, lambda npz: {k: npz[k] for k in npz.files})


class FileArrays(Mapping[str, np.ndarray]):
    """The arrays of a local ``.npz`` file, each read from the file when it is asked for: a reader that needs
    some of them (the top words need q(beta)'s shapes and rates, not the rest of a checkpoint's globals) does
    not hold the others. Unreadable content is a ``StoreError`` naming ``where``."""

    def __init__(self, path: str, where: str):
        self.path, self.where = path, where
        self._files = _from_npz(path, where, lambda npz: list(npz.files))

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._files:
            raise KeyError(key)
        return _from_npz(self.path, self.where, lambda npz: npz[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def write_block_file(url: str, arrays: dict[str, np.ndarray],
                     storage_options: dict[str, Any] | None = None) -> FileRecord:
    """Write one block's arrays to ``url`` (``CheckpointWriter.block_url``): the worker holding the block
    calls this. Returns the record the client puts in the manifest."""
    return write_arrays(url, arrays, storage_options)


def read_block_file(url: str, storage_options: dict[str, Any] | None = None,
                    expected: FileRecord | None = None) -> dict[str, np.ndarray]:
    """One block's arrays, checked against ``expected`` (from the manifest) when given."""
    try:
        data = read_bytes(url, storage_options)
    except FileNotFoundError:
        raise StoreError(f"{url}: checkpoint file is missing") from None
    problem = expected.mismatch(data) if expected is not None else None
    if problem:
        raise StoreError(f"{url}: checkpoint file is damaged ({problem})")
    return decode_arrays(data, url)


def check_file(record: FileRecord, storage_options: dict[str, Any] | None = None) -> str | None:
    """What is wrong with a checkpoint file (missing, or not what the manifest says), or None."""
    try:
        data = read_bytes(record.path, storage_options)
    except FileNotFoundError:
        return "missing"
    return record.mismatch(data)


class CheckpointWriter:
    """A checkpoint being written: a new folder ``ckpt-{step:08d}-{token}`` (names sort by step, then by
    time of writing) that no earlier checkpoint used."""

    def __init__(self, run_url: str, step: int):
        self.step = step
        self.name = f"ckpt-{step:08d}-{time.time_ns():016x}{uuid.uuid4().hex[:6]}"
        self.url = join(run_url, self.name)

    def block_url(self, name: str, index: int) -> str:
        """Where the worker holding block ``index`` of the named state writes it (``write_block_file``)."""
        return join(self.url, "blocks", name, f"{index:06d}.npz")

    def relative(self, record: FileRecord) -> str:
        """A file's path within this checkpoint's folder (as the manifest names it)."""
        prefix = self.url + "/"
        if not record.path.startswith(prefix):
            raise ValueError(f"{record.path} is not in the checkpoint folder {self.url}")
        return record.path[len(prefix):]


class Unreadable(Exception):
    """A checkpoint that cannot be used, with the reason."""


Verifier = Callable[[list[FileRecord]], list[str | None]]


class RunStore:
    """A run folder (a local path or a URL) opened for reading and writing checkpoints."""

    def __init__(self, location: Location, storage_options: dict[str, Any] | None = None):
        self.path = normalise(location)
        self.storage_options = storage_options
        try:
            raw = read_bytes(join(self.path, RUN_FILE), storage_options)
        except FileNotFoundError:
            raise StoreError(f"{self.path}: not a buffet run (no run.json)") from None
        try:
            self.meta = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"{self.path}/run.json: corrupt run description ({exc})") from None
        if not isinstance(self.meta, dict):
            raise StoreError(f"{self.path}/run.json: corrupt run description (not a JSON object)")
        check_format(self.meta.get("buffet_run"), RUN_FORMAT, self.path, "run",
                     "its checkpoints are in an old layout; fit it again with `buffet fit ... --overwrite`")
        self._current: int | None = None  # step of the checkpoint this object last read or committed
        self._unreadable: set[str] = set()  # checkpoint folders found unreadable (removed at the next commit)
        self.lease: Lease | None = None  # the lease this process holds on the run while it writes there

    @classmethod
    def create(cls, location: Location, model: str, dataset: str | None, params: dict, overwrite: bool = False,
               storage_options: dict[str, Any] | None = None, lease: Lease | None = None) -> "RunStore":
        """A new run folder; an existing run is kept unless ``overwrite`` (then replaced whole). ``lease``
        is the lease the caller holds on it (``Lease.acquired``): kept, and checked before every write."""
        path = normalise(location)
        cls.check_new(path, overwrite, storage_options)
        for name in _entries(path, storage_options):  # run.json is replaced below, so it is never missing
            if name not in (RUN_FILE, LEASE_FILE):
                remove(join(path, name), storage_options)
        write_bytes(join(path, RUN_FILE), _json_bytes({"buffet_run": RUN_FORMAT, "model": model, "dataset": dataset,
                                                       "params": params, "status": "running"}), storage_options)
        run = cls(path, storage_options)
        run.lease = lease
        return run

    @staticmethod
    def check_new(location: Location, overwrite: bool, storage_options: dict[str, Any] | None = None) -> None:
        """Refuse to create a run where one exists (unless ``overwrite``) or where other files are; a folder
        holding only a lease counts as empty."""
        path = normalise(location)
        names = set(_entries(path, storage_options)) - {LEASE_FILE}
        if names:
            if not overwrite:
                raise UserError(f"{path} already exists (pass --overwrite to replace it, or `buffet resume`)")
            if RUN_FILE not in names:
                raise UserError(f"{path} exists and is not a buffet run; refusing to replace it")

    @contextlib.contextmanager
    def owned(self, force: bool = False) -> Iterator["RunStore"]:
        """Hold the run's lease for a ``with`` block, so that this process is its only writer; a run another
        live command holds is refused unless ``force`` (``Lease.acquire``)."""
        lease = Lease(self.path, self.storage_options)
        with lease.acquired(force):
            self.lease = lease
            try:
                yield self
            finally:
                self.lease = None

    @property
    def model(self) -> str:
        return self.meta["model"]

    @property
    def params(self) -> dict:
        return self.meta["params"]

    @property
    def status(self) -> str:
        """The run's status as run.json records it, except that a run recorded as finished whose final
        checkpoint could not be read (an older one was read instead) is "interrupted": resuming it
        replays the steps since the checkpoint that was read."""
        status = self.meta["status"]
        final = self.meta.get("final_step")
        if status == "finished" and final is not None and self._current is not None and self._current != final:
            return "interrupted"
        return status

    def set_status(self, status: str) -> None:
        """Record the status; "finished" also records the step of the checkpoint this object last committed
        (or read)."""
        self.meta["status"] = status
        if status == "finished" and self._current is not None:
            self.meta["final_step"] = self._current
        self._write_meta()

    def record_selection(self, selection: dict, params: dict) -> None:
        """Keep the record of settings chosen on validation (``engine.selection``) and make the chosen
        config the run's parameters."""
        self.meta["selection"] = selection
        self.meta["params"] = params
        self._write_meta()

    @property
    def selection(self) -> dict | None:
        """The record of settings chosen on validation entries, or None."""
        return self.meta.get("selection")

    def _write_meta(self) -> None:
        self._check_owner()
        write_bytes(join(self.path, RUN_FILE), _json_bytes(self.meta), self.storage_options)

    def _check_owner(self) -> None:
        """Refuse to write when another command has taken over the lease this process held."""
        if self.lease is not None:
            self.lease.check()

    def final_checkpoint_readable(self, verify: Verifier | None = None) -> bool:
        """For a run recorded as finished: whether its final checkpoint is the newest readable one (block files
        checked by ``verify``, as in ``read_checkpoint``). If it is not, say so, record the run as interrupted
        and return False (resuming replays the lost steps). No readable checkpoint at all is a ``StoreError``."""
        self.read_checkpoint(verify)
        if self.status == "finished":
            return True
        log.warning("%s: the run was recorded as finished, but its final checkpoint (step %s) is unreadable; "
                    "it continues from step %d", self.path, self.meta.get("final_step"), self._current)
        self.set_status("interrupted")
        return False

    # ----- checkpoints -----
    def begin_checkpoint(self, step: int) -> CheckpointWriter:
        """A new checkpoint folder for ``step`` (never one used before); commit it with ``save_checkpoint``."""
        return CheckpointWriter(self.path, step)

    def save_checkpoint(self, writer: CheckpointWriter, step: int, globals: dict[str, np.ndarray], state: dict,
                        blocks: dict[str, list[FileRecord]]) -> None:
        """Write ``globals`` (globals.npz) and ``state`` (state.json, with the step) into the writer's folder,
        then the manifest naming them and every block file of ``blocks`` (name -> records in block order, as
        the workers' ``write_block_file`` returned them); then remove all but the two newest complete
        checkpoints."""
        if step != writer.step:
            raise ValueError(f"checkpoint folder {writer.name} is for step {writer.step}, not {step}")
        records = {"globals.npz": write_arrays(join(writer.url, "globals.npz"), globals, self.storage_options)}
        url, data = join(writer.url, "state.json"), _json_bytes({"step": step, **state})
        write_bytes(url, data, self.storage_options)
        records["state.json"] = FileRecord.of(url, data)
        block_names = {name: [writer.relative(r) for r in recs] for name, recs in blocks.items()}
        for record in [r for recs in blocks.values() for r in recs]:
            records[writer.relative(record)] = record
        content = {"step": step, "files": {k: [r.size, r.crc32] for k, r in records.items()}, "blocks": block_names}
        self._check_owner()  # the manifest makes the checkpoint count: never from a command that lost the run
        body = json.dumps(content, sort_keys=True)
        manifest = {"buffet_checkpoint": CHECKPOINT_FORMAT, "crc32": zlib.crc32(body.encode("utf-8")), "content": body}
        write_bytes(join(writer.url, MANIFEST), _json_bytes(manifest), self.storage_options)
        self._current = step
        self._prune(writer.name)

    def newest_step(self) -> int | None:
        """The step of the newest checkpoint with a well-formed manifest (its files are not checked), or None."""
        for name in reversed(self._folders()):
            try:
                return self._manifest(join(self.path, name))[0]
            except Unreadable:
                continue
        return None

    def has_checkpoint(self) -> bool:
        """Whether any checkpoint folder has a manifest (it may still turn out unreadable)."""
        return any(exists(join(self.path, name, MANIFEST), self.storage_options) for name in self._folders())

    def read_checkpoint(self, verify: Verifier | None = None) -> Checkpoint:
        """The newest checkpoint whose manifest and files verify. ``verify`` checks the files other than
        globals.npz and state.json (block files and the like) and returns a problem or None for each
        (default: ``check_file`` on this process; an engine may check them on its workers instead).
        A newer checkpoint that is unreadable or cut short is skipped with a warning; if every
        checkpoint is unreadable, a ``StoreError`` says so."""
        verify = verify or (lambda records: [check_file(r, self.storage_options) for r in records])
        skipped: list[tuple[str, str]] = []
        for name in reversed(self._folders()):
            try:
                checkpoint = self._read(name, verify)
            except Unreadable as why:
                skipped.append((name, str(why)))
                continue
            for bad, why in skipped:
                log.warning("%s: checkpoint %s is unreadable (%s); falling back to the checkpoint of step %d",
                            self.path, bad, why, checkpoint.step)
            self._unreadable.update(bad for bad, _ in skipped)
            self._current = checkpoint.step
            return checkpoint
        broken = [(name, why) for name, why in skipped if not why.startswith("no manifest")]
        if not broken:
            raise StoreError(f"{self.path}: the run has no checkpoint yet (nothing to resume or read)")
        reasons = "; ".join(f"{name}: {why}" for name, why in broken)
        raise StoreError(f"{self.path}: all {len(broken)} checkpoints are unreadable ({reasons}); "
                         "fit the run again with `buffet fit ... --overwrite`")

    def _folders(self) -> list[str]:
        """Names of the checkpoint folders, oldest first."""
        return sorted(n for n in _entries(self.path, self.storage_options) if n.startswith("ckpt-"))

    def _read(self, name: str, verify: Verifier) -> Checkpoint:
        """The checkpoint in folder ``name``, verified against its manifest, or ``Unreadable``."""
        url = join(self.path, name)
        step, files, blocks = self._manifest(url)
        for key in ("globals.npz", "state.json"):
            if key not in files:
                raise Unreadable(f"its manifest does not name {key}")
        try:
            arrays = self._verified_arrays(files["globals.npz"], url)
            state = json.loads(self._verified_bytes(files["state.json"], "state.json"))
        except (StoreError, ValueError, UnicodeDecodeError) as exc:
            raise Unreadable(f"unreadable content ({exc})") from None
        others = [r for key, r in files.items() if key not in ("globals.npz", "state.json")]
        for record, problem in zip(others, verify(others)):
            if problem:
                raise Unreadable(f"{record.path[len(url) + 1:]}: {problem}")
        return Checkpoint(step, arrays, state, {k: [files[p] for p in v] for k, v in blocks.items()}, url)

    def _verified_bytes(self, record: FileRecord, key: str) -> bytes:
        """The content of the file ``record`` names, or ``Unreadable`` if it is missing or not as recorded."""
        try:
            data = read_bytes(record.path, self.storage_options)
        except FileNotFoundError:
            raise Unreadable(f"{key} is missing") from None
        problem = record.mismatch(data)
        if problem:
            raise Unreadable(f"{key}: {problem}")
        return data

    def _verified_arrays(self, record: FileRecord, where: str) -> Mapping[str, np.ndarray]:
        """The arrays of the globals file ``record`` names, checked against it first (``Unreadable`` if not
        as recorded). On local disk the check reads the file in pieces and each array is read from it when
        asked for (``FileArrays``), so no copy of the file, nor an array no one asks for, is held in memory."""
        if is_url(record.path):
            return decode_arrays(self._verified_bytes(record, "globals.npz"), where)
        try:
            problem = record.mismatch_file(FileRecord.of_local_file(record.path))
        except FileNotFoundError:
            raise Unreadable("globals.npz is missing") from None
        if problem:
            raise Unreadable(f"globals.npz: {problem}")
        return FileArrays(record.path, where)

    def _manifest(self, url: str) -> tuple[int, dict[str, FileRecord], dict[str, list[str]]]:
        """Step, file records and block lists of the manifest of the checkpoint folder ``url``."""
        try:
            manifest = json.loads(read_bytes(join(url, MANIFEST), self.storage_options))
        except FileNotFoundError:
            raise Unreadable("no manifest: it was cut short while being written") from None
        except (ValueError, UnicodeDecodeError):
            raise Unreadable("its manifest is not valid JSON") from None
        try:
            body = manifest["content"]
            if zlib.crc32(body.encode("utf-8")) != manifest["crc32"]:
                raise Unreadable("its manifest fails its checksum")
            content = json.loads(body)
            files = {key: FileRecord(join(url, key), int(size), int(crc))
                     for key, (size, crc) in content["files"].items()}
            blocks = {name: list(paths) for name, paths in content["blocks"].items()}
            if any(p not in files for paths in blocks.values() for p in paths):
                raise Unreadable("its manifest names a block file it does not record")
            return int(content["step"]), files, blocks
        except (KeyError, TypeError, ValueError, AttributeError):
            raise Unreadable("its manifest is malformed") from None

    def _prune(self, current: str) -> None:
        """Remove the checkpoint folders older than ``current`` except the newest complete one, so two remain,
        and those found unreadable (a fallback leaves a damaged one that sorts after ``current``)."""
        names = self._folders()
        older = [n for n in names if n < current and n not in self._unreadable]
        complete = [n for n in older if exists(join(self.path, n, MANIFEST), self.storage_options)]
        keep = set(complete[-(KEEP - 1):]) | {current}
        for name in names:
            if name not in keep and (name < current or name in self._unreadable):
                remove(join(self.path, name), self.storage_options)
        self._unreadable.clear()


def _entries(path: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """The names of the files and folders in the folder at ``path`` (none when there is no such folder)."""
    fs, root = filesystem(path, storage_options)
    fs.invalidate_cache(root)
    try:
        return [posixpath.basename(e.rstrip("/")) for e in fs.ls(root, detail=False)]
    except FileNotFoundError:
        return []
