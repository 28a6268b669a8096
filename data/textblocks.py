"""Reading text input in large blocks of whole lines, and parsing numeric records (ingest).

Every text format is read as bytes (plain or gzip, told apart by the gzip magic number) in
blocks of whole lines, so a corpus never has to fit in memory. A block of numeric records is
parsed by a fast vectorised path that accepts only well-formed blocks; anything else goes to
a line-by-line parser that either parses the block or raises ``InputError`` naming the file
and line. The line-by-line parser is the single source of messages about malformed lines.
"""

from __future__ import annotations

import gzip
import logging
import os
import signal
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np

from buffet.data.errors import InputError, UserError

log = logging.getLogger("buffet.ingest")

PathLike = str | os.PathLike
DEFAULT_BLOCK_BYTES = 1 << 24
PARSE_AHEAD = 2  # blocks the parsing process may run ahead of the caller (bounds the memory they hold)
BACKGROUND_MIN_BYTES = 1 << 26  # files at least this large (and 4 blocks) are parsed in a second process
PROGRESS_SECONDS = 5.0
_WHITESPACE = b" \t\r\n\x0b\x0c"
_IS_SPACE = np.zeros(256, dtype=bool)
_IS_SPACE[list(_WHITESPACE)] = True
_DIGITS = b"0123456789"
_INT_CHARS = _DIGITS + _WHITESPACE
ID_LIMIT = 1 << 62


def at(path: PathLike, line: int | None, message: str) -> str:
    """An error message naming the file and, when known, the line."""
    return f"{path}, line {line}: {message}" if line is not None else f"{path}: {message}"


def show(raw: bytes | str, limit: int = 60) -> str:
    """A line (or field) of input, decoded and shortened for an error message."""
    text = (raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw).strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


def open_bytes(path: PathLike) -> BinaryIO:
    """Open a plain or gzip-compressed file for binary reading (``.txt`` or ``.txt.gz``)."""
    try:
        with open(path, "rb") as probe:
            gzipped = probe.read(2) == b"\x1f\x8b"
        return gzip.open(path, "rb") if gzipped else open(path, "rb")
    except OSError as exc:
        raise InputError(at(path, None, f"cannot open ({exc.strerror or exc})")) from exc


@dataclass(frozen=True)
class Block:
    """Whole lines of a file (ending in a newline) and the number of the first one."""

    data: bytes
    first_line: int


class TextSource:
    """A text file read as bytes: single lines first (headers), then blocks of whole lines."""

    def __init__(self, path: PathLike):
        """Open ``path``; an unreadable file is an ``InputError``."""
        self.path = Path(path)
        self.fh = open_bytes(path)
        self.line = 0  # lines consumed so far

    def __enter__(self) -> "TextSource":
        """The source itself; the file is closed on leaving the block."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the file."""
        self.fh.close()

    def _guard(self, read: Callable[..., bytes], *args: int) -> bytes:
        """Call a read method, turning decompression and I/O failures into ``InputError``."""
        try:
            return read(*args)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(at(self.path, self.line + 1, f"cannot read the file ({exc})")) from exc

    def readline(self) -> bytes | None:
        """The next line without its newline, or None at the end of the file."""
        raw = self._guard(self.fh.readline)
        if not raw:
            return None
        self.line += 1
        return raw.rstrip(b"\r\n")

    def next_nonblank(self, comment: bytes | None = None) -> bytes | None:
        """The next line holding anything but whitespace (and not a comment), or None at the end."""
        while (raw := self.readline()) is not None:
            text = raw.strip()
            if text and not (comment and text.startswith(comment)):
                return text
        return None

    def blocks(self, block_bytes: int = DEFAULT_BLOCK_BYTES) -> Iterator[Block]:
        """The rest of the file in blocks of about ``block_bytes``, each made of whole lines.

        A long read reports the lines read so far (``buffet.ingest`` logger) every ``PROGRESS_SECONDS``.
        """
        carry = b""
        started = last_report = time.perf_counter()
        while chunk := self._guard(self.fh.read, block_bytes):
            now = time.perf_counter()
            if now - last_report >= PROGRESS_SECONDS:
                log.info("ingest %s: %s lines read in %.0fs", self.path.name, f"{self.line:,}", now - started)
                last_report = now
            cut = chunk.rfind(b"\n") + 1
            if cut:  # one copy of the block's lines: the carried start joined to a view of the rest
                yield self._advance(b"".join((carry, memoryview(chunk)[:cut])))
                carry = chunk[cut:]
            else:
                carry += chunk
        if carry.strip():
            yield self._advance(carry + b"\n")

    def _advance(self, data: bytes) -> Block:
        """A block of the given lines, counting them as consumed."""
        block = Block(data, self.line + 1)
        self.line += data.count(b"\n")
        return block


