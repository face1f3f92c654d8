"""Units: binary and decimal byte multiples, durations, bandwidths.  Pure.

Field names always carry their unit (``_bytes``, ``_s``, ``_gib_s``); GiB = 2**30 B (what MLPerf
publishes, labelled correctly), GB = 1e9 B.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12

_SIZE_UNITS = {
    "": 1, "b": 1, "k": KiB, "kib": KiB, "kb": KB, "m": MiB, "mib": MiB, "mb": MB,
    "g": GiB, "gib": GiB, "gb": GB, "t": TiB, "tib": TiB, "tb": TB,
}
_TIME_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_NUM = r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"


def fmt_bytes(n: float) -> str:
    """Human binary size, e.g. '104.70 GiB'."""
    for unit, mult in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= mult:
            return f"{n / mult:.2f} {unit}"
    return f"{int(n)} B"


def fmt_share(value: float, bound: float | None = None, digits: int = 0) -> str:
    """A fraction as a percentage with ``digits`` decimals, e.g. '95%', or more (up to 3) where it
    takes them not to read as the ``bound`` it is judged against: 0.953 against 0.95 is '95.3%',
    never '95%'."""
    text = f"{value:.{digits}%}"
    for shown in range(digits, 4):
        text = f"{value:.{shown}%}"
        if bound is None or value == bound or text != f"{bound:.{shown}%}":
            break
    return text


def fmt_io(io: object) -> str:
    """The I/O settings that change the numbers, in one phrase: 'O_DIRECT, 4 MiB requests, 4 in
    flight per rank' (a configuration's ``io`` block; '?' for what it lacks)."""
    io = io if isinstance(io, dict) else {}
    mode = "O_DIRECT" if io.get("direct") else "RWF_DONTCACHE" if io.get("dontcache") else "buffered"
    size = io.get("block_size")
    size_text = fmt_bytes(size).replace(".00 ", " ") if isinstance(size, int) and size > 0 else "?"
    return f"{mode}, {size_text} requests, {io.get('threads', '?')} in flight per rank"


def fmt_figure(v: float) -> str:
    """A figure for a table: four significant digits, never in e-notation (a time of 4.726e-05 s
    reads as a typo in an ops table; 0.0000473 does not)."""
    if v == 0 or abs(v) >= 1e-3:
        return f"{v:.4g}"
    return f"{v:.7f}".rstrip("0")


def fmt_bytes_both(n: float) -> str:
    """'104.70 GiB / 112.43 GB' — both conventions, since vendors and MLPerf differ."""
    dec = next(((u, m) for u, m in (("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB)) if n >= m),
               ("B", 1))
    return f"{fmt_bytes(n)} / {n / dec[1]:.2f} {dec[0]}"


def fmt_duration(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.2f} h"
    if s >= 60:
        return f"{s / 60:.2f} min"
    return f"{s:.2f} s"


def _quantity(text: str, suffix: str, units: Mapping[str, float], what: str, examples: str) -> float:
    """A number, a unit from ``units`` and the literal ``suffix`` (regex), e.g. '1.5 GiB' + '/s'."""
    m = re.fullmatch(_NUM + r"([A-Za-z]*)\s*" + suffix, str(text))
    if not m or m.group(2).lower() not in units:
        raise ValueError(f"not a {what}: {text!r} (examples: {examples})")
    return float(m.group(1)) * units[m.group(2).lower()]


def parse_size(text: str) -> int:
    """'4MiB' → 4194304; '1.5GB' → 1500000000; a bare number is bytes."""
    value = _quantity(text, "", _SIZE_UNITS, "size", "4096, 4MiB, 1.5GB")
    if not math.isfinite(value):
        raise ValueError(f"not a size: {text!r}")
    return round(value)


def parse_duration(text: str) -> float:
    """'30m' → 1800.0; '2h' → 7200.0; a bare number is seconds."""
    value = _quantity(text, "", _TIME_UNITS, "duration", "90, 30m, 1.5h")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"not a positive duration: {text!r}")
    return value


def parse_bandwidth(text: str) -> float:
    """'100GiB/s' or '100 GB/s' → bytes per second."""
    value = _quantity(text, r"/\s*s\s*", _SIZE_UNITS, "bandwidth", "100GiB/s, 25GB/s")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"not a positive bandwidth: {text!r}")
    return value


def parse_fraction(text: str) -> float:
    """'5%' → 0.05; '0.05' → 0.05; must lie in (0, 1)."""
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise ValueError(f"not a fraction: {text!r} (examples: 5%, 0.05)") from None
    if not 0 < value < 1:
        raise ValueError(f"fraction must be in (0, 1): {text!r}")
    return value
