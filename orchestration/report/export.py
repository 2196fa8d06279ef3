"""The formats a report is written in, shared by the leaderboard, the importance table and the
findings: FORMATS names each and its renderer, and a command's --format choices are its keys.

    render("latex", Document(title, data=frame, tables=lambda: [Table(headers, rows, caption)]))

- md: a GitHub table, the caption below it.
- csv: the numbers as they are (the Document's `data`, a DataFrame), not the formatted cells.
- latex: a `table*` float that builds with pdflatex as exported: ASCII only (every symbol as a
  LaTeX command), booktabs rules, shrunk to the text width only when wider (graphicx's
  \\resizebox), two-line headers, a short caption above and the legend as notes below; past
  LATEX_MAX_COLUMNS columns, two tables one over the other, each with the label columns. The
  packages it needs are named in a comment on its first lines.
- html: a page of its own (a small inline stylesheet in booktabs' manner), each table's
  caption first; intervals under their values, and a table wider than the window scrolls in
  its own box with the row names kept in view, so the page stays as wide as the window.

The printed formats (md, latex, html) take headers, rows of Cells and a caption, and write the
same table. A Cell's `aside` (an interval, a range, a count of seeds) is set smaller in print;
`bold` marks the best value of its column.
"""
from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable

from orchestration.errors import SweepError


@dataclass(frozen=True)
class Cell:
    text: str
    aside: str = ""
    bold: bool = False


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[Cell]]
    caption: str
    left: int = 1  # the label columns, aligned left; the numbers after them right
    css: str = "mtbert-table"
    # The legend's entries: after the caption in md and HTML, as notes under a LaTeX table
    # (whose caption stays the one line above it).
    notes: tuple[str, ...] = ()
    # Each column's alignment, l (left), c (centre) or r (right); empty: the `left` label
    # columns left, the numbers right.
    align: tuple[str, ...] = ()

    @property
    def legend(self) -> str:
        return " ".join([self.caption, *self.notes]).strip()

    @property
    def aligns(self) -> list[str]:
        return list(self.align) or ["l"] * self.left + ["r"] * (len(self.headers) - self.left)


# --------------------------------------------------------------------------- markdown

def markdown(table: Table) -> str:
    def cell(c: Cell) -> str:
        text = f"**{c.text}**" if c.bold else c.text
        return (f"{text} {c.aside}" if c.aside else text).replace("|", "\\|")

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cells) + " |"
    align = [{"l": "---", "c": ":-:", "r": "---:"}[a] for a in table.aligns]
    return "\n".join([line([h.replace("|", "\\|") for h in table.headers]), line(align),
                      *(line([cell(c) for c in row]) for row in table.rows), "", table.legend]) + "\n"


# --------------------------------------------------------------------------- LaTeX

LATEX_PACKAGES = (r"% Needs in the preamble: \usepackage{booktabs} (the rules) and \usepackage{graphicx} "
                  r"(\resizebox, which shrinks the table to \textwidth only when it is wider).")
# Math-mode forms where a text command would need the TS1 (textcomp) fonts, which a minimal
# TeX installation builds with METAFONT on first use or lacks; pdflatex's default encoding
# would print < > | in text as other glyphs.
_ESCAPES = {"\\": r"$\backslash$", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
            "{": r"\{", "}": r"\}", "~": r"$\sim$", "^": r"\^{}",
            "<": "$<$", ">": "$>$", "|": r"$|$",
            # A bracket after \\ (a row's end) would be read as the row's extra space.
            "[": "{[}", "]": "{]}",
            "±": r"$\pm$", "†": r"$^\dagger$", "‡": r"$^\ddagger$", "✗": r"$\times$", "×": r"$\times$",
            "§": r"$\S$", "Δ": r"$\Delta$", "–": "--", "—": "---", "−": "$-$", "…": r"\ldots{}",
            "≤": r"$\leq$", "≥": r"$\geq$", "→": r"$\to$", "·": r"$\cdot$", "√": r"$\surd$"}


def latex_escape(text: str) -> str:
    """ASCII LaTeX for any text: the symbols the tables use as commands, accents by their
    base letter, anything else as '?' (pdflatex stops on a character it has no glyph for)."""
    out = []
    for c in text:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif c.isascii():
            out.append(c)
        else:
            base = unicodedata.normalize("NFKD", c).encode("ascii", "ignore").decode()
            out.append(latex_escape(base) if base else "?")
    return "".join(out)