def read_int_line(src: TextSource, names: tuple[str, ...], comment: bytes | None = None) -> tuple[list[int], int]:
    """The next non-blank line as non-negative integers named ``names`` (a header line), and its number."""
    text = src.next_nonblank(comment)
    if text is None:
        what = "the file is empty" if src.line == 0 else "the file ends"
        raise InputError(at(src.path, None, f"{what} before the header line giving {' '.join(names)}"))
    fields = text.split()
    where = f"header line should hold {' '.join(names)}"
    if len(fields) != len(names):
        raise InputError(at(src.path, src.line, f"{where} ({len(names)} integer(s)), found {show(text)}"))
    values = [parse_int(f, name, src.path, src.line) for f, name in zip(fields, names)]
    bad = [n for n, v in zip(names, values) if v < 0]
    if bad:
        raise InputError(at(src.path, src.line, f"{where}; {bad[0]} must not be negative"))
    return values, src.line


def parse_int(field: bytes | str, name: str, path: PathLike, line: int) -> int:
    """One integer field, or an error naming the line."""
    try:
        value = int(field)
    except ValueError:
        raise InputError(at(path, line, f"{show(field)} is not an integer {name}")) from None
    if abs(value) >= ID_LIMIT:
        raise InputError(at(path, line, f"{name} {value} is too large"))
    return value


def parse_float(field: bytes | str, name: str, path: PathLike, line: int) -> float:
    """One numeric field, or an error naming the line."""
    try:
        return float(field)
    except ValueError:
        raise InputError(at(path, line, f"{show(field)} is not a number ({name})")) from None


def read_words(path: PathLike) -> list[str]:
    """A vocabulary file: one word per line (UTF-8; trailing whitespace ignored; no empty words)."""
    words: list[str] = []
    with TextSource(path) as src:
        while (raw := src.readline()) is not None:
            try:
                word = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise InputError(at(path, src.line, "not valid UTF-8 text")) from None
            if not word:
                raise InputError(at(path, src.line, "empty line; a vocabulary file holds one word per line"))
            words.append(word)
    return words


@dataclass(frozen=True)
class RecordSpec:
    """The fields of one record line: integer ids first, then numeric values."""

    id_names: tuple[str, ...]
    value_names: tuple[str, ...]
    delimiter: bytes | None = None  # None = runs of whitespace

    @property
    def width(self) -> int:
        """The number of fields on a line."""
        return len(self.id_names) + len(self.value_names)


@dataclass(frozen=True)
class Records:
    """Parsed record lines: ``ids`` (n, n_ids) int64, ``values`` (n, n_values) float64, ``lines`` (n,)."""

    ids: np.ndarray
    values: np.ndarray
    lines: np.ndarray

    def __len__(self) -> int:
        """The number of records."""
        return len(self.lines)


