"""Results: the typed schema of every run and step row, the append-only dataset they are written to, and the way
to load them: `from experiments.results import load_runs, load_steps` (every column, latest attempt only)."""

from experiments.results.export import load_runs, load_steps

__all__ = ["load_runs", "load_steps"]
