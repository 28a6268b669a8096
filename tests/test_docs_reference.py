"""The reference pages of the docs site list every command-line option and every estimator parameter.

Builds only docs/reference/ (with docs/conf.py, warnings as errors, no notebook execution) into a
temporary folder, then reads the built HTML: each command's section of the command-line page must have a
row for every option string its parser accepts, and each estimator's entry on the Python page must
document every parameter of its ``__init__``. The expected names come from the real parser and the real
classes, so a new option or parameter the pages miss fails here.
"""

from __future__ import annotations

import argparse
import inspect
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import buffet
from buffet.pipeline.cli import build_parser
from buffet.pipeline.estimators.base import Estimator

pytest.importorskip("sphinx", reason="the docs tools are not installed (pip install -e '.[docs]')")

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = ("cli", "python")
INDEX = "# Reference only\n\n```{toctree}\n" + "".join(f"reference/{page}\n" for page in PAGES) + "```\n"
OPTION_TABLE = "buffet-cli-options"


def expected_options(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> dict[tuple[str, ...], set[str]]:
    """Every option string (but -h/--help) of ``parser`` and of each command below it, by command."""
    found = {words: {s for a in parser._actions if not isinstance(a, argparse._HelpAction)
                     for s in a.option_strings}}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.update(expected_options(child, (*words, name)))
    return found


class OptionCells(HTMLParser):
    """The option strings in the first column of each option table, by the id of the innermost
    ``<section>`` holding the table."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []      # ids of the open sections, innermost last
        self.in_table = False              # inside an option table
        self.cell = 0                      # 1-based column of the open cell of the table's row
        self.options: dict[str, set[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "section":
            self.sections.append(attributes.get("id") or "")
        elif tag == "table":
            self.in_table = OPTION_TABLE in (attributes.get("class") or "").split()
        elif tag == "tr":
            self.cell = 0
        elif tag == "td":
            self.cell += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.sections.pop()
        elif tag == "table":
            self.in_table = False

    def handle_data(self, data: str) -> None:
        if self.in_table and self.cell == 1:
            words = re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", data)
            self.options.setdefault(self.sections[-1], set()).update(words)


def section_id(words: tuple[str, ...]) -> str:
    """The id the command-line page gives the section of ``buffet WORDS``."""
    return re.sub(r"[^a-z0-9]+", "-", " ".join(("cli", "buffet", *words)).lower())


def documented_parameters(html: str, name: str) -> set[str]:
    """The parameters the Python page describes for class ``buffet.NAME``: those of the field list of its
    own entry (before its methods) that have a description after the dash, not only a name and type."""
    entries = html.split('<dl class="py class">')
    entry = next(e for e in entries if f'id="buffet.{name}"' in e)
    own = entry.split('<dl class="py method">')[0]
    items = re.findall(r"<li><p><strong>(\w+)</strong>(.*?)</p></li>", own, re.DOTALL)
    return {parameter for parameter, rest in items if re.search(r"\u2013\s*\w", re.sub(r"<[^>]+>", "", rest))}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The reference pages built to HTML, warnings as errors."""
    root = tmp_path_factory.mktemp("docs")
    source = root / "source"
    shutil.copytree(DOCS / "reference", source / "reference")
    (source / "index.md").write_text(INDEX)
    out = root / "html"
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           "-c", str(DOCS), "-D", "nb_execution_mode=off", str(source), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"sphinx-build failed:\n{done.stderr[-4000:]}"
    return out


def test_every_cli_option_is_in_the_reference(built):
    cells = OptionCells()
    cells.feed((built / "reference" / "cli.html").read_text())
    expected = expected_options(build_parser())
    assert len(expected) > 10 and any(len(words) == 2 for words in expected)  # the fit models are there
    missing = {" ".join(("buffet", *words)): sorted(options - cells.options.get(section_id(words), set()))
               for words, options in expected.items()}
    assert not {command: names for command, names in missing.items() if names}


def test_every_estimator_parameter_is_in_the_reference(built):
    html = (built / "reference" / "python.html").read_text()
    estimators = [name for name in buffet.__all__
                  if isinstance(getattr(buffet, name), type) and issubclass(getattr(buffet, name), Estimator)]
    assert len(estimators) == 9
    missing = {}
    for name in estimators:
        parameters = set(inspect.signature(getattr(buffet, name)).parameters)
        assert parameters
        missing[name] = sorted(parameters - documented_parameters(html, name))
    assert not {name: names for name, names in missing.items() if names}
