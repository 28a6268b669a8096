"""A run's report as one self-contained HTML page (``buffet report RUN --html``).

The page is assembled from what ``reports.outputs.report_run`` has just written: its PNG figures are embedded
as ``data:`` URIs and its ``summary.md`` is rendered to HTML, so the page shows exactly the report's figures
and numbers. The run's configuration (its model, dataset and parameters) comes from the run's own record.
The page has inline CSS, no script and no reference to anything outside itself, so it opens from a file, a
mail attachment or an offline laptop the same way.
"""

from __future__ import annotations

import base64
import html
import re
import struct
from pathlib import Path

from buffet.data.urls import write_bytes
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.registry import spec_for

WIDE_PX = 900  # figures at least this wide (in pixels) take the page's whole width
LONG_LIST = 12  # lists longer than this (such as the topics of a large model) flow in columns

STYLE = """
body { margin: 0; background: #f4f5f7; color: #1d2330; font: 15px/1.5 system-ui, sans-serif; }
main { max-width: 1240px; margin: 0 auto; padding: 1rem 1.5rem 3rem; }
h1 { font-size: 1.5rem; margin: 0.6rem 0; }
h2 { font-size: 1.2rem; border-bottom: 2px solid #d5d9e0; padding-bottom: 0.2rem; margin-top: 2rem; }
section.card { background: #fff; border-radius: 8px; padding: 0.6rem 1.2rem 1rem; margin: 1rem 0;
               box-shadow: 0 1px 3px rgba(0, 0, 0, 0.08); }
section.card > h2:first-child { margin-top: 0.4rem; }
.lead { color: #4a5365; margin-top: 0; }
code { background: #eef0f4; border-radius: 3px; padding: 0 0.25em; font-size: 0.92em; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.92rem; }
th, td { border: 1px solid #d5d9e0; padding: 0.2rem 0.6rem; text-align: left; vertical-align: top; }
th { background: #eef0f4; }
.config { display: grid; grid-template-columns: repeat(auto-fit, minmax(24rem, 1fr)); column-gap: 2rem; }
.config table { width: 100%; margin: 0; }
.config td:first-child { width: 45%; color: #4a5365; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(30rem, 1fr)); grid-auto-flow: dense;
           gap: 1rem; }
figure { margin: 0; background: #fff; border-radius: 8px; padding: 0.6rem; box-shadow: 0 1px 3px rgba(0, 0, 0, 0.08); }
figure.wide { grid-column: 1 / -1; }
figure img { display: block; max-width: 100%; height: auto; margin: 0 auto; }
figcaption { text-align: center; color: #4a5365; font-size: 0.9rem; margin-top: 0.3rem; }
li { margin: 0.15rem 0; }
.long { columns: 2 34rem; column-gap: 2.5rem; }
.long li { break-inside: avoid; }
"""


def inline_markdown(text: str) -> str:
    """One line of the summary's markdown as HTML: escaped text with ``code`` spans."""
    parts = html.escape(text, quote=False).split("`")
    return "".join(f"<code>{part}</code>" if i % 2 else part for i, part in enumerate(parts))