def record_blocks(src: TextSource, spec: RecordSpec, block_bytes: int = DEFAULT_BLOCK_BYTES,
                  in_background: bool | None = None) -> Iterator[Records]:
    """The parsed records of every remaining block of ``src``, in file order (``parse_records``).

    ``in_background`` (default: for a file of at least 4 blocks and ``BACKGROUND_MIN_BYTES``, on Linux with two
    or more cores) reads and parses in a second process (``_read_and_parse``), up to ``PARSE_AHEAD`` blocks
    ahead, while the caller checks and writes the blocks before: ingest then runs on two cores, with the same
    records, the same errors and the same ``src.line`` at the end. A block the reader has read while the caller
    waits for it is sent as text for the caller to parse, so neither side idles while the other works; other
    blocks cross as records, packed (``pack_records``). Which way a block goes changes no result."""
    if in_background is None:
        in_background = sys.platform == "linux" and (os.cpu_count() or 1) > 1 \
            and _file_bytes(src.path) >= max(4 * block_bytes, BACKGROUND_MIN_BYTES)
    if in_background:
        yield from _records_from_reader(src, spec, block_bytes)
    else:
        yield from (parse_records(block, spec, src.path) for block in src.blocks(block_bytes))


def _file_bytes(path: Path) -> int:
    """The size of a file on disk (compressed size for gzip)."""
    return path.stat().st_size


def _records_from_reader(src: TextSource, spec: RecordSpec, block_bytes: int) -> Iterator[Records]:
    """Records from a reading process forked with ``src`` at its current line (module docstring of
    ``record_blocks``). Forked, not spawned, so a user's script is never imported again; it runs only
    ``_read_and_parse``. It is stopped when the caller stops early (an error, Ctrl-C)."""
    from multiprocessing import get_context

    context = get_context("fork")
    queue = context.Queue(PARSE_AHEAD)
    waiting = context.Value("b", 0, lock=False)  # 1 while the caller waits for the reader's next message
    reader = context.Process(target=_read_and_parse, args=(src, spec, block_bytes, queue, waiting), daemon=True)
    reader.start()
    try:
        while True:
            waiting.value = 1
            kind, payload = _next_message(queue, reader, src.path)
            waiting.value = 0
            if kind == "records":
                yield unpack_records(payload)
            elif kind == "text":
                yield parse_records(Block(*payload), spec, src.path)
            elif kind == "error":
                raise payload
            else:
                src.line = payload
                return
    finally:
        if reader.is_alive():
            reader.terminate()
        reader.join()


def _next_message(queue: object, reader: object, path: Path) -> tuple[str, object]:
    """The reader's next message; a ``UserError`` if it died without one (killed, out of memory)."""
    import queue as queues

    while True:
        try:
            return queue.get(timeout=1.0)
        except queues.Empty:
            if not reader.is_alive():
                raise UserError(f"{path}: the process reading it stopped unexpectedly (exit code {reader.exitcode}, "
                                "e.g. killed or out of memory); run the ingest again") from None


