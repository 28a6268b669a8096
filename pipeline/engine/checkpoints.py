"""Checkpoints of a fit, the same for every model: the driver's globals
(``Driver.global_arrays``), every named per-block state of the engine, the step and the trace.

Each block of a named state is flattened to arrays (``engine.codec``) and written into the run's new
checkpoint folder by the worker that holds it; the client writes the globals and state, then the manifest
listing every file with its checksum, last (``RunStore.save_checkpoint``). Restoring takes the newest
checkpoint whose files all match its manifest, the block files checked by workers (an older checkpoint
when the newest is damaged, ``RunStore.read_checkpoint``), and reads every block back where it will be
used (its lineage is that read, so a lost block is read again). A fit without a run folder keeps its last
checkpoint in this process when its executor can lose workers (``Engine.recovery_point``), and none otherwise.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any, Sequence

from buffet.pipeline.engine import codec
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.position import Position
from buffet.pipeline.engine.runstore import FileRecord, RunStore, check_file, read_block_file, write_block_file


def write_block(value: Any, url: str, storage_options: str) -> FileRecord:
    """A block's value written to ``url`` (a worker task)."""
    return write_block_file(url, codec.to_arrays(value), json.loads(storage_options) or None)


def read_block(record: FileRecord, storage_options: str) -> Any:
    """A block's value read back from its checkpoint file, checked against its record (a worker task)."""
    return codec.from_arrays(read_block_file(record.path, json.loads(storage_options) or None, record))


def check_block(record: FileRecord, storage_options: str) -> str | None:
    """What is wrong with a block file (missing, or not what the manifest says), or None (a worker task)."""
    return check_file(record, json.loads(storage_options) or None)


class Saved:
    """The last checkpoint of a fit: in ``run`` (a run store), or in this process without one."""

    def __init__(self, run: RunStore | None, engine: Engine):
        self.run, self.engine = run, engine
        self.storage_options = json.dumps((run.storage_options if run is not None else None) or {}, sort_keys=True)
        self._memory: tuple | None = None

    def write(self, driver: Any, step: int, trace: list[dict], seconds: float) -> None:
        """Checkpoint the fit at ``step`` (module docstring)."""
        engine = self.engine
        if self.run is None:
            self._memory = engine.recovery_point(lambda: self._in_memory(driver, step, trace, seconds))
            return
        writer = self.run.begin_checkpoint(step)
        blocks = {}
        for name, state in engine.states.items():
            urls = engine.generate(str, [(writer.block_url(name, i),) for i in range(state.n)])
            blocks[name] = engine.collect(engine.map(write_block, state, urls, self.storage_options))
        self.run.save_checkpoint(writer, step, codec.to_arrays(driver.global_arrays()),
                                 {"trace": trace, "seconds": seconds}, blocks)
        self._rebase(blocks)

    def _in_memory(self, driver: Any, step: int, trace: list[dict], seconds: float) -> tuple:
        """The checkpoint of a fit without a run folder, kept here: the step, trace, seconds, globals and every
        named state's values, from which the states' lineage now starts."""
        engine = self.engine
        states = {name: engine.collect(blocks) for name, blocks in engine.states.items()}
        for name, values in states.items():
            engine.rebase(name, functools.partial(engine.from_values, values))
        return step, copy.deepcopy(trace), seconds, copy.deepcopy(driver.global_arrays()), states

    def _rebase(self, blocks: dict[str, list[FileRecord]]) -> None:
        """From now on, a named state's lineage starts at its checkpoint files: the cluster keeps no
        record of the steps before, and a block lost later is read back and recomputed from there."""
        for name, records in blocks.items():
            self.engine.rebase(name, functools.partial(self.engine.generate, read_block,
                                                       [(r, self.storage_options) for r in records]))

    def verify(self, records: list[FileRecord]) -> list[str | None]:
        """What is wrong with each of a checkpoint's block files, or None: checked by tasks on the engine's
        workers, which read the files as the restore will (``RunStore.read_checkpoint``'s ``verify``)."""
        if not records:
            return []
        return self.engine.collect(self.engine.generate(check_block, [(r, self.storage_options) for r in records]))

    def restore(self, driver: Any, names: Sequence[str] | None = None) -> Position:
        """Put the driver and the engine's named states (all, or only ``names``) back to the last
        checkpoint; where it was."""
        engine = self.engine
        if self.run is None:
            step, trace, seconds, globals_ = copy.deepcopy(self._memory[:4])
            driver.set_globals(globals_)
            engine.states = {name: engine.from_values(values) for name, values in self._memory[4].items()
                             if names is None or name in names}
            return Position(step, trace, seconds)
        checkpoint = self.run.read_checkpoint(self.verify)
        driver.set_globals(codec.from_arrays(checkpoint.globals))
        engine.states = {name: engine.generate(read_block, [(r, self.storage_options) for r in records])
                         for name, records in checkpoint.blocks.items() if names is None or name in names}
        return Position(checkpoint.step, checkpoint.state["trace"], checkpoint.state["seconds"])
