"""``fp``: the unquantized reference. Writes empty params so the DAG is uniform."""
from __future__ import annotations

from .base import QuantMethod


class FPMethod(QuantMethod):
    type_name = "fp"
    quantizes = False