def _read_and_parse(src: TextSource, spec: RecordSpec, block_bytes: int, queue: object, waiting: object) -> None:
    """The reading process: every remaining block of ``src`` sent parsed and packed, or as text when the command
    is ``waiting`` for it (it then parses that block on its own core), then ("end", lines read); an error (an
    ``InputError`` naming the line, or any other) is sent as ("error", it), for the command to report in its
    one line. Ctrl-C is left to the command, which stops this process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for block in src.blocks(block_bytes):
            if _send_as_text(waiting):
                queue.put(("text", (block.data, block.first_line)))
            else:
                queue.put(("records", pack_records(parse_records(block, spec, src.path))))
        queue.put(("end", src.line))
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the command, none is printed here
        queue.put(("error", exc))
    queue.close()
    queue.join_thread()


def _send_as_text(waiting: object) -> bool:
    """Whether the reader sends its next block as text: when the command is waiting for it (``record_blocks``)."""
    return bool(waiting.value)


def pack_records(records: Records) -> tuple:
    """``records`` in fewer bytes for the way between processes: ids as int32 and values as float32 when
    that is exact, and consecutive line numbers as the first one only (``unpack_records`` undoes it)."""
    ids, values, lines = records.ids, records.values, records.lines
    if ids.size and -2 ** 31 < ids.min() and ids.max() < 2 ** 31:
        ids = ids.astype(np.int32)
    single = values.astype(np.float32)
    if np.array_equal(single, values):  # NaN never compares equal, so a NaN keeps float64
        values = single
    if lines.size and lines[-1] - lines[0] == lines.size - 1:
        lines = (int(lines[0]), lines.size)
    return ids, values, lines


def unpack_records(packed: tuple) -> Records:
    """The ``Records`` that ``pack_records`` packed."""
    ids, values, lines = packed
    if isinstance(lines, tuple):
        lines = np.arange(lines[0], lines[0] + lines[1], dtype=np.int64)
    return Records(ids.astype(np.int64), values.astype(np.float64), lines)


def parse_records(block: Block, spec: RecordSpec, path: PathLike) -> Records:
    """Parse a block of record lines; blank lines are skipped. Raises ``InputError`` naming the line."""
    fast = _parse_records_fast(block, spec)
    return fast if fast is not None else _parse_records_slowly(block, spec, path)


def _parse_records_fast(block: Block, spec: RecordSpec) -> Records | None:
    """Vectorised parse of a well-formed block, or None if anything looks unusual."""
    data = block.data if spec.delimiter is None else _undelimited(block.data, spec.delimiter)
    if data is None:
        return None
    n_lines = _digit_lines(data, spec.width)
    if n_lines is not None:
        lines, integral = np.arange(n_lines, dtype=np.int64), True
    else:
        lines = _lines_with_tokens(data, spec.width)
        if lines is None:
            return None
        integral = not data.translate(None, _INT_CHARS)
    if lines.size == 0:
        return None
    if spec.delimiter is not None and block.data.count(spec.delimiter) != (spec.width - 1) * lines.size:
        return None
    try:
        flat = np.fromstring(data, dtype=np.int64 if integral else np.float64, sep=" ")
    except ValueError:
        return None
    # An empty token (two separators in a row) leaves fromstring a value short, and no token gives two values,
    # so this count check is what refuses those lines. Integral text has no sign: its values are >= 0.
    if flat.size != lines.size * spec.width or (integral and flat.max() >= ID_LIMIT):
        return None
    table = flat.reshape(lines.size, spec.width)
    n_ids = len(spec.id_names)
    ids = table[:, :n_ids]
    if not integral:
        if not (np.isfinite(ids).all() and (ids == np.round(ids)).all() and (np.abs(ids) < ID_LIMIT).all()):
            return None
    # contiguous ids: reductions over a strided view of the table cost several times more (``pack_records``)
    return Records(np.ascontiguousarray(ids, dtype=np.int64), table[:, n_ids:].astype(np.float64),
                   lines + block.first_line)


def _undelimited(data: bytes, delimiter: bytes) -> bytes | None:
    """Delimited data with the delimiters made spaces, or None if it holds spaces or tabs of its
    own (with the delimiter count checked too, every field is then exactly one token)."""
    if any(space in data for space in (b" ", b"\t") if space != delimiter):
        return None
    return data.replace(delimiter, b" ")


def _lines_with_tokens(data: bytes, width: int) -> np.ndarray | None:
    """Offsets of the lines holding ``width`` whitespace-separated tokens, or None if some
    non-blank line holds another number of tokens."""
    b = np.frombuffer(data, dtype=np.uint8)
    single = _single_spaced_lines(b, width)
    if single is not None:
        return single
    starts, newlines = _token_starts(b), np.flatnonzero(b == 10)
    n = newlines.size
    if starts.size == width * n and (starts[width - 1::width] < newlines).all() \
            and (starts[width::width] > newlines[:-1]).all():
        return np.arange(n, dtype=np.int64)
    per_line = np.bincount(np.searchsorted(newlines, starts), minlength=n)
    if ((per_line != 0) & (per_line != width)).any():
        return None
    return np.flatnonzero(per_line == width).astype(np.int64)


def _digit_lines(data: bytes, width: int) -> int | None:
    """The number of lines when every line of ``data`` is ``width`` runs of digits parted by single spaces
    (the form most tools write integer records in), else None. One ``bytes.translate`` leaves the separators,
    which must read (width - 1 spaces, newline) over and over: 5-6x cheaper than locating every separator
    (``_single_spaced_lines``). Two separators in a row are not caught here but by the caller's count."""
    separators = data.translate(None, _DIGITS)
    n_lines = len(separators) // width
    return n_lines if separators == (b" " * (width - 1) + b"\n") * n_lines else None


