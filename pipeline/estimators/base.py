"""The common contract of the estimators, in scikit-learn's conventions.

Every estimator wraps one model's config dataclass: its parameters are exactly the config's fields,
``__init__`` keywords with the config's defaults, stored unchanged (the signature is generated from
the dataclass by ``__init_subclass__``); the config is built and checked in ``fit``. ``fit`` runs the
model's driver through the engine's loop, on ``client``'s Dask cluster when one is given, else in this
process or on an embedded LocalCluster by the size of the data, as ``buffet fit`` chooses; and with
``run_dir=`` into a run folder that ``buffet resume`` continues. Fitted attributes end in ``_``;
``save``/``load`` keep the parameters (JSON) and the fitted arrays (npz), no pickles; ``from_run`` opens a
run folder of ``buffet fit`` as the estimator fitted there.

scikit-learn is not a dependency: it is imported only inside ``__sklearn_tags__``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import sys
import typing
import zlib
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, ClassVar, ContextManager

import numpy as np

from buffet.data.arrays import from_array
from buffet.data.errors import InputError, StoreError, UserError
from buffet.data.store import CSRRows
from buffet.data.urls import join, normalise
from buffet.kernels.bmf import RowStreams
from buffet.pipeline.engine.cluster import dask_client
from buffet.pipeline.engine.dataset import Source, source_of
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.executor_choice import Choice, choose, chosen_engine, engine_on, stored_entries
from buffet.pipeline.engine.loop import Driver, Position, run_loop
from buffet.pipeline.engine.runs import restored, run_source, settle_config
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.estimators.inputs import COUNTS, source_for
from buffet.pipeline.registry import spec_for

SAVE_FORMAT = 1
META = "__buffet_estimator__"          # the JSON entry of a saved estimator's npz
ARRAY_DICT = "::"                     # npz key separator of a fitted dict of arrays: "name::key"


class NotFittedError(UserError, ValueError, AttributeError):
    """``transform``, ``predict`` or ``score`` was called before ``fit``: a ValueError and an
    AttributeError, as scikit-learn's NotFittedError, so its ``check_is_fitted`` conventions hold."""


def not_fitted(message: str) -> NotFittedError:
    """A NotFittedError that is also scikit-learn's when scikit-learn is loaded (never importing it), so
    that ``except sklearn.exceptions.NotFittedError`` catches it too."""
    exceptions = sys.modules.get("sklearn.exceptions")
    if exceptions is None:
        return NotFittedError(message)
    return _with_sklearn(exceptions.NotFittedError)(message)


@functools.lru_cache(maxsize=1)
def _with_sklearn(sklearn_error: type) -> type:
    return type("NotFittedError", (NotFittedError, sklearn_error), {"__module__": __name__})


class InvalidParameterError(UserError, ValueError):
    """``set_params`` was given a name that is not a parameter of the estimator."""


def engine_for(client) -> Engine:
    """The engine on the Dask cluster of ``client``, or in this process (a minibatch, new rows)."""
    return engine_on(client)


def fit_engine(client, source: Source, model_name: str) -> ContextManager[Engine]:
    """The engine of a ``fit``: on ``client``'s cluster when one is given, else chosen as ``buffet fit`` chooses
    (``engine.executor_choice``): in this process for small data, on an embedded LocalCluster, started for
    this fit and closed after it, for large."""
    spec = spec_for(model_name)
    if client is not None:
        return chosen_engine(Choice("cluster", "client given"), lambda: contextlib.nullcontext(client))
    choice = choose("auto", None, lambda: stored_entries(source.open()), spec.process_entries)
    return chosen_engine(choice, lambda: dask_client(quiet=True, worker_kind=spec.worker_kind))


def row_streams(seed: int, X: np.ndarray, mask: np.ndarray) -> RowStreams:
    """Generators for the seeded Monte Carlo of new rows (``kernels.bmf.sample_new_rows``), one per row
    keyed by the row's values and mask: a row gets the same draws whatever rows come with it."""
    keys = [zlib.crc32(np.ascontiguousarray(x).tobytes() + np.packbits(m).tobytes()) for x, m in zip(X, mask)]
    return RowStreams([stream(seed, "new-rows", key) for key in keys], stream(seed, "new-rows"))


