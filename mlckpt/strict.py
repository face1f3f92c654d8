"""The one bounded, strict loader of JSON, JSONL and YAML, used by everything that reads a file a
person or another program wrote: the runner (system description, rules data), the bundle code
(envelope, statement), trusted keys and the checker.  Every way a file can be malformed ends in a
:class:`ParseError` naming what is wrong (never another exception, never unbounded work).

What is refused, whatever the schema says:

- files larger than their cap (:data:`CAPS`), records.jsonl with more than
  :data:`MAX_RECORD_LINES` lines;
- bytes that are not UTF-8, JSON strings holding unpaired surrogates or NUL;
- JSON: duplicate keys, ``NaN``/``Infinity``, numbers that overflow a float (``1e999``),
  integers outside the signed 64-bit range;
- YAML: anchors and aliases (billion-laughs), tags other than the core ones, duplicate keys,
  non-string keys, timestamps, ``.nan``/``.inf``, binary;
- documents nested deeper than :data:`MAX_DEPTH` or with more than :data:`MAX_NODES` values.

Parsed documents hold only ``dict`` (string keys), ``list``, ``str``, ``int``, ``float``, ``bool``
and ``None``, so schema validation and the rules only ever see JSON data.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import yaml

from mlckpt.fastjson import fast_line, long_digits

T = TypeVar("T")

MiB = 1 << 20
CAPS: dict[str, int] = {
    "run.json": 16 * MiB,
    "summary.json": 16 * MiB,
    "system.json": 16 * MiB,
    "config.yaml": 1 * MiB,
    "records.jsonl": 512 * MiB,
    "witness.dsse.json": 32 * MiB,  # a transcript of 100,000 events
    "system-description": 1 * MiB,  # systems/<system>.yaml
}
MAX_RECORD_LINES = 10_000_000
MAX_DEPTH = 64
MAX_NODES = 1_000_000  # values in one JSON/YAML document (run.json of 1M ranks fits)
MAX_INT = 2**63 - 1
MIN_INT = -(2**63)
MAX_LINE_BYTES = 64 * 1024  # one record is ~300 bytes
LINE_NODES = 1000  # values in one line of a JSONL file

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class ParseError(ValueError):
    """The file cannot be accepted; ``str()`` says why (one line, no file name)."""


# ----------------------------------------------------------------------------------------------
# Reading


def read_capped(path: str | os.PathLike[str], cap: int) -> bytes:
    """The bytes of regular file ``path`` (never following a final symlink), at most ``cap``."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK)
    except OSError as exc:
        raise ParseError(_os_reason(exc)) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ParseError("not a regular file")
        if st.st_size > cap:
            raise ParseError(f"{st.st_size} bytes, larger than the limit of {cap} bytes")
        data = f.read(cap + 1)
    if len(data) > cap:
        raise ParseError(f"larger than the limit of {cap} bytes")
    return data


