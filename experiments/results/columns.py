"""A results column and the Arrow types the tables use: below schema.py (the runs, steps and events tables) and
fault_tables.py (the failure runs' tables), which both build on them."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

STR, INT, FLOAT, BOOL = pa.string(), pa.int64(), pa.float64(), pa.bool_()
INTS = pa.list_(pa.int64())
TIME = pa.timestamp("ms", tz="UTC")  # Parquet has no seconds unit: ms round-trips
PARAM = "param_"  # prefix of the strategy parameter columns (param_norm, a schema column, is not one)
_SCALARS = {bool: BOOL, int: INT, float: FLOAT, str: STR}  # bool first: a bool is also an int


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    meaning: str
