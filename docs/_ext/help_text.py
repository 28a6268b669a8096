"""Help sentences (of command-line options and config fields) as documentation text.

A help sentence is plain text that quotes commands in backquotes (`buffet resume`) and names options
(--local-tol). Both become code spans in the docs; the rest stays text, so that Sphinx neither reads
stray markup in it nor turns the "--" of an option into a dash.
"""

from __future__ import annotations

import re

from docutils import nodes

CODE = re.compile(r"`([^`]*)`|(?<![\w-])(--[A-Za-z][\w-]*)")
# reStructuredText markup that a plain sentence may hold by accident: emphasis, substitution,
# and a word ending in "_", which reST reads as a link to a target of that name.
RST_MARKUP = re.compile(r"([*|\\`]|_(?!\w))")


def spans(text: str) -> list[tuple[bool, str]]:
    """``text`` cut into (is_code, part) pieces, in order."""
    pieces: list[tuple[bool, str]] = []
    end = 0
    for match in CODE.finditer(text):
        pieces += [(False, text[end:match.start()]), (True, match.group(1) or match.group(2))]
        end = match.end()
    return [(code, part) for code, part in [*pieces, (False, text[end:])] if part]


def as_nodes(text: str) -> list[nodes.Node]:
    """``text`` as docutils inline nodes: literals for the code spans, plain text for the rest."""
    return [nodes.literal(text=part) if code else nodes.Text(part) for code, part in spans(text)]


def as_rst(text: str) -> str:
    """``text`` as reST inline text: inline literals for the code spans, the rest escaped. A literal is
    joined to its neighbours by escaped spaces, which reST drops, so it is one wherever it stands."""
    return "".join(f"\\ ``{part}``\\ " if code else RST_MARKUP.sub(r"\\\1", part) for code, part in spans(text))