def _os_reason(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return "is a symlink"
    if exc.errno == errno.ENOENT:
        return "missing"
    return f"cannot read: {exc.strerror or exc}"


def decode_utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not valid UTF-8 (byte {exc.start})") from None


# ----------------------------------------------------------------------------------------------
# Shape of parsed data


def check_shape(doc: object, *, max_nodes: int = MAX_NODES) -> None:
    """Walk ``doc`` without recursion; ParseError on anything that is not plain, bounded JSON."""
    stack: list[tuple[object, int]] = [(doc, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise ParseError(f"more than {max_nodes} values")
        if depth > MAX_DEPTH:
            raise ParseError(f"nested deeper than {MAX_DEPTH} levels")
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, int):
            if not MIN_INT <= value <= MAX_INT:
                raise ParseError("integer outside the signed 64-bit range")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ParseError("non-finite number (NaN or infinity)")
        elif isinstance(value, str):
            _check_text(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise ParseError(f"non-string key {_short(k)}")
                _check_text(k)
                stack.append((v, depth + 1))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
        else:
            raise ParseError(f"value of type {type(value).__name__} (only JSON types are allowed)")


def _check_text(s: str) -> None:
    if "\x00" in s:
        raise ParseError("string holds a NUL character")
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise ParseError("string holds an unpaired surrogate") from None


_CONTROL = {0: None} | {c: " " for c in range(1, 32)} | {127: " "}


def mapping_at(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``doc[key]`` where it is a mapping, else an empty one (a block missing or malformed in an
    untrusted document reads as absent; the schemas say which)."""
    value = doc.get(key)
    return value if isinstance(value, Mapping) else {}


def printable(value: object) -> Any:
    """``value`` with every string in it (keys too) printable: NUL removed, every other control
    character (a terminal's escape codes, a newline) a space; nothing else changes.  For what a
    host reports about itself (Open MPI's library version ends in NUL), so that a bundle the
    runner writes is one the checker's strict parse accepts."""
    if isinstance(value, str):
        return value.translate(_CONTROL)
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable(v) for v in value]
    return value


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


# ----------------------------------------------------------------------------------------------
# JSON


def _pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)  # in C; a key given twice leaves fewer keys than pairs
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ParseError(f"duplicate key {_short(key)}")
            seen.add(key)
    return out


def _constant(name: str) -> object:
    raise ParseError(f"non-standard JSON constant {name}")


# How many integral floats (2.0, 1e3) the decoder has met: a caller that reads it before and after a
# decode knows whether the document holds one without walking it (the checker's fast schema path
# trusts only documents without).  It only grows; a racing thread can only make it look higher.
_integral = [0]


def integral_floats() -> int:
    return _integral[0]


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ParseError(f"number {text[:40]} overflows a double")
    if value.is_integer():
        _integral[0] += 1
    return value


def _int(text: str) -> int:
    # 2**63 has 19 digits: a longer text is refused before converting (called for every integer)
    if len(text) > 20 or not MIN_INT <= (value := int(text)) <= MAX_INT:
        raise ParseError("integer outside the signed 64-bit range")
    return value


_decoder = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float,
                            parse_int=_int)
# A text without 19 digits in a row holds no integer outside the signed 64-bit range: the C
# scanner's own integers then (a Python call for each of a record's ~18 integers was a fifth of
# reading a large run's records).
_short_ints = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float)


def loads_json(text: str, *, max_nodes: int = MAX_NODES, short_ints: bool = False) -> object:
    """Strict JSON text → data (see the module docstring).  ``short_ints``: the caller has seen
    that the text has no 19 digits in a row."""
    decoder = _short_ints if short_ints else _decoder
    doc = _refusing(lambda: decoder.decode(text), "JSON", _json_reason)
    if not _plain(text, max_nodes):
        check_shape(doc, max_nodes=max_nodes)
    return doc


def _plain(text: str, max_nodes: int) -> bool:
    """Whether ``text`` cannot hold anything :func:`check_shape` refuses that the decoder's hooks
    have not refused already (integers out of range, non-finite numbers, constants): at most
    ``max_nodes`` characters (a value takes one at least), fewer than MAX_DEPTH brackets (so no
    value deeper than MAX_DEPTH), ASCII and no escape (a NUL or an unpaired surrogate reaches a
    string only through an escape; a raw control character the decoder refuses).  A record line
    is plain: its walk (0.21 s of CPU over 20,480 records here, a fifth of reading them) is
    skipped."""
    return (len(text) <= max_nodes and text.isascii() and "\\" not in text
            and text.count("[") + text.count("{") < MAX_DEPTH)


def parse_json(data: bytes) -> Any:
    return loads_json(decode_utf8(data))


def iter_jsonl(data: bytes, *, max_lines: int | None = None, first_line: int = 1
               ) -> Iterator[tuple[int, Any]]:
    """(line number, object) of every line; ParseError naming the line on the first bad one.
    ``first_line``: the number of ``data``'s first line, where it is a part of a file."""
    if max_lines is None:
        max_lines = MAX_RECORD_LINES
    if data and not data.endswith(b"\n"):
        data += b"\n"  # a missing final newline is harmless
    start = 0
    lineno = first_line - 1
    end = len(data)
    while start < end:
        lineno += 1
        if lineno > max_lines:
            raise ParseError(f"more than {max_lines} lines")
        nl = data.index(b"\n", start)
        line = data[start:nl]
        start = nl + 1
        where = f"line {lineno}: "
        if len(line) > MAX_LINE_BYTES:
            raise ParseError(f"{where}longer than {MAX_LINE_BYTES} bytes")
        if not line.strip():
            raise ParseError(f"{where}empty line")
        doc = fast_line(line, max_nodes=LINE_NODES, max_depth=MAX_DEPTH)
        if doc is not None:
            yield lineno, doc
            continue
        try:
            short = not long_digits(line)
            yield lineno, loads_json(decode_utf8(line), max_nodes=LINE_NODES, short_ints=short)
        except ParseError as exc:
            raise ParseError(f"{where}{exc}") from None


# ----------------------------------------------------------------------------------------------
# YAML


_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available


class _StrictLoader(_BaseLoader):
    """SafeLoader refusing duplicate keys and the non-JSON core types (timestamps, binary, sets).
    Anchors, aliases and excessive nesting are refused from the event stream before composing
    (see :func:`loads_yaml`), so composing is bounded."""

    def construct_mapping(self, node: object, deep: bool = False) -> dict[object, object]:
        if isinstance(node, yaml.MappingNode):
            seen: set[object] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        None, None, "unhashable mapping key", key_node.start_mark) from None
                if dup:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {_short(key)}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _refuse(loader: Any, node: Any) -> Any:
    raise yaml.constructor.ConstructorError(None, None, f"tag {node.tag} is not allowed", node.start_mark)


for _tag in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:binary", "tag:yaml.org,2002:set",
             "tag:yaml.org,2002:omap", "tag:yaml.org,2002:pairs", "tag:yaml.org,2002:merge"):
    _StrictLoader.add_constructor(_tag, _refuse)

