"""The run store: a folder holding a fit's parameters, checkpoints, trace and results (SPEC 2).

Layout::

    RUN/run.json            model name, dataset path, parameters, status
    RUN/checkpoint.json     pointer to the newest complete checkpoint (replaced atomically)
    RUN/ckpt-NNNNNNNN/      globals.npz, state.json (step, trace, driver state),
                            locals.zarr (row-local state, written by the workers)

A checkpoint folder is complete before the pointer names it, and the previous one is removed
only after the pointer moved, so a run killed at any moment resumes from a whole checkpoint.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from buffet.data.errors import StoreError, UserError
from buffet.data.store import check_format

RUN_FORMAT = 1


def _write_json_atomic(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, default=_json_default))
    os.replace(tmp, path)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in JSON")


class RunStore:
    """A run folder opened for reading and writing checkpoints."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        meta = self.path / "run.json"
        if not meta.exists():
            raise StoreError(f"{self.path}: not a buffet run (no run.json)")
        try:
            self.meta = json.loads(meta.read_text())
        except json.JSONDecodeError as exc:
            raise StoreError(f"{meta}: corrupt run description ({exc})") from None
        check_format(self.meta.get("buffet_run"), RUN_FORMAT, str(self.path), "run")

    @classmethod
    def create(cls, path: str | os.PathLike, model: str, dataset: str | None, params: dict,
               overwrite: bool = False) -> "RunStore":
        """A new run folder; an existing run is kept unless ``overwrite`` (then replaced whole)."""
        path = Path(path)
        cls.check_new(path, overwrite)
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        _write_json_atomic(path / "run.json", {"buffet_run": RUN_FORMAT, "model": model,
                                               "dataset": dataset, "params": params,
                                               "status": "running"})
        return cls(path)

    @staticmethod
    def check_new(path: Path, overwrite: bool) -> None:
        """Refuse to create a run where one exists (unless ``overwrite``) or where other files are."""
        if path.exists():
            if not overwrite:
                raise UserError(f"{path} already exists (pass --overwrite to replace it, or `buffet resume`)")
            if not (path / "run.json").exists():
                raise UserError(f"{path} exists and is not a buffet run; refusing to replace it")

    @property
    def model(self) -> str:
        return self.meta["model"]

    @property
    def params(self) -> dict:
        return self.meta["params"]

    @property
    def status(self) -> str:
        return self.meta["status"]

    def set_status(self, status: str) -> None:
        self.meta["status"] = status
        _write_json_atomic(self.path / "run.json", self.meta)

    def record_selection(self, selection: dict, params: dict) -> None:
        """Keep the record of settings chosen on validation (``engine.selection``) and make the chosen
        config the run's parameters."""
        self.meta["selection"] = selection
        self.meta["params"] = params
        _write_json_atomic(self.path / "run.json", self.meta)

    @property
    def selection(self) -> dict | None:
        """The record of settings chosen on validation entries, or None."""
        return self.meta.get("selection")

    def new_checkpoint_dir(self, step: int) -> Path:
        """An empty folder for checkpoint ``step`` (removed first if a killed run left one)."""
        folder = self.path / f"ckpt-{step:08d}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        return folder

    def locals_array(self, folder: Path, name: str, shape: tuple[int, ...], chunks: tuple[int, ...]) -> str:
        """Create an array for row-local state in a checkpoint; workers fill their own chunks."""
        group = zarr.open_group(str(folder / "locals.zarr"), mode="a")
        group.create_array(name, shape=shape, chunks=chunks, dtype=np.float64, fill_value=0.0)
        return str(folder / "locals.zarr")

    def commit_checkpoint(self, folder: Path, step: int, arrays: dict[str, np.ndarray], state: dict) -> None:
        """Write globals and state into ``folder``, point to it, then drop older checkpoints."""
        np.savez(folder / "globals.npz", **arrays)
        _write_json_atomic(folder / "state.json", {"step": step, **state})
        _write_json_atomic(self.path / "checkpoint.json", {"folder": folder.name, "step": step})
        for old in self.path.glob("ckpt-*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

    def has_checkpoint(self) -> bool:
        return (self.path / "checkpoint.json").exists()

    def load_checkpoint(self) -> tuple[dict[str, np.ndarray], dict, Path]:
        """The newest complete checkpoint: (globals, state, folder)."""
        if not self.has_checkpoint():
            raise StoreError(f"{self.path}: the run has no checkpoint yet (nothing to resume or read)")
        pointer = json.loads((self.path / "checkpoint.json").read_text())
        folder = self.path / pointer["folder"]
        try:
            with np.load(folder / "globals.npz") as npz:
                arrays = {k: npz[k] for k in npz.files}
            state = json.loads((folder / "state.json").read_text())
        except (OSError, ValueError) as exc:
            raise StoreError(f"{folder}: unreadable checkpoint ({exc})") from None
        return arrays, state, folder


# ----- provisional v2 checkpoint API (local paths; replaced by the storage branch) -----

@dataclass(frozen=True)
class FileRecord:
    """A file a checkpoint holds: where, how long, its crc32."""

    path: str
    size: int
    crc32: int


@dataclass(frozen=True)
class CheckpointWriter:
    """A new checkpoint folder being written."""

    url: str
    step: int

    def block_url(self, name: str, index: int) -> str:
        return f"{self.url}/{name}/{index:06d}.npz"


@dataclass(frozen=True)
class Checkpoint:
    step: int
    globals: dict
    state: dict
    blocks: dict
    url: str


def write_block_file(url: str, arrays: dict, storage_options: dict | None = None) -> FileRecord:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    Path(url).parent.mkdir(parents=True, exist_ok=True)
    Path(url).write_bytes(data)
    return FileRecord(url, len(data), zlib.crc32(data))


def read_block_file(url: str, storage_options: dict | None = None, expected: FileRecord | None = None) -> dict:
    data = Path(url).read_bytes()
    if expected is not None and (len(data) != expected.size or zlib.crc32(data) != expected.crc32):
        raise StoreError(f"{url}: checkpoint file is corrupt")
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def _begin_checkpoint(self, step: int) -> CheckpointWriter:
    folder = self.path / f"ckpt-{step:08d}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    return CheckpointWriter(str(folder), step)


def _commit_checkpoint_v2(self, writer: CheckpointWriter, step: int, globals: dict, state: dict,
                          blocks: dict) -> None:
    record = write_block_file(f"{writer.url}/globals.npz", globals)
    manifest = {"step": step, "state": state, "globals": record.__dict__,
                "blocks": {k: [r.__dict__ for r in v] for k, v in blocks.items()}}
    _write_json_atomic(Path(writer.url) / "MANIFEST.json", manifest)
    _write_json_atomic(self.path / "checkpoint.json", {"folder": Path(writer.url).name, "step": step})
    for old in self.path.glob("ckpt-*"):
        if str(old) != writer.url:
            shutil.rmtree(old, ignore_errors=True)


def _load_checkpoint_v2(self) -> Checkpoint:
    if not self.has_checkpoint():
        raise StoreError(f"{self.path}: the run has no checkpoint yet (nothing to resume or read)")
    folder = self.path / json.loads((self.path / "checkpoint.json").read_text())["folder"]
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    globals_ = read_block_file(str(folder / "globals.npz"), None, FileRecord(**manifest["globals"]))
    blocks = {k: [FileRecord(**r) for r in v] for k, v in manifest["blocks"].items()}
    return Checkpoint(manifest["step"], globals_, manifest["state"], blocks, str(folder))


RunStore.begin_checkpoint = _begin_checkpoint
RunStore.commit_checkpoint_v2 = _commit_checkpoint_v2
RunStore.load_checkpoint_v2 = _load_checkpoint_v2