def header_lines(header: str) -> list[str]:
    """A long header as two lines, split before its unit or bracket, else at the space nearest
    its middle (LaTeX and HTML alike)."""
    if len(header) <= 9 or " " not in header:
        return [header]
    at = max(header.rfind(" ("), header.rfind(" ["))
    if at <= 0:
        at = min((m.start() for m in re.finditer(" ", header)), key=lambda i: abs(i - len(header) / 2))
    return [header[:at], header[at + 1:]]


def _latex_header(header: str, align: str) -> str:
    """A long header on two lines (a nested tabular: no package), bottom-aligned with the others."""
    lines = header_lines(header)
    if len(lines) == 1:
        return latex_escape(header)
    inner = r"\\".join(latex_escape(x) for x in lines)
    return rf"\begin{{tabular}}[b]{{@{{}}{align}@{{}}}}{inner}\end{{tabular}}"


def _latex_cell(c: Cell) -> str:
    text = latex_escape(c.text)
    if c.bold:
        text = rf"\textbf{{{text}}}"
    if c.aside:  # set small and tight: a page holds a dozen such columns
        text += rf"{{\scriptsize\,{latex_escape(c.aside.replace('± ', '±'))}}}"
    return text


# Past this many columns (label columns included) a LaTeX table is set as two tables, one over
# the other, each with the label columns: 14 columns scaled to a page's width printed in a
# font too small to read, and two halves of 8 stay near \small.
LATEX_MAX_COLUMNS = 9


def _latex_tabular(table: Table, columns: list[int]) -> list[str]:
    """The tabular of these columns, shrunk to the text width only when wider."""
    aligns = table.aligns
    spec = "".join(aligns[j] for j in columns)
    header = " & ".join(_latex_header(table.headers[j], aligns[j]) for j in columns)
    return [r"\resizebox{\ifdim\width>\textwidth\textwidth\else\width\fi}{!}{%",
            rf"\begin{{tabular}}{{{spec}}}", r"\toprule", header + r" \\", r"\midrule",
            *(" & ".join(_latex_cell(row[j]) for j in columns) + r" \\" for row in table.rows),
            r"\bottomrule", r"\end{tabular}}"]


def latex_parts(table: Table) -> list[list[int]]:
    """The columns of each tabular: all of them, or past LATEX_MAX_COLUMNS the label columns
    with each half of the others."""
    n = len(table.headers)
    labels, rest = list(range(table.left)), list(range(table.left, n))
    if n <= LATEX_MAX_COLUMNS or len(rest) < 2:
        return [list(range(n))]
    half = (len(rest) + 1) // 2
    return [labels + rest[:half], labels + rest[half:]]


def latex(table: Table) -> str:
    """One table* float (no preamble comment: latex_document puts it first): the caption
    above, one or two tabulars, the legend as notes below in a smaller font."""
    head, notes = (table.caption, table.notes) if table.caption or not table.notes else \
        (table.notes[0], table.notes[1:])
    tabulars = [_latex_tabular(table, columns) for columns in latex_parts(table)]
    body = [line for i, t in enumerate(tabulars) for line in ([r"\par\medskip"] if i else []) + t]
    below = [r"\par\smallskip", r"{\footnotesize\raggedright " + latex_escape(" ".join(notes)) + r"\par}"]
    lines = [r"\begin{table*}[t]", r"\centering", r"\small", r"\setlength{\tabcolsep}{4pt}",
             # Above the table, a small skip below it: article's \belowcaptionskip is zero.
             rf"\caption{{{latex_escape(head)}}}", r"\smallskip", *body,
             *(below if notes else []), r"\end{table*}"]
    return "\n".join(lines) + "\n"


def latex_document(title: str, tables: list[Table]) -> str:
    """The floats, after a comment naming what they are and the packages they need."""
    head = [f"% {latex_escape(title)}"] if title else []
    return "\n".join([*head, LATEX_PACKAGES, ""]) + "\n".join(latex(t) for t in tables)


# --------------------------------------------------------------------------- HTML

