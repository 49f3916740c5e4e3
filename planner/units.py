"""Unit constants, defined once: binary sizes for memory, decimal giga for bandwidths and datasheet sizes."""

from __future__ import annotations

KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40
GB = 10**9  # decimal: bandwidths in GB/s (the profiles' unit) and datasheet "GB"
