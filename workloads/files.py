"""Bounds for the small files users hand syncbench (sweep TOML, profile JSON), checked on the text before parsing.

Python's TOML and JSON parsers recurse once per nesting level (a file nested thousands deep is a RecursionError)
and convert integer literals of any length (400 digits later overflow a float). These limits are far above any
real file and are reported in one line naming the file, the line and what is accepted.
"""

from __future__ import annotations

import re

MAX_DEPTH = 32  # arrays and tables inside each other; a sweep needs 4 (defaults.link.ranks.1), a profile 3
MAX_DIGITS = 30  # digits of one number literal; every accepted value has fewer than 20

# strings and comments (skipped, so that brackets and digits inside them do not count), brackets, long digit runs
_LONG = MAX_DIGITS + 1
_TOKENS = re.compile(r'"""(?:\\.|[^\\])*?"""|\'\'\'.*?\'\'\'|"(?:\\.|[^"\\\n])*"|\'[^\'\n]*\'|#[^\n]*'
                     r'|(?P<open>[\[{])|(?P<close>[\]}])|(?P<digits>(?:\d_?){' + str(_LONG) + ',})', re.S)
_JSON_TOKENS = re.compile(r'"(?:\\.|[^"\\\n])*"|(?P<open>[\[{])|(?P<close>[\]}])|(?P<digits>\d{' + str(_LONG)
                          + ',})', re.S)

_HEADER = re.compile(r"\s*\[\[?\s*([^\[\]=#]+?)\s*\]")  # a table header line: [name] or [[name]]
_KEY = re.compile(r"\s*([^=#\[\]{}]+?)\s*=")  # the key of a `key = value` line


class FileLimitError(ValueError):
    """A file over one of the limits: the message names the file, the line and the limit."""


def read_bounded(path, max_bytes: int, what: str) -> str:
    """The text of `path` if it is at most `max_bytes` and UTF-8; FileLimitError naming the file otherwise."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileLimitError(f"{path}: larger than {max_bytes:,} bytes: accepted is a {what} of at most "
                             f"{max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileLimitError(f"{path}: not UTF-8 text (byte {e.start}): accepted is a {what} in UTF-8") from None


def check_text(text: str, where: str, json: bool = False) -> None:
    """Refuse nesting deeper than MAX_DEPTH and number literals longer than MAX_DIGITS, before a parser sees them.

    TOML rules by default (comments, four kinds of strings), JSON's with `json=True`. The error names the line and
    the field (the key whose value holds the deep nesting or the long number)."""
    depth, table, field, last_string = 0, "", "", ""
    for m in (_JSON_TOKENS if json else _TOKENS).finditer(text):
        if m.group("open"):
            depth += 1
            line = _line_text(text, m.start())
            if not json and depth == 1 and (header := _HEADER.match(line)):
                table = header.group(1).strip()
            elif depth == (2 if json else 1):
                key = last_string.strip('"') if json else (_KEY.match(line) or [None, ""])[1].strip()
                field = ".".join(k for k in (table, key) if k)
            if depth > MAX_DEPTH:
                raise FileLimitError(f"{where}, line {_line(text, m.start())}{_named(field)}: arrays or tables "
                                     f"nested more than {MAX_DEPTH} deep: accepted is nesting up to {MAX_DEPTH} "
                                     f"levels")
        elif m.group("close"):
            depth -= 1
        elif m.group("digits"):
            shown = m.group("digits")
            line = _line_text(text, m.start())
            if depth <= (1 if json else 0):
                key = last_string.strip('"') if json else (_KEY.match(line) or [None, ""])[1].strip()
                field = ".".join(k for k in (table, key) if k)
            raise FileLimitError(f"{where}, line {_line(text, m.start())}{_named(field)}: a number of "
                                 f"{len(shown.replace('_', ''))} digits ({shown[:12]}...): accepted are numbers of "
                                 f"at most {MAX_DIGITS} digits")
        else:
            last_string = m.group(0)


def check_depth(value, where: str) -> None:
    """Refuse a parsed document nested more than MAX_DEPTH deep (TOML's dotted keys nest without brackets),
    naming the deepest key path; iterative, so it cannot recurse itself."""
    stack = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) > MAX_DEPTH:
            shown = ".".join(str(p) for p in path[:4])
            raise FileLimitError(f"{where}: {shown}...: nested more than {MAX_DEPTH} deep: accepted is nesting up "
                                 f"to {MAX_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((v, path + (k,)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, path + (i,)) for i, v in enumerate(item))


def _line_text(text: str, pos: int) -> str:
    end = text.find("\n", pos)
    return text[text.rfind("\n", 0, pos) + 1:end if end >= 0 else len(text)]


def _named(field: str) -> str:
    return f", field {field}" if field else ""


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1
