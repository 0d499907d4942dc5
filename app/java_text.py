"""Java's text forms of JSON numbers, as DataHub's Java services write them (Jackson uses `Double.toString`)."""

from __future__ import annotations

import math
from decimal import Decimal


def java_double(value: float) -> str:
    """Java's `Double.toString`: plain decimal for 1e-3 <= |d| < 1e7, else d.dddE±n; the digits are the shortest
    that round-trip (Python's repr, as Java's since JDK 19)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e7:
        return repr(value)  # Python's repr is plain decimal with a fraction in this range, like Java's
    _, digits, exponent = Decimal(repr(magnitude)).as_tuple()
    assert isinstance(exponent, int)  # a finite value's (NaN and the infinities are returned above)
    digit_str = "".join(map(str, digits)).rstrip("0") or "0"
    sci_exponent = len(digits) - 1 + exponent
    mantissa = digit_str[0] + "." + (digit_str[1:] or "0")
    return ("-" if value < 0 else "") + f"{mantissa}E{sci_exponent}"