def _signature(config_cls: type, positional: tuple[str, ...]) -> inspect.Signature:
    """``__init__(self, <positional>, *, <other fields>)`` with the config's defaults and types."""
    hints = typing.get_type_hints(config_cls)
    order = sorted(fields(config_cls), key=lambda f: f.name not in positional)
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD if f.name in positional
                                 else inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
               for f in order]
    return inspect.Signature(params)


def _make_init(signature: inspect.Signature, config_cls: type):
    """An ``__init__`` that stores every parameter unchanged (scikit-learn: no work in ``__init__``)."""
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        for name, value in list(bound.arguments.items())[1:]:
            setattr(self, name, value)

    __init__.__signature__ = signature
    __init__.__doc__ = f"Parameters: the fields of ``{config_cls.__name__}``, with its defaults."
    return __init__


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot save {type(value).__name__} as JSON")


def _pack(attrs: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Fitted attributes as npz arrays (arrays, dicts of arrays) and JSON values (the rest)."""
    arrays: dict[str, np.ndarray] = {}
    values: dict[str, Any] = {}
    for name, value in attrs.items():
        if isinstance(value, np.ndarray):
            arrays[name] = value
        elif isinstance(value, dict) and value and all(isinstance(v, (np.ndarray, np.generic)) for v in value.values()):
            arrays.update({f"{name}{ARRAY_DICT}{k}": np.asarray(v) for k, v in value.items()})
            values[name] = {ARRAY_DICT: sorted(value)}
        else:
            values[name] = value
    return arrays, values


def _unpack(arrays: dict[str, np.ndarray], values: dict[str, Any]) -> dict[str, Any]:
    """The attributes ``_pack`` stored."""
    out = {name: arrays[name] for name in arrays if ARRAY_DICT not in name}
    for name, value in values.items():
        if isinstance(value, dict) and ARRAY_DICT in value:
            out[name] = {k: arrays[f"{name}{ARRAY_DICT}{k}"] for k in value[ARRAY_DICT]}
        else:
            out[name] = value
    return out


class Estimator:
    """Base of the estimators (module docstring). A subclass names its config class and its model
    (as ``buffet fit`` knows it), the kind of data it reads (``inputs.COUNTS`` or ``inputs.DENSE``),
    and implements ``_fit(config, source, engine, run)`` (a ``dataset.Source`` and an ``Engine``), which
    sets ``trace_`` (the engine's steps; ``n_iter_`` is their number) and then, with ``_adopt(driver)``, the
    fitted attributes from the driver at the end of the fit: the step ``from_run`` takes with the driver
    of a run restored at its newest checkpoint."""

    config_cls: ClassVar[type]
    model_name: ClassVar[str]
    input_kind: ClassVar[str]
    positional: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "config_cls" in cls.__dict__:
            cls.__init__ = _make_init(_signature(cls.config_cls, cls.positional), cls.config_cls)

    # ----- parameters -----
    @classmethod
    def _param_names(cls) -> list[str]:
        return [f.name for f in fields(cls.config_cls)]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The parameters (the config's fields) by name."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> "Estimator":
        """Set parameters by name; an unknown name is refused (checked in ``fit`` otherwise)."""
        known = self._param_names()
        for name, value in params.items():
            if name not in known:
                raise InvalidParameterError(f"invalid parameter {name!r} for estimator {type(self).__name__}; "
                                            f"valid parameters are: {', '.join(known)}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = {f.name: f.default for f in fields(self.config_cls)}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items() if not _same(v, defaults[k])]
        return f"{type(self).__name__}({', '.join(changed)})"

    def _config(self) -> Any:
        """The model's config from the parameters, checked (settings that cannot work are refused)."""
        config = self.config_cls(**self.get_params())
        config.check()
        return config

    # ----- fitting -----
    def fit(self, X, y=None, *, mask=None, client=None, run_dir: str | os.PathLike | None = None) -> "Estimator":
        """Fit to ``X`` (module ``inputs``: a store path, a Dataset, an array with optional ``mask``, a
        sparse or dask array). ``client``: a ``distributed.Client`` to run on; ``run_dir``: a run folder
        to checkpoint into (in-memory data is first written there as ``data.zarr``, so ``buffet resume``
        can continue the run). ``y`` is ignored. The same seed gives the same numbers as ``buffet fit``.
        Models with structural settings to choose (IMF, INMF, BMF) choose them on validation entries as
        ``buffet fit`` does (``select``; in-memory data has no held-out split, so only with
        ``select="validation"``); ``selection_`` is the record of the choice, or None."""
        config = self._config()
        source = source_for(X, mask, self.input_kind)
        self._forget()
        source, run = self._run_source(source, config, run_dir)
        with fit_engine(client, source, self.model_name) as engine:
            config, self.selection_ = settle_config(spec_for(self.model_name), config, source, engine)
            if run is not None and self.selection_ is not None:
                run.record_selection(self.selection_, asdict(config))
            self._fit(config, source, engine, run)
        self.n_iter_ = len(self.trace_)
        self.n_features_in_ = source.open().n_cols
        return self

    def fit_transform(self, X, y=None, *, mask=None, client=None, run_dir=None) -> np.ndarray:
        """``fit`` then ``transform`` of the same rows."""
        self.fit(X, mask=mask, client=client, run_dir=run_dir)
        return self.transform(X) if mask is None else self.transform(X, mask=mask)

    def _fit(self, config: Any, source: Source, engine: Engine, run: RunStore | None) -> None:
        raise NotImplementedError

    def _adopt(self, driver: Driver) -> None:
        """The fitted attributes from the fit's driver (``trace_`` set already)."""
        raise NotImplementedError

    @classmethod
    def from_run(cls, path: str | os.PathLike, *, client=None,
                 storage_options: dict[str, Any] | None = None) -> "Estimator":
        """The estimator of the run folder ``path`` that ``buffet fit`` (or ``fit(run_dir=...)``) wrote, fitted
        as the run's newest checkpoint left it: its parameters are the run's (those chosen on validation
        when a choice was made), its fitted attributes what ``fit`` sets, from the run's driver restored at
        that checkpoint (``engine.runs.restored``; it reads the run's dataset as the driver does). Ready for
        ``transform``, ``score`` and ``save``. ``client``: a ``distributed.Client`` to restore on;
        ``storage_options``: for a run at a URL (fsspec)."""
        run = RunStore(path, storage_options)
        if run.model != cls.model_name:
            raise StoreError(f"{run.path}: holds a {run.model} run, not one of {cls.__name__} ({cls.model_name}); "
                             "open it with buffet.load_run")
        return cls.restore(run, engine_for(client))

    @classmethod
    def restore(cls, run: RunStore, engine: Engine) -> "Estimator":
        """The estimator of ``run`` (a run of this estimator's model) restored on ``engine`` (``from_run``)."""
        estimator = cls(**run.params)
        driver, position = restored(run, engine, spec_for(run.model).outputs.states)
        estimator.trace_ = position.trace
        estimator._adopt(driver)
        estimator.n_iter_ = len(estimator.trace_)
        estimator.n_features_in_ = run_source(run).open().n_cols
        estimator.selection_ = run.selection
        return estimator

    def _forget(self) -> None:
        """Drop the fitted attributes of an earlier fit."""
        for name in [k for k in vars(self) if k.endswith("_") and not k.startswith("_")]:
            delattr(self, name)

    def _run_source(self, source: Source, config: Any, run_dir) -> tuple[Source, RunStore | None]:
        """Where the driver reads and the run folder it checkpoints into (``fit``'s docstring). Array rows
        (a dask array too) are written to the run's ``data.zarr`` after reading them whole."""
        if run_dir is None:
            return source, None
        if source.url is not None:
            return source, RunStore.create(run_dir, self.model_name, source.url, asdict(config))
        store = join(normalise(run_dir), "data.zarr")
        run = RunStore.create(run_dir, self.model_name, store, asdict(config))
        data = source.open()
        rows = data.read_rows(0, data.n_rows)
        values = rows.to_scipy() if isinstance(rows, CSRRows) else rows.X
        return source_of(from_array(values, store, data.kind, mask=getattr(rows, "mask", None))), run

    def _driver(self, config: Any, source: Source, engine: Engine) -> Driver:
        """The model's driver for ``config`` reading ``source`` on ``engine``, built as ``buffet fit`` builds
        it (the model's ``ModelSpec.make_driver``, ``pipeline.registry``)."""
        return spec_for(self.model_name).make_driver(config, source, engine)

    @staticmethod
    def _run(driver: Driver, config: Any, run: RunStore | None, position: Position | None = None) -> list[dict]:
        """Step ``driver`` to the end with the engine's loop, from ``position`` (default: the
        start); the trace of the steps."""
        return run_loop(driver, run, position or Position(), config.checkpoint_every, quiet=True).trace

    # ----- fitted state -----
    def _check_fitted(self) -> None:
        if not hasattr(self, "n_features_in_"):
            raise not_fitted(f"this {type(self).__name__} instance is not fitted yet; call fit first")

    def _check_columns(self, n_cols: int) -> None:
        self._check_fitted()
        if n_cols != self.n_features_in_:
            raise InputError(f"X has {n_cols} features, but {type(self).__name__} is expecting "
                             f"{self.n_features_in_} features as input")

    def save(self, path: str | os.PathLike) -> Path:
        """Write the parameters and the fitted arrays: one ``.npz`` file if ``path`` ends in .npz, else a
        folder with ``params.json`` and ``fitted.npz``. ``load`` reads either back."""
        self._check_fitted()
        arrays, values = _pack({k: v for k, v in vars(self).items() if k.endswith("_") and not k.startswith("_")})
        meta = json.dumps({"buffet_estimator": SAVE_FORMAT, "class": type(self).__name__,
                           "params": self.get_params(), "fitted": values}, default=_json_default)
        path = Path(path)
        if path.suffix == ".npz":
            _write_npz(path, {META: np.array(meta), **arrays})
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "params.json").write_text(meta)
            _write_npz(path / "fitted.npz", arrays)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Estimator":
        """The estimator ``save`` wrote at ``path``."""
        path = Path(path)
        try:
            if path.is_dir():
                meta = json.loads((path / "params.json").read_text())
                arrays = _read_npz(path / "fitted.npz")
            else:
                arrays = _read_npz(path)
                meta = json.loads(str(arrays.pop(META)))
        except (OSError, KeyError, ValueError) as exc:
            raise StoreError(f"{path}: not a saved buffet estimator ({exc})") from None
        if meta.get("class") != cls.__name__:
            raise StoreError(f"{path}: holds a saved {meta.get('class')}, not a {cls.__name__}")
        estimator = cls(**meta["params"])
        for name, value in _unpack(arrays, meta["fitted"]).items():
            setattr(estimator, name, value)
        return estimator

    # ----- scikit-learn -----
    def _input_tags(self) -> dict[str, bool]:
        """scikit-learn input tags: count models take sparse non-negative data, dense ones NaN as missing."""
        if self.input_kind == COUNTS:
            return {"sparse": True, "positive_only": True}
        return {"sparse": True, "allow_nan": True}

    def __sklearn_tags__(self):
        from sklearn.utils import InputTags, Tags, TargetTags, TransformerTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=False), transformer_tags=TransformerTags(),
                    input_tags=InputTags(**self._input_tags()), non_deterministic=False, requires_fit=True)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except (TypeError, ValueError):
        return a is b


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` to a temporary name, then moved into place (never a half-written file)."""
    tmp = path.with_name(f".{path.stem}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}