def _table(rows: list[str]) -> str:
    """A markdown pipe table (a header row, a ``---`` row, body rows) as an HTML table."""
    cells = [[inline_markdown(c.strip()) for c in row.strip().strip("|").split("|")] for row in rows]
    head = "".join(f"<th>{c}</th>" for c in cells[0])
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in cells[2:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


BLOCKS = {"table": re.compile(r"^\|"), "ul": re.compile(r"^- "), "ol": re.compile(r"^\d+\. "),
          "heading": re.compile(r"^#{1,5} "), "p": re.compile(r"^\S")}


def _kind(line: str) -> str | None:
    """The kind of markdown block a line belongs to (None for a blank line)."""
    return next((kind for kind, pattern in BLOCKS.items() if pattern.match(line)), None)


def _heading(line: str) -> str:
    """A markdown heading one level down (the page's h1 is the summary's title)."""
    level = line.index(" ") + 1
    return f"<h{level}>{inline_markdown(line[level:].strip())}</h{level}>"


def _block(kind: str, lines: list[str]) -> str:
    """Consecutive lines of one kind as one HTML element."""
    if kind == "table":
        return _table(lines)
    if kind == "heading":
        return "".join(map(_heading, lines))
    if kind in ("ul", "ol"):
        items = "".join(f"<li>{inline_markdown(BLOCKS[kind].sub('', line, count=1))}</li>" for line in lines)
        long = ' class="long"' if len(lines) > LONG_LIST else ""
        return f"<{kind}{long}>{items}</{kind}>"
    return f"<p>{inline_markdown(' '.join(lines))}</p>"


def markdown_html(lines: list[str]) -> str:
    """The report summary's markdown (headings, bullet and numbered lists, pipe tables, paragraphs, ``code``)
    as HTML."""
    out: list[str] = []
    kind, block = None, []
    for line in [*lines, ""]:
        this = _kind(line)
        if this != kind or this == "heading":
            if kind:
                out.append(_block(kind, block))
            kind, block = this, []
        if this:
            block.append(line)
    return "\n".join(out)


def png_width(data: bytes) -> int:
    """The width in pixels a PNG's header records."""
    return struct.unpack(">I", data[16:20])[0]


def figure_html(path: Path) -> str:
    """A PNG embedded as a ``data:`` URI, captioned with its file name; wide figures span the page."""
    data = path.read_bytes()
    caption = html.escape(path.stem.replace("_", " "))
    wide = ' class="wide"' if png_width(data) >= WIDE_PX else ""
    return (f'<figure{wide}><img alt="{caption}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
            f"<figcaption>{caption}</figcaption></figure>")


def _value(value: object) -> str:
    """A parameter's value as the page shows it (an unset parameter, which the model chooses itself, as "default")."""
    return "default" if value is None else str(value)


def configuration_html(run: RunStore) -> str:
    """The model (with its one-line description), the dataset and every parameter the run was fitted with."""
    facts = {"model": run.model, "dataset": run.meta.get("dataset"), **run.params}
    rows = [f"<tr><td>{html.escape(k)}</td><td><code>{html.escape(_value(v))}</code></td></tr>"
            for k, v in facts.items()]
    half = -(-len(rows) // 2)
    tables = "".join(f"<table><tbody>{''.join(part)}</tbody></table>" for part in (rows[:half], rows[half:]) if part)
    return f'<p class="lead">{html.escape(spec_for(run.model).summary)}</p><div class="config">{tables}</div>'


def page(run: RunStore, figures: list[Path], summary: list[str]) -> str:
    """The whole page: the summary's title, the rest of the summary as the results, the figures in the report's
    order, then the configuration."""
    title, *rest = summary
    body = markdown_html(rest)
    heading = title.lstrip("#").strip()
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(heading.replace('`', ''))}</title><style>{STYLE}</style></head>",
        f"<body><main><h1>{inline_markdown(heading)}</h1>",
        f'<section class="card"><h2>Results</h2>{body}</section>',
        f'<h2>Figures</h2><div class="figures">{"".join(figure_html(f) for f in figures)}</div>',
        f'<section class="card"><h2>Configuration</h2>{configuration_html(run)}</section>',
        "</main></body></html>", ""])


def write_page(run: RunStore, report_files: list[Path], path: Path) -> Path:
    """Write the page of ``run`` to ``path`` from the files ``report_run`` wrote (its PNGs and summary.md), whole
    or not at all (``data.urls.write_bytes``)."""
    figures = [f for f in report_files if f.suffix == ".png"]
    summary = next(f for f in report_files if f.name == "summary.md").read_text().splitlines()
    write_bytes(str(path), page(run, figures, summary).encode("utf-8"))
    return path
