"""`buffet ... --help` explains every option: each option of each command and of each
`buffet fit MODEL` has a sentence of help beyond its default, `buffet fit --help` names every model
with its summary, and a config field declared without help text stops the parser from being built."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Iterator

import pytest

from buffet.pipeline import cli
from buffet.pipeline.engine.settings import option
from buffet.pipeline.registry import models

DEFAULT = re.compile(r"\(default: [^)]*\)")
MIN_SENTENCE = 20  # characters of help left once the "(default: ...)" note is removed


def parsers(parser: argparse.ArgumentParser, path: str = "buffet") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``parser`` and, recursively, every subparser below it, each with its command path."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, f"{path} {name}")


def helps(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str | None]]:
    """(name, help) of every action of ``parser`` but -h, and of every subcommand it lists."""
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        yield "/".join(action.option_strings) or action.dest, action.help
        if isinstance(action, argparse._SubParsersAction):
            yield from ((choice.dest, choice.help) for choice in action._choices_actions)


def test_every_option_of_every_command_explains_itself():
    all_parsers = list(parsers(cli.build_parser()))
    fit_models = {path.split()[-1] for path, _ in all_parsers if path.startswith("buffet fit ")}
    assert fit_models == set(models())
    thin = []
    for path, parser in all_parsers:
        parser.format_help()  # every help string formats (no stray % or bad %(...)s)
        for name, text in helps(parser):
            sentence = DEFAULT.sub("", text or "").strip()
            if len(sentence) < MIN_SENTENCE:
                thin.append(f"{path} {name}: {text!r}")
    assert not thin, "options without a real help sentence:\n" + "\n".join(thin)


def test_config_option_help_is_the_fields_own_with_its_default(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        cli.main(["fit", "bnmf", "--help"])
    out = capsys.readouterr().out
    assert re.search(r"--n-topics N_TOPICS, --k N_TOPICS\s+Number of topics K\b.*\(default: 20\)$", out, re.M)
    assert re.search(r"--accelerate, --no-accelerate\s+Run the local sweeps in SQUAREM cycles.*\(default: off\)$",
                     out, re.M)
    assert re.search(r"--c0 C0\s+Topic prior strength.*\(default: unset\)$", out, re.M)


def test_fit_help_lists_every_model_with_its_summary(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per model: no wrapping inside a summary
    with pytest.raises(SystemExit) as stop:
        cli.main(["fit", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for name, spec in models().items():
        assert len(spec.summary) >= MIN_SENTENCE, name
        assert re.search(rf"^\s+{re.escape(name)}\s+{re.escape(spec.summary)}$", out, re.M), name


def test_a_config_field_without_help_is_refused_when_the_parser_is_built():
    @dataclass
    class Throwaway:
        documented: int = option(3, "A setting with a sentence of help text.")
        bare: float = 0.5

    with pytest.raises(TypeError, match=r"Throwaway\.bare has no help text"):
        cli._config_args(argparse.ArgumentParser(), Throwaway)


def test_option_keeps_the_default_and_records_the_help():
    @dataclass
    class Throwaway:
        documented: int = option(3, "A setting with a sentence of help text.")

    parser = argparse.ArgumentParser()
    cli._config_args(parser, Throwaway)
    (action,) = [a for a in parser._actions if a.dest == "cfg_documented"]
    assert Throwaway().documented == 3
    assert action.help == "A setting with a sentence of help text. (default: 3)"


def test_fitting_one_model_imports_only_that_models_module() -> None:
    """`buffet fit bnmf ...` parses with bnmf's options alone, so its start-up imports no other model (their
    kernels and drivers cost ~0.1 s); `buffet fit --help` still lists every model."""
    import subprocess
    import sys

    code = ("import sys; from buffet.pipeline.cli import parse_args; "
            "args, _ = parse_args(['fit', 'bnmf', 'store.zarr', '--out', 'run', '--k', '7']); "
            "print(args.model, args.cfg_n_topics, sorted(m for m in sys.modules if m.startswith('buffet.kernels.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(maxsplit=2)
    assert out[:2] == ["bnmf", "7"]
    assert out[2].strip() == "['buffet.kernels.bnmf', 'buffet.kernels.bnmf_sparse', 'buffet.kernels.metrics']"
    assert {path.split()[-1] for path, _ in parsers(cli.build_parser()) if path.startswith("buffet fit ")} == \
        set(models())
