"""The ``buffet-cli`` directive: the command-line reference, read from buffet's own argparse parser.

The directive builds the parser the ``buffet`` command builds (``buffet.pipeline.cli.build_parser``, with
every model under ``fit``) and writes one section per command, and per model under ``buffet fit``: its
description, its usage line and a table of its arguments, each as ``--help`` lists it: how it is written
(with its value), its default and its help text. So the page cannot drift from the command: a new
option, model or command appears at the next build.

argparse has no public way to walk a parser, so this reads its ``_actions`` and formats through its
``HelpFormatter``, the attributes ``--help`` itself uses. Help texts keep their straight quotes and
double dashes (no smart quotes), so a value such as a JSON example can be copied from the page.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from buffet.pipeline.cli import build_parser
from help_text import as_nodes

# The "(default: ...)" that ends most help texts; it moves to the table's default column.
TRAILING_DEFAULT = re.compile(r"\s*\(default: (?P<default>.*)\)\s*$", re.DOTALL)
HEADINGS = ("Argument", "Default", "Description")
WIDTHS = (30, 15, 55)


@dataclass(frozen=True)
class Command:
    """One command of the tree: its words after ``buffet`` (empty for ``buffet`` itself), its one-line
    help from the parent's command list (None for the root) and its parser."""

    words: tuple[str, ...]
    summary: str | None
    parser: argparse.ArgumentParser

    @property
    def title(self) -> str:
        return " ".join(("buffet", *self.words))


def subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    """The parser's action that holds its subcommands, if it has one."""
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = (),
             summary: str | None = None) -> list[Command]:
    """``parser`` and every command below it, depth first, in the order ``--help`` lists them."""
    found = [Command(words, summary, parser)]
    action = subcommands(parser)
    if action is not None:
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        for name, child in action.choices.items():
            found += commands(child, (*words, name), helps.get(name))
    return found


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a user gives this command: all but ``--help`` and the choice of subcommand."""
    skipped = (argparse._HelpAction, argparse._SubParsersAction)
    return [a for a in parser._actions if not isinstance(a, skipped) and a.help != argparse.SUPPRESS]


def help_and_default(parser: argparse.ArgumentParser, action: argparse.Action) -> tuple[str, str]:
    """The action's help as ``--help`` prints it, without its trailing "(default: ...)", and its default:
    that phrase's text, else "required", "off" for a flag, the parser's default, or "-" for none."""
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    match = TRAILING_DEFAULT.search(text)
    if match:
        return text[:match.start()], match.group("default")
    if action.required:
        return text, "required"
    if action.nargs == 0:
        return text, "off"
    return text, "-" if action.default is None else str(action.default)


def invocation(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """How the argument is written, as ``--help`` lists it: ``--out RUN``, ``--n-topics N_TOPICS, --k N_TOPICS``,
    ``store``."""
    return parser._get_formatter()._format_action_invocation(action)


def _row(cells: list[nodes.Node]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        row += nodes.entry("", cell)
    return row


def argument_table(parser: argparse.ArgumentParser, actions: list[argparse.Action]) -> nodes.table:
    """A table with a row per argument: how it is written, its default and its help."""
    group = nodes.tgroup(cols=len(HEADINGS))
    group += [nodes.colspec(colwidth=width) for width in WIDTHS]
    group += nodes.thead("", _row([nodes.paragraph(text=heading) for heading in HEADINGS]))
    body = nodes.tbody()
    for action in actions:
        text, default = help_and_default(parser, action)
        written = nodes.paragraph("", "", nodes.literal(text=invocation(parser, action)))
        body += _row([written, nodes.paragraph("", "", *as_nodes(default)),
                      nodes.paragraph("", "", *as_nodes(text))])
    group += body
    return nodes.table("", group, classes=["buffet-cli-options"], support_smartquotes=False)


class CLIReference(SphinxDirective):
    """``buffet-cli``: a section for ``buffet`` and its options (those every command takes), and within it
    a section per command, its usage and its arguments."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        sections: dict[tuple[str, ...], nodes.section] = {}
        for command in commands(build_parser()):
            sections[command.words] = self.section(command)
            if command.words:
                sections[command.words[:-1]] += sections[command.words]
        return [sections[()]]

    def section(self, command: Command) -> nodes.section:
        """The section of one command: title, description, usage, then the argument table."""
        section = nodes.section(ids=[nodes.make_id(f"cli {command.title}")],
                                names=[nodes.fully_normalize_name(command.title)])
        section += nodes.title(text=command.title)
        self.state.document.note_implicit_target(section, section)
        description = command.parser.description or command.summary
        if description:
            section += nodes.paragraph("", "", *as_nodes(description), support_smartquotes=False)
        section += nodes.literal_block(text=command.parser.format_usage().strip(), language="text")
        actions = arguments(command.parser)
        if actions:
            section += argument_table(command.parser, actions)
        return section


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("buffet-cli", CLIReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
