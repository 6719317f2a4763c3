"""Help as every tbon command prints it, `tbon broker`'s included: plain text, one layout.

A help page is a usage line, a description in paragraphs, and sections (Arguments, Options, and
any a command adds, such as the broker's Attributes) of two-column rows: a term and what it
means. Every paragraph and every row's text is rewrapped to the width of the terminal, so that a
sentence breaks only where the screen ends, never where the source line did; a paragraph whose
first line is `\\b` (Click's marker) keeps its lines as written.

Nothing here imports more than the standard library: `tbon broker --help`, which never loads
Typer, prints its page with it too (overlay/broker/main.py), and the Typer commands' pages are
built from their parameters in cli/helppage.py.
"""

from __future__ import annotations

import inspect
import shutil
import textwrap
from dataclasses import dataclass, field

INDENT = 2  # rows are indented by this much
GAP = 2  # between a row's term and its text
TERM_MAX = 26  # a longer term has its text start on the next line
TEXT_MIN = 30  # a row's text never wraps narrower than this
WIDTH_MIN = 40
KEEP = "\xa0"  # a space that wrapping keeps: `[default: 10s]` stays on one line


@dataclass(frozen=True)
class Section:
    title: str
    rows: list[tuple[str, str]]  # (term, text)


@dataclass
class HelpPage:
    usage: str  # e.g. "tbon status [OPTIONS] [URI]"
    description: str = ""  # paragraphs separated by blank lines
    sections: list[Section] = field(default_factory=list)
    epilog: str = ""  # paragraphs after the sections


def terminal_width() -> int:
    """The terminal's width ($COLUMNS first; 80 when not a terminal), never below 40."""
    return max(WIDTH_MIN, shutil.get_terminal_size((80, 24)).columns)


def paragraphs(text: str) -> list[str]:
    """`text` (a docstring, say) as paragraphs: blank-line separated, each on one line unless
    it starts with a `\\b` line."""
    found = []
    for block in inspect.cleandoc(text).split("\n\n"):
        block = block.strip("\n")
        if not block.strip():
            continue
        if block.startswith("\b\n"):
            found.append(block)
        else:
            found.append(" ".join(line.strip() for line in block.splitlines()))
    return found


def first_paragraph(text: str) -> str:
    found = paragraphs(text)
    return found[0] if found else ""


def _fill(text: str, width: int, indent: str = "") -> list[str]:
    if text.startswith("\b\n"):
        return [indent + line for line in text[2:].splitlines()]
    lines = textwrap.wrap(
        text,
        width=width,
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace(KEEP, " ") for line in lines] or [indent]


def render(page: HelpPage, width: int | None = None) -> str:
    """The page as text, wrapped to `width` (the terminal's by default), ending in a newline."""
    width = terminal_width() if width is None else max(WIDTH_MIN, width)
    lines = _fill(f"Usage: {page.usage}", width, "")
    # A usage line that wraps goes on under the command's name, not under "Usage:".
    lines[1:] = [" " * 6 + line for line in lines[1:]]
    for paragraph in paragraphs(page.description):
        lines.append("")
        lines += _fill(paragraph, width)
    for section in page.sections:
        if not section.rows:
            continue
        lines += ["", f"{section.title}:"]
        lines += _rows(section.rows, width)
    for paragraph in paragraphs(page.epilog):
        lines.append("")
        lines += _fill(paragraph, width)
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _rows(rows: list[tuple[str, str]], width: int) -> list[str]:
    column = min(max(len(term) for term, _ in rows), TERM_MAX) + INDENT + GAP
    text_width = max(width - column, TEXT_MIN)
    lines = []
    for term, text in rows:
        head = " " * INDENT + term
        body: list[str] = []
        for paragraph in paragraphs(text):
            body += _fill(paragraph, text_width)
        if not body:
            lines.append(head)
            continue
        if len(head) + GAP > column:  # too long a term: its text starts below it
            lines.append(head)
        else:
            lines.append(head.ljust(column) + body.pop(0))
        lines += [" " * column + line for line in body]
    return lines
