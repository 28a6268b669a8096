"""Where dataset stores and run folders live: a local path or any URL fsspec reaches.

A *location* is an absolute local path or a URL such as ``s3://bucket/corpus.zarr``, ``gs://...`` or
``abfs://...``; ``file://`` URLs are local paths. Locations are made absolute on the client
(``normalise``) before anything is sent to a worker, so no worker depends on its working folder.

Credentials and endpoints come from the filesystem's usual environment (for S3 the ``AWS_*``
variables, ``AWS_ENDPOINT_URL`` included, which botocore reads itself) or from storage options: a
JSON object given as ``buffet --storage-options`` and passed to fsspec. The options a command is
given become the process default through the ``BUFFET_STORAGE_OPTIONS`` environment variable, so
worker processes started afterwards (the embedded LocalCluster) use them too.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import fsspec
import zarr
from fsspec.core import split_protocol

from buffet.data.errors import UserError

OPTIONS_VARIABLE = "BUFFET_STORAGE_OPTIONS"
LOCAL_PROTOCOLS = (None, "file", "local")

Location = str | os.PathLike


def is_url(location: Location) -> bool:
    """True for a URL of a filesystem other than the local one (``s3://``, ``gs://``, ``abfs://`` ...)."""
    protocol, _ = split_protocol(os.fspath(location))
    return protocol not in LOCAL_PROTOCOLS


def normalise(location: Location) -> str:
    """A remote URL without trailing slashes, or the absolute local path of a path or ``file://`` URL."""
    text = os.fspath(location)
    if is_url(text):
        return text.rstrip("/")
    _, path = split_protocol(text)
    return str(Path(path).expanduser().resolve())


def join(location: str, *parts: str) -> str:
    """``location/part/...`` for a normalised location (URLs keep their ``//``)."""
    return "/".join([location.rstrip("/"), *parts])


def parse_storage_options(text: str) -> dict[str, Any]:
    """The storage options of ``--storage-options``: a JSON object, else a one-line error."""
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"--storage-options is not valid JSON ({exc})") from None
    if not isinstance(options, dict):
        raise UserError("--storage-options must be a JSON object, e.g. '{\"anon\": true}'")
    return options


def set_default_storage_options(options: dict[str, Any] | None) -> None:
    """Make ``options`` the default of this process and of the processes it starts from now on."""
    if options:
        os.environ[OPTIONS_VARIABLE] = json.dumps(options)
    else:
        os.environ.pop(OPTIONS_VARIABLE, None)


def storage_options(given: dict[str, Any] | None = None) -> dict[str, Any]:
    """``given``, else the process default (``set_default_storage_options``), else none."""
    if given is not None:
        return dict(given)
    text = os.environ.get(OPTIONS_VARIABLE)
    return parse_storage_options(text) if text else {}


def filesystem(location: str, options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem of a normalised location and the path within it."""
    if not is_url(location):
        return fsspec.filesystem("file"), location
    with _needs_package(location):
        return fsspec.core.url_to_fs(location, **storage_options(options))


def zarr_store(location: str, options: dict[str, Any] | None = None, read_only: bool = True) -> zarr.abc.store.Store:
    """A Zarr store rooted at a normalised location: a ``LocalStore`` on disk, an ``FsspecStore`` for a URL."""
    if not is_url(location):
        return zarr.storage.LocalStore(location, read_only=read_only)
    options = storage_options(options)
    if location.startswith("s3://"):
        # one GET per chunk object: s3fs otherwise asks for the object's size first (a HEAD per read) to
        # split large objects into concurrent ranged reads, which chunks of a few MB never need
        options = {"max_concurrency": 1, **options}
    with _needs_package(location):
        return zarr.storage.FsspecStore.from_url(location, storage_options=options, read_only=read_only)


@contextlib.contextmanager
def _needs_package(location: str) -> Iterator[None]:
    """A filesystem whose package is not installed (gcsfs for gs://, adlfs for abfs://) is a one-line error;
    fsspec's message names the package."""
    try:
        yield
    except ImportError as exc:
        raise UserError(f"{location}: {exc}") from None


def open_array(location: Location, mode: str, options: dict[str, Any] | None = None) -> zarr.Array:
    """An existing Zarr array at a location (a path or URL), opened with ``mode`` ``"r"`` or ``"r+"``."""
    where = normalise(location)
    return zarr.open_array(store=zarr_store(where, options, read_only=mode == "r"), mode=mode)


def exists(location: str, options: dict[str, Any] | None = None) -> bool:
    """Whether anything (a file, a folder, objects under a prefix) is at a normalised location."""
    fs, path = filesystem(location, options)
    fs.invalidate_cache(path)
    return fs.exists(path)


def read_bytes(location: str, options: dict[str, Any] | None = None) -> bytes:
    """The whole content of a file or object."""
    fs, path = filesystem(location, options)
    return fs.cat_file(path)


def write_bytes(location: str, data: bytes | memoryview, options: dict[str, Any] | None = None) -> None:
    """Write a whole file so that readers see the old content or the new, never a mix: on disk a
    temporary file beside it renamed over it; on an object store one PUT (which stores all or nothing)."""
    if is_url(location):
        fs, path = filesystem(location, options)
        fs.pipe_file(path, bytes(data))
        return
    with writing(location) as handle:
        handle.write(data)


@contextlib.contextmanager
def writing(location: str) -> Iterator[BinaryIO]:
    """A local file opened for writing that appears at ``location`` whole or not at all: written beside it under
    a temporary name and renamed over it when the block ends without an error."""
    target = Path(location)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as handle:
            yield handle
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def remove(location: str, options: dict[str, Any] | None = None) -> None:
    """Remove a file or a whole folder (every object under a prefix); nothing there is fine."""
    fs, path = filesystem(location, options)
    fs.invalidate_cache(path)
    if fs.exists(path):
        fs.rm(path, recursive=True)