_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _scan_events(text: str, max_nodes: int) -> None:
    """Refuse anchors, aliases, explicit non-core tags, deep nesting and too many nodes from the
    event stream alone (libyaml's parser when available: no Python recursion, no expansion)."""
    depth = 0
    nodes = 0
    for event in yaml.parse(text, Loader=_BaseLoader):
        if isinstance(event, yaml.AliasEvent):
            raise ParseError(f"YAML alias *{_short(event.anchor)} is not allowed")
        if isinstance(event, yaml.NodeEvent):
            nodes += 1
            if nodes > max_nodes:
                raise ParseError(f"more than {max_nodes} values")
            if event.anchor is not None:
                raise ParseError(f"YAML anchor &{_short(event.anchor)} is not allowed")
            tag = getattr(event, "tag", None)
            if tag is not None and tag not in _CORE_TAGS and tag != "!":
                raise ParseError(f"YAML tag {_short(tag)} is not allowed")
        if isinstance(event, _OPEN):
            depth += 1
            if depth > MAX_DEPTH:
                raise ParseError(f"nested deeper than {MAX_DEPTH} levels")
        elif isinstance(event, _CLOSE):
            depth -= 1


_CORE_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq",
                                                         "map"))


def loads_yaml(text: str, *, max_nodes: int = MAX_NODES) -> Any:
    """Strict YAML text (one document) → data (see the module docstring)."""
    def load() -> list[object]:
        _scan_events(text, max_nodes)
        return list(yaml.load_all(text, Loader=_StrictLoader))  # a SafeLoader subclass

    docs = _refusing(load, "YAML", _yaml_reason)
    if len(docs) != 1:
        raise ParseError(f"expected exactly one YAML document, found {len(docs)}")
    check_shape(docs[0], max_nodes=max_nodes)
    return docs[0]


def _refusing(parse: Callable[[], T], kind: str, reason: Callable[[Exception], str | None]) -> T:
    """``parse()``, every way it fails one ParseError: ``reason`` says why (None: not a failure of
    the input, so it propagates)."""
    try:
        return parse()
    except ParseError:
        raise
    except RecursionError:
        raise ParseError(f"nested deeper than {MAX_DEPTH} levels") from None
    except Exception as exc:
        why = reason(exc)
        if why is None:
            raise
        raise ParseError(f"not valid {kind}: {why}") from None


def _json_reason(exc: Exception) -> str | None:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, ValueError):  # e.g. int digit limits
        return str(exc).splitlines()[0][:200]
    return None


def _yaml_reason(exc: Exception) -> str | None:
    if not isinstance(exc, yaml.YAMLError):
        # odd scalars (e.g. huge sexagesimal)
        return type(exc).__name__ if isinstance(exc, ValueError | TypeError | OverflowError) else None
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or type(exc).__name__
    mark = getattr(exc, "problem_mark", None)
    at = f" at line {mark.line + 1}" if mark is not None else ""
    return f"{str(problem)[:200]}{at}"


def parse_yaml(data: bytes) -> Any:
    return loads_yaml(decode_utf8(data))
