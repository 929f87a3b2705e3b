"""Reduction operators and the dtypes they accept, for strategies and plug-ins: the definitions live beneath the
strategies, in strategies/transport/ops.py (the transports reduce too, and never import the package above them).
"""

from strategies.transport.ops import (  # noqa: F401 - this module's public names
    ACCEPTED,
    ARITHMETIC,
    BITWISE,
    COMPLEX,
    FLOATS,
    HALF,
    INTEGERS,
    LOGICAL,
    OPS,
    check_op,
    finish_reduction,
    prescale,
    reduce_into,
    reference,
    wire_dtype,
    wire_form,
)