def _single_spaced_lines(b: np.ndarray, width: int) -> np.ndarray | None:
    """Offsets of all lines when each holds ``width`` tokens parted by single spaces and nothing else (no
    blank lines, no other whitespace: the form most tools write), else None. Checked from the separator
    bytes alone, at about half the cost of locating every token (``_token_starts``)."""
    where = np.flatnonzero(b <= 32)  # whitespace, and control bytes, which then fail the pattern below
    if where.size == 0 or where.size % width or where[0] == 0 or (np.diff(where) == 1).any():
        return None
    separators = b[where].reshape(-1, width)
    if not ((separators[:, -1] == 10).all() and (separators[:, :-1] == 32).all()):
        return None
    return np.arange(separators.shape[0], dtype=np.int64)


def tokens_per_line(data: bytes) -> np.ndarray:
    """The number of whitespace-separated tokens on each line of ``data`` (which ends in a newline)."""
    b = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(b == 10)
    return np.bincount(np.searchsorted(newlines, _token_starts(b)), minlength=newlines.size)


def _token_starts(b: np.ndarray) -> np.ndarray:
    """Positions of the first byte of every whitespace-separated token."""
    space = _IS_SPACE[b]
    return np.flatnonzero(~space & np.concatenate(([True], space[:-1])))


def concat_records(parts: list[Records], spec: RecordSpec) -> Records:
    """Records of several blocks as one."""
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return Records(empty.reshape(0, len(spec.id_names)), np.zeros((0, len(spec.value_names))), empty)
    return Records(*(np.concatenate([getattr(r, f) for r in parts]) for f in ("ids", "values", "lines")))


def _parse_records_slowly(block: Block, spec: RecordSpec, path: PathLike) -> Records:
    """Line-by-line parse that names the first malformed line."""
    ids: list[list[int]] = []
    values: list[list[float]] = []
    lines: list[int] = []
    n_ids = len(spec.id_names)
    for offset, raw in enumerate(block.data.split(b"\n")[:-1]):
        line = block.first_line + offset
        fields = split_fields(raw, spec.delimiter)
        if not fields:
            continue
        if len(fields) != spec.width:
            names = " ".join(spec.id_names + spec.value_names) if spec.width <= 8 else "values"
            raise InputError(at(path, line, f"expected {spec.width} fields ({names}), found {len(fields)}: "
                                            f"{show(raw)}"))
        ids.append([parse_int(f, name, path, line) for f, name in zip(fields, spec.id_names)])
        values.append([parse_float(f, name, path, line) for f, name in zip(fields[n_ids:], spec.value_names)])
        lines.append(line)
    return Records(np.array(ids, dtype=np.int64).reshape(len(lines), n_ids),
                   np.array(values, dtype=np.float64).reshape(len(lines), len(spec.value_names)),
                   np.array(lines, dtype=np.int64))


def split_fields(raw: bytes, delimiter: bytes | None) -> list[bytes]:
    """The fields of a line ([] for a blank line); an empty delimited field is kept as b''."""
    if delimiter is None or not raw.strip():
        return raw.split()
    return [f.strip() for f in raw.split(delimiter)]
