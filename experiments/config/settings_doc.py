"""The table of sweep settings as text: docs/settings.md's tables and `syncbench schema --settings`, made from
SETTINGS (experiments/config/settings.py) and SIMULATE_RANGES (experiments/config/simulate_table.py).

    python -m experiments.config.settings_doc --write docs/settings.md   # rewrite the generated tables
    python -m experiments.config.settings_doc --check docs/settings.md   # exit 1 when they are out of date

Only the text between each pair of markers is generated; the prose around it is the page's own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.config.settings import SETTINGS, Setting
from experiments.config.simulate_table import SIMULATE_RANGES

COMMAND = "python -m experiments.config.settings_doc --write docs/settings.md"
# (begin marker, end marker) of each generated table in the page
RUN_MARKERS = ("<!-- the run settings: generated from experiments/config/settings.py by "
               f"`{COMMAND}`; edit the table there -->", "<!-- end of the run settings -->")
SIMULATE_MARKERS = ("<!-- the [simulate] settings: generated from experiments/config/simulate_table.py by "
                    f"`{COMMAND}` -->", "<!-- end of the [simulate] settings -->")
_TYPE_NAMES = {int: "integer", float: "number", bool: "true/false", str: "string", dict: "table", None: "text"}


def type_name(one: Setting) -> str:
    return _TYPE_NAMES[one.type]


def default_text(one: Setting) -> str:
    """The default as a sweep file writes it (TOML), `unset` for none; nothing for a key inside a table that has
    no default of its own."""
    value = one.default
    if value is None:
        return "" if "." in one.name else "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def accepted_text(one: Setting) -> str:
    if one.range is not None:
        return one.range.describe()
    return "true or false" if one.type is bool else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def run_settings_markdown() -> str:
    """Every sweep setting, one row each, in the table's order."""
    lines = ["| setting | type | default | accepted | unit | meaning |", "|---|---|---|---|---|---|"]
    for one in SETTINGS:
        cells = [f"`{one.name}`", type_name(one), default_text(one), accepted_text(one), one.unit, one.meaning]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def simulate_settings_markdown() -> str:
    """The [simulate] table's ranges."""
    lines = ["| setting | accepted |", "|---|---|"]
    lines += [f"| `{key}` | {_cell(accepted.describe())} |" for key, accepted in SIMULATE_RANGES.items()]
    return "\n".join(lines) + "\n"


def plain() -> str:
    """Every sweep setting as a plain table (`syncbench schema --settings`)."""
    out = ["# sweep settings ([defaults], [grid]): name, type, default, unit, accepted values, meaning",
           "# (a dotted name is a key inside its table setting: link = { bandwidth = \"1Gbit\" })"]
    for one in SETTINGS:
        out.append(f"{one.name:20s} {type_name(one):10s} {default_text(one):11s} {one.unit:8s} "
                   f"{accepted_text(one):39s} {one.meaning}")
    return "\n".join(out) + "\n"


def render(page: str) -> str:
    """The page with each generated table replaced by the table's current text; ValueError when a marker is
    missing or doubled."""
    for (begin, end), table in ((RUN_MARKERS, run_settings_markdown()), (SIMULATE_MARKERS,
                                                                        simulate_settings_markdown())):
        if page.count(begin) != 1 or page.count(end) != 1 or page.index(begin) > page.index(end):
            raise ValueError(f"the page needs the lines {begin!r} and {end!r}, once each and in that order")
        head, rest = page.split(begin)
        _, tail = rest.split(end)
        page = f"{head}{begin}\n{table}{end}{tail}"
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.config.settings_doc", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", type=Path, metavar="PAGE", help="rewrite the page's generated tables")
    action.add_argument("--check", type=Path, metavar="PAGE", help="exit 1 when they are out of date")
    args = parser.parse_args(argv)
    path = args.write or args.check
    try:
        page = path.read_text()
        made = render(page)
    except (OSError, ValueError) as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 2
    if args.write:
        if made != page:
            path.write_text(made)
        print(f"{path}: {'rewritten' if made != page else 'up to date'}")
        return 0
    if made != page:
        print(f"{path}: its settings tables are out of date: run `{COMMAND}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
