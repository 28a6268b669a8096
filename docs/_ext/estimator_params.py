"""The parameters of every estimator in its autodoc entry, read from its model's config dataclass.

An estimator's parameters are the fields of its config (``Estimator.config_cls``), each declared with a
help sentence (``settings.option``) that ``buffet fit MODEL --help`` prints too. This adds them to the
class's docstring as a field list when autodoc reads it, one ``:param name:`` per field with its help and
default, so the Python reference lists the same parameters, in the same words, as the command line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sphinx.application import Sphinx

from buffet.pipeline.engine.settings import option_help
from buffet.pipeline.estimators.base import Estimator
from help_text import as_rst


def parameter_lines(config_cls: type) -> list[str]:
    """A ``:param name: help (default: value)`` line per field of ``config_cls``."""
    return [f":param {field.name}: {as_rst(option_help(config_cls, field))} (default: ``{field.default!r}``)"
            for field in dataclasses.fields(config_cls)]


def add_parameters(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """autodoc-process-docstring: after an estimator class's docstring, its parameters."""
    if what == "class" and isinstance(obj, type) and issubclass(obj, Estimator) and hasattr(obj, "config_cls"):
        lines += ["", *parameter_lines(obj.config_cls)]


def setup(app: Sphinx) -> dict[str, object]:
    app.setup_extension("sphinx.ext.autodoc")
    app.connect("autodoc-process-docstring", add_parameters)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