STYLE = """\
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1a1a1a;
       margin: 2rem; line-height: 1.4; }
h1 { font-size: 1.15rem; font-weight: 600; margin: 0 0 1rem; }
/* A table wider than the window scrolls inside its own box, the row names staying in view;
   the page itself never grows wider than the window. */
.scroll { overflow-x: auto; max-width: 100%; margin: 0 0 2.5rem; }
table { border-collapse: collapse; font-size: 0.9rem; }
caption { caption-side: top; text-align: left; max-width: 60rem; padding-bottom: 0.6rem;
          font-size: 0.85rem; color: #444; position: sticky; left: 0; }
thead th { border-top: 2px solid #1a1a1a; border-bottom: 1px solid #1a1a1a; font-weight: 600;
           vertical-align: bottom; }
tbody tr:last-child td { border-bottom: 2px solid #1a1a1a; }
th, td { padding: 0.3rem 0.5rem; text-align: right; font-variant-numeric: tabular-nums; }
td { white-space: nowrap; }
th { white-space: nowrap; }  /* a long header on two lines, split where LaTeX splits it */
th.label, td.label { text-align: left; }
th:first-child, td:first-child { position: sticky; left: 0; background: #fff; }
tbody tr:nth-child(even), tbody tr:nth-child(even) td:first-child { background: #f5f6f8; }
/* An interval or range on a line of its own under its value: a column is as wide as its
   number, not number and interval side by side. */
.aside { display: block; color: #666; font-size: 0.8em; }
"""


# A cell's attributes by its column's alignment: the stylesheet sets numbers right.
_HTML_ALIGN = {"l": ' class="label"', "c": ' style="text-align: center"', "r": ""}


def _html_cell(c: Cell, align: str) -> str:
    text = html.escape(c.text)
    if c.bold:
        text = f"<strong>{text}</strong>"
    if c.aside:
        text += f' <span class="aside">{html.escape(c.aside)}</span>'
    return f"<td{_HTML_ALIGN[align]}>{text}</td>"


def html_table(table: Table) -> str:
    def th(h: str, align: str) -> str:
        text = "<br>".join(html.escape(x) for x in header_lines(h))
        return f"<th{_HTML_ALIGN[align]}>{text}</th>"
    aligns = table.aligns
    head = "".join(th(h, aligns[i]) for i, h in enumerate(table.headers))
    body = "".join("<tr>" + "".join(_html_cell(c, aligns[i]) for i, c in enumerate(row)) + "</tr>\n"
                   for row in table.rows)
    return (f'<div class="scroll">\n<table class="{table.css}">\n<caption>{html.escape(table.legend)}</caption>\n'
            f"<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n</div>\n")


def html_page(title: str, tables: list[Table]) -> str:
    heading = f"<h1>{html.escape(title)}</h1>\n" if title else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title or 'mtbert')}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n"
            f"{heading}{''.join(html_table(t) for t in tables)}</body>\n</html>\n")


# --------------------------------------------------------------------------- the formats

@dataclass(frozen=True)
class Document:
    """What a format writes: the numbers as they are (`data`, a DataFrame: csv) or the printed
    tables (md, latex, html), built by `tables` only when a printed format asks for them (a
    csv needs none of their columns), under `title`; md joins its tables with `md_between`."""
    title: str = ""
    data: Any = None
    tables: Callable[[], list[Table]] = list
    md_between: str = ""


def _md(doc: Document) -> str:
    return doc.md_between.join(markdown(t) for t in doc.tables())


def _csv(doc: Document) -> str:
    return doc.data.to_csv(index=False)


def _latex(doc: Document) -> str:
    return latex_document(doc.title, doc.tables())


def _html(doc: Document) -> str:
    return html_page(doc.title, doc.tables())


# The one list of formats: render() and every command's --format read it.
FORMATS: dict[str, Callable[[Document], str]] = {"md": _md, "csv": _csv, "latex": _latex, "html": _html}
# Of them, those of a table whose cells carry Markdown of their own (the findings' bold
# verdicts): md, and its numbers as csv.
MARKDOWN_FORMATS = ("md", "csv")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise SweepError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")


def render(fmt: str, doc: Document) -> str:
    """The document in `fmt`, one of FORMATS (else one line naming them)."""
    check_format(fmt)
    return FORMATS[fmt](doc)
