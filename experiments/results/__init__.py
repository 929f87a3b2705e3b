"""Results: the typed schema of every run and step row, and the append-only dataset they are written to."""
