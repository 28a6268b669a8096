"""The written guides in docs/guides/ against the code they describe: every ``buffet ...`` command in their
shell blocks parses with buffet's own command-line parser (a ``fit`` command's options also make a valid
model config, and ``--storage-options`` valid JSON), every ``start_cluster.py`` line parses with that
script's parser, and every file under ``deploy/`` that a guide names exists. Nothing is executed, so a guide
that drifts from the command line or the deployment files fails here."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from buffet.data.errors import UserError
from buffet.data.urls import parse_storage_options
from buffet.pipeline.cli import config_from_args, parse_args
from slurm_setup import deploy_module

ROOT = Path(__file__).resolve().parents[1]
GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.S | re.M)
DEPLOY_PATH = re.compile(r"\bdeploy/[\w.*-]+(?:/[\w.*-]+)*")
SHELL_OPERATORS = {"&&", "||", ";", "|"}


@dataclass(frozen=True)
class Command:
    """One command of a guide's shell block: where it is, and its words."""

    guide: str
    line: int
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.guide}:{self.line}: {shlex.join(self.words)}"


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, logical line) of every shell block in ``text``, backslash continuations joined."""
    lines = []
    for block in SHELL_BLOCK.finditer(text):
        first = text.count("\n", 0, block.start(1)) + 1
        pending, start = "", first
        for offset, raw in enumerate(block.group(1).splitlines()):
            if not pending:
                start = first + offset
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            lines.append((start, pending + raw))
            pending = ""
    return lines


def commands(guide: Path) -> list[Command]:
    """The simple commands (split at ``&&``, ``||``, ``;`` and ``|``) of a guide's shell blocks."""
    found = []
    for number, line in shell_lines(guide.read_text()):
        lexer = shlex.shlex(line.removeprefix("$ "), posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word in SHELL_OPERATORS:
                if words:
                    found.append(Command(guide.name, number, tuple(words)))
                words = []
            else:
                words.append(word)
    return found


def buffet_argv(command: Command) -> list[str] | None:
    """The arguments of the ``buffet`` a command runs (after environment settings, ``sbatch SCRIPT`` or
    ``start_cluster.py ... --``), or None when it runs no buffet."""
    if "buffet" not in command.words:
        return None
    return list(command.words[command.words.index("buffet") + 1:])


def start_cluster_argv(command: Command) -> list[str] | None:
    """The arguments of a ``python deploy/slurm/start_cluster.py ...`` command, or None."""
    for i, word in enumerate(command.words):
        if word.endswith("deploy/slurm/start_cluster.py"):
            return list(command.words[i + 1:])
    return None


def check_buffet(argv: list[str]) -> None:
    """``buffet ARGV`` is a command line of this buffet: it parses, a fit's options make a valid config and
    --storage-options is a JSON object. Raises AssertionError saying what is wrong."""
    try:
        args, options = parse_args(argv)
    except SystemExit:
        raise AssertionError(f"buffet's parser refuses `buffet {shlex.join(argv)}`") from None
    if options is not None:
        parse_storage_options(options)
    if args.command == "fit":
        config_from_args(args)


ALL_COMMANDS = [c for guide in GUIDES for c in commands(guide)]
BUFFET_COMMANDS = [c for c in ALL_COMMANDS if buffet_argv(c) is not None]
START_CLUSTER_COMMANDS = [c for c in ALL_COMMANDS if start_cluster_argv(c) is not None]


def test_every_guide_is_there_and_shows_buffet_commands():
    assert {g.name for g in GUIDES} >= {"cluster.md", "slurm.md", "kubernetes.md", "s3.md"}
    for guide in GUIDES:
        assert any(c.guide == guide.name for c in BUFFET_COMMANDS), f"{guide.name} shows no buffet command"


@pytest.mark.parametrize("command", BUFFET_COMMANDS, ids=str)
def test_buffet_command_of_a_guide_parses(command):
    check_buffet(buffet_argv(command))


@pytest.mark.parametrize("command", START_CLUSTER_COMMANDS, ids=str)
def test_start_cluster_command_of_a_guide_parses(command):
    options, wrapped = deploy_module("start_cluster").parse(start_cluster_argv(command))
    assert options.jobs >= 1 and wrapped[0] == "buffet"
    check_buffet(wrapped[1:])


@pytest.mark.parametrize("argv", [
    ["fit", "bnmf", "s.zarr", "--out", "r", "--no-such-option"],
    ["fit", "no-such-model", "s.zarr", "--out", "r"],
    ["fit", "bnmf", "s.zarr", "--out", "r", "--k", "0"],
    ["info", "s.zarr", "--storage-options", "{not json"],
    ["fit", "inmf", "s.zarr", "--out", "r", "--executor", "sometimes"],
])
def test_a_drifted_command_is_caught(argv):
    with pytest.raises((AssertionError, UserError)):
        check_buffet(argv)


def test_commands_are_read_through_continuations_operators_and_wrappers(tmp_path):
    guide = tmp_path / "g.md"
    guide.write_text("text\n```bash\nX=1 buffet fit bnmf s --out r \\\n    --k 5 && buffet info s # note\n"
                     "sbatch deploy/slurm/buffet.sbatch buffet resume r\n```\n```python\nbuffet = 1\n```\n")
    found = commands(guide)
    assert [(c.line, buffet_argv(c)) for c in found] == [
        (3, ["fit", "bnmf", "s", "--out", "r", "--k", "5"]), (3, ["info", "s"]), (5, ["resume", "r"])]


def test_every_deploy_file_a_guide_names_exists():
    named = {(guide.name, path.rstrip(".")) for guide in GUIDES for path in DEPLOY_PATH.findall(guide.read_text())}
    assert len({path for _, path in named}) >= 8, "the guides should name the deployment files they use"
    missing = [f"{guide}: {path}" for guide, path in sorted(named) if not list(ROOT.glob(path))]
    assert not missing, f"named in a guide but not in the repository: {missing}"
