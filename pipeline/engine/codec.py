"""Values as flat arrays, for checkpoints: a driver's globals and every block of its named states
(per-block state is checkpointed generically, with no per-model layout).

``to_arrays`` turns a value built of NumPy arrays, numbers, strings, None, lists, tuples, dicts with
string keys and dataclasses of buffet into a dict of arrays: the leaves under path names, plus one
``STRUCTURE`` entry holding the shape of the value as JSON. ``from_arrays`` rebuilds it. Dataclasses
are rebuilt from their fields by class name, and only buffet's own classes are accepted, so reading a
checkpoint never imports or runs other code.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any, Mapping, Sequence

import numpy as np

STRUCTURE = "__structure__"
ALLOWED_MODULES = ("buffet.",)


def to_arrays(value: Any) -> dict[str, np.ndarray]:
    """``value`` as flat arrays (module docstring)."""
    leaves: dict[str, np.ndarray] = {}
    structure = _encode(value, "v", leaves)
    leaves[STRUCTURE] = np.array(json.dumps(structure))
    return leaves


def from_arrays(arrays: Mapping[str, np.ndarray], fields: Sequence[str] | None = None) -> Any:
    """The value ``to_arrays`` flattened; with ``fields``, of a flattened dict, only those entries (the arrays
    of the others are not read)."""
    structure = json.loads(str(arrays[STRUCTURE]))
    if fields is not None:
        structure = {"d": {name: structure["d"][name] for name in fields}}
    return _decode(structure, arrays)


def _encode(value: Any, path: str, leaves: dict[str, np.ndarray]) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError(f"cannot checkpoint an object array at {path}")
        leaves[path] = value
        return {"a": path}
    if isinstance(value, np.generic):
        leaves[path] = np.asarray(value)
        return {"s": path}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"j": value} if not (isinstance(value, float) and not np.isfinite(value)) else {"f": repr(value)}
    if isinstance(value, (list, tuple)):
        return {"l" if isinstance(value, list) else "t": [_encode(v, f"{path}.{i}", leaves) for i, v in enumerate(value)]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"cannot checkpoint a dict with non-string keys at {path}")
        return {"d": {k: _encode(v, f"{path}.{k}", leaves) for k, v in value.items()}}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        fields = {f.name: _encode(getattr(value, f.name), f"{path}.{f.name}", leaves)
                  for f in dataclasses.fields(value) if f.init}
        return {"c": f"{cls.__module__}:{cls.__qualname__}", "f": fields}
    raise TypeError(f"cannot checkpoint a {type(value).__name__} at {path}")


def _decode(node: dict, arrays: Mapping[str, np.ndarray]) -> Any:
    kind, payload = next(iter(node.items())) if len(node) == 1 else ("c", node["c"])
    if kind == "a":
        return arrays[payload]
    if kind == "s":
        return arrays[payload][()]
    if kind == "j":
        return payload
    if kind == "f":
        return float(payload)
    if kind in ("l", "t"):
        items = [_decode(v, arrays) for v in payload]
        return items if kind == "l" else tuple(items)
    if kind == "d":
        return {k: _decode(v, arrays) for k, v in payload.items()}
    return _dataclass(payload)(**{k: _decode(v, arrays) for k, v in node["f"].items()})


def _dataclass(name: str) -> type:
    """The dataclass ``module:qualname`` of buffet (nothing else is imported)."""
    module, _, qualname = name.partition(":")
    if not module.startswith(ALLOWED_MODULES):
        raise TypeError(f"refusing to rebuild {name}: not a buffet class")
    cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{name} is not a dataclass")
    return cls
