"""A large run's record lines, read fast: msgspec where it reads a line exactly as the strict decoder
(:mod:`mlckpt.strict`) does, None where it may not (the strict decoder then decides and says why).
Pure; only :func:`mlckpt.strict.iter_jsonl` uses it."""

from __future__ import annotations

import math

import msgspec

# A text without 19 digits in a row holds no integer outside the signed 64-bit range.
_DIGITS = bytes(48 if 48 <= b <= 57 else 46 for b in range(256))  # every digit '0', the rest '.'
_LONG = b"0" * 19


def long_digits(line: bytes) -> bool:
    return _LONG in line.translate(_DIGITS)


class _NotFast(Exception):
    pass


def _fast_float(text: str) -> float:
    value = float(text)
    if value.is_integer() or not math.isfinite(value):
        raise _NotFast  # the strict decoder counts an integral float, and refuses a non-finite one
    return value


_fast = msgspec.json.Decoder(float_hook=_fast_float)


def fast_line(line: bytes, *, max_nodes: int, max_depth: int) -> object:
    """One record line decoded by msgspec, where that is exactly what :func:`mlckpt.strict.loads_json` gives
    (checks included, 11 µs a line against the strict decoder's 18); None where it may not be, and
    the strict decoder decides (and says why).  Only for a plain line (as ``mlckpt.strict._plain``: ASCII, no
    escape, so a string's text is the same in the line and in msgspec's encoding of what it
    decoded) without 19 digits in a row (no integer out of range).  Left to the strict decoder:
    anything msgspec refuses; a float that is integral (counted) or not finite; a key given twice,
    which msgspec keeps the last of: colons stand only in strings and after keys, so the line then
    has more than the decoded document's encoding."""
    if not (len(line) <= max_nodes and line.isascii() and b"\\" not in line
            and line.count(b"[") + line.count(b"{") < max_depth and not long_digits(line)):
        return None
    try:
        doc = _fast.decode(line)
    except (msgspec.DecodeError, _NotFast):
        return None
    if line.count(b":") != msgspec.json.encode(doc).count(b":"):
        return None
    return doc
