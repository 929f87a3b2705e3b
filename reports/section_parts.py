"""What a report section reads and returns (reports/sections.py): the results it reads, a table for the page, or
why this sweep has nothing for it. Kept below every section module, so that a section written in a module of its
own (reports/levels.py, ...) imports these without importing sections.py, which imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from markupsafe import Markup


@dataclass(frozen=True)
class Results:
    """What every section reads: all runs, the successful ones, steps, the sweep file and the links in order."""

    runs: pd.DataFrame
    ok: pd.DataFrame
    steps: pd.DataFrame | None
    sweep_text: str | None
    links: list[str]
    skipped: tuple[tuple[str, str], ...] = ()  # grid points `--skip-invalid` left out: (point, why)
    events: pd.DataFrame | None = None  # the traced steps' events (experiments/results/schema.py EVENTS)


@dataclass(frozen=True)
class Absent:
    """A section this sweep has nothing for, and why (one line in the page's closing list)."""

    reason: str


@dataclass(frozen=True)
class Table:
    """A table for the page: a frame, number formats per column, sortable or not. Numbers carry their value
    (data-v) so that sorting compares values, not text."""

    frame: pd.DataFrame
    formats: dict[str, str] = field(default_factory=dict)
    sortable: bool = False
    id: str = ""

    @property
    def columns(self) -> list[str]:
        return list(self.frame.columns)

    def rows(self):
        """Each row as cells (text, is a number, sort value or None)."""
        for row in self.frame.itertuples(index=False):
            cells = []
            for col, value in zip(self.frame.columns, row):
                if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
                    missing = pd.isna(value)
                    cells.append(("" if missing else format(value, self.formats.get(col, ",.4g")), True,
                                  None if missing else repr(float(value))))
                else:
                    cells.append(("" if value is None else str(value), False, None))
            yield cells


def figure(fig) -> Markup | None:
    """A figure as a <div> using the page's one copy of plotly.js (None: nothing to plot)."""
    if fig is None:
        return None
    return Markup(fig.to_html(full_html=False, include_plotlyjs=False,
                              config={"displaylogo": False, "responsive": True}))
