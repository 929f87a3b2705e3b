"""`syncbench validate --docs`: the matrix's table written between the markers of docs/validation.md, the prose
around it kept."""

from __future__ import annotations

from pathlib import Path

BEGIN, END = "<!-- syncbench validate --docs: begin -->", "<!-- syncbench validate --docs: end -->"


def check_docs(path: Path) -> str:
    """The text of `path` if it has the markers write_docs needs; ValueError naming them otherwise."""
    if not path.is_file():
        raise ValueError(f"validate --docs {str(path)!r}: no such file (accepted: a file with the table's markers)")
    text = path.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{path}: expected one {BEGIN!r} line before one {END!r} line, where the table goes")
    return text


def write_docs(path: Path, command: str, table: str) -> None:
    """Put the command and its table between the BEGIN and END markers of `path` (docs/validation.md); the prose
    around them is kept. A file without both markers is refused, so nothing is half-written."""
    text = check_docs(path)
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    path.write_text(f"{head}{BEGIN}\n```\n$ {command}\n{table}\n```\n{END}{tail}")
