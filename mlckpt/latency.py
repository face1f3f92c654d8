"""Per-request latency, IOPS and where an op's time goes (records format 7, rules 1.10).  Pure.

Each rank times every request it issues to storage in a timed op: one ``pwritev`` or ``preadv``
of up to ``io.block_size`` bytes, from its issue until its last byte (a short transfer's
continuation belongs to the same request).  The latencies of one rank's op go into its record as
a log-bucketed histogram (HdrHistogram, V2 encoding: 1 ns to 1 h, ``DIGITS`` significant
digits), ``requests: {count, hist}``.  Histograms merge exactly (bucket counts add), so every
percentile the summary reports is recomputed by the checker from the records; any value the
histogram gives back is within ``RELATIVE_ERROR`` of the latency it stands for.

``phases_ns`` splits the rank's op, in order, into what it did: for writes ``open`` (creating
the files), ``transfer`` (the requests), ``fsync`` (the files) and ``dir_fsync`` (the folder);
for restores ``open`` (opening and size checks) and ``transfer``.  Each is wall time on the
rank, its threads overlapping inside a phase.

Summary format 6 adds, per op kind over its durable-tier ops whose records all carry requests:
``{op}_latency_ms`` (count, p50, p90, p99, p99_9, max of every request of every rank and op),
``{op}_iops_mean`` (mean over ops of Σ_r requests ÷ the op's duration) and ``{op}_phases``
(for each phase, the mean over ops of the slowest rank's time in it).  Absent where the records
cannot give them: an asynchronous or tiered write's timed stall is not the durable tier's
requests (the runner records none there); object storage's requests are
timed by its client library, not here.
"""

from __future__ import annotations

import binascii
import ctypes
import functools
import statistics
import struct
import sys
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypedDict

import numpy as np
from hdrh.histogram import HdrHistogram
from pyhdrh import add_array as _hdr_add
from pyhdrh import decode as _hdr_decode

LOWEST_NS = 1
HIGHEST_NS = 3_600_000_000_000  # an hour: a request never takes longer than io.timeout_s allows
DIGITS = 2
RELATIVE_ERROR = 10.0 ** -DIGITS  # a value given back is within 1 % of the one recorded
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p99_9": 99.9}
WRITE_PHASES = ("open", "transfer", "fsync", "dir_fsync")
READ_PHASES = ("open", "transfer")
MAX_HIST_CHARS = 64 << 10  # a 2-digit histogram of any latencies encodes to a few KiB
_MAX_PAYLOAD = 4 << 20  # decompressed: the counts of a 1 ns..1 h, 2-digit histogram fit many times
_COOKIE_BASE = 0x1C849304  # the V2 compressed encoding's cookie, less its word-size bits
_ENCODING_BASE = 0x1C849303  # the cookie of the counts inside it, less the same bits
_PAYLOAD_HEAD = struct.Struct(">IIIIQQd")
_WRAPPER_HEAD = struct.Struct(">II")


def histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_NS, HIGHEST_NS, DIGITS)


class Requests(TypedDict):
    """A record's ``requests`` block: how many requests, and their latencies' HDR histogram
    (base64, compressed)."""

    count: int
    hist: str


def encode(latencies_ns: Iterable[int]) -> Requests | None:
    """A record's ``requests`` block (None when no request was made)."""
    h = histogram()
    n = 0
    for v in latencies_ns:
        h.record_value(min(max(int(v), LOWEST_NS), HIGHEST_NS))
        n += 1
    if n == 0:
        return None
    return {"count": n, "hist": h.encode().decode("ascii")}


def _payload(block: Mapping[str, object]) -> bytes:
    """A record's histogram, decompressed, once its size and settings are checked (so that a
    hostile one cannot make the decoder allocate more than a genuine one needs); ValueError saying
    what is wrong with it."""
    text = block.get("hist")
    if not isinstance(text, str) or len(text) > MAX_HIST_CHARS:
        raise ValueError(f"requests.hist: expected a histogram of at most {MAX_HIST_CHARS} characters")
    try:
        raw = binascii.a2b_base64(text, strict_mode=True)  # base64.b64decode(validate=True), less a wrapper
        cookie, length = _WRAPPER_HEAD.unpack_from(raw)
    except (ValueError, struct.error) as exc:
        raise ValueError(f"requests.hist: not an HdrHistogram encoding ({exc})") from None
    if cookie & ~0xF0 != _COOKIE_BASE & ~0xF0 or length != len(raw) - 8:
        raise ValueError("requests.hist: not an HdrHistogram V2 compressed encoding")
    inflate = zlib.decompressobj()
    try:
        payload = inflate.decompress(raw[8:], _MAX_PAYLOAD)
    except zlib.error as exc:
        raise ValueError(f"requests.hist: not an HdrHistogram encoding ({exc})") from None
    if inflate.unconsumed_tail or len(payload) < _PAYLOAD_HEAD.size:
        raise ValueError("requests.hist: its counts are larger than a histogram of this range holds")
    inner, _, _, digits, lowest, highest, _ = _PAYLOAD_HEAD.unpack_from(payload)
    if inner & ~0xF0 != _ENCODING_BASE:
        raise ValueError("requests.hist: not an HdrHistogram V2 encoding of counts")
    if (digits, lowest, highest) != (DIGITS, LOWEST_NS, HIGHEST_NS):
        raise ValueError(f"requests.hist: a histogram of {lowest}..{highest} ns with {digits} digits, "
                         f"expected {LOWEST_NS}..{HIGHEST_NS} ns with {DIGITS}")
    return payload


def _counted(block: Mapping[str, object], total: int) -> None:
    if total != block.get("count"):
        raise ValueError(f"requests.count {block.get('count')} but the histogram holds {total} requests")


def decode(block: Mapping[str, object]) -> HdrHistogram:
    """A record's histogram; ValueError saying what is wrong with it."""
    _payload(block)
    try:
        h = HdrHistogram.decode(block["hist"])
    except Exception as exc:  # the library's own exception types, whatever it raises
        raise ValueError(f"requests.hist: undecodable ({type(exc).__name__})") from None
    _counted(block, h.get_total_count())
    return h


class Block(NamedTuple):
    """What the rules ask of one block's histogram: its longest request (ns) and the lowest value
    of that request's bucket, and ``floor_ns``, the least its requests' latencies can add up to
    (each request counted at the lowest value of its bucket)."""

    top: int
    top_low: int
    floor_ns: int


# What a decode of each block found, kept by the block's id while its records are alive.  The
# histograms themselves are not kept (a run of 20,000 records would hold gigabytes of counts), only
# what the request rules ask of each, so a checker decodes every block once, for the summary's
# percentiles.
Seen = dict[int, Block]


def block_facts(histogram: HdrHistogram) -> Block:
    """A histogram's :class:`Block`."""
    top = histogram.get_max_value()
    low = histogram.get_lowest_equivalent_value
    floor = sum(item.count_at_value_iterated_to * low(item.value_iterated_to)
                for item in histogram.get_recorded_iterator())
    return Block(top, histogram.get_lowest_equivalent_value(top), floor)


@functools.cache
def _bucket_lows() -> np.ndarray:
    """The lowest value of every bucket of this module's histograms, by bucket index."""
    h = histogram()
    return np.array([h.get_lowest_equivalent_value(h.get_value_from_index(i)) for i in range(h.counts_len)],
                    dtype=np.float64)


def merged(blocks: Iterable[Mapping[str, object]], seen: Seen | None = None) -> HdrHistogram:
    """The blocks' histograms added up (ValueError at the first that is no histogram); ``seen``
    gets each block's :func:`block_facts`.  Exactly what :func:`decode` and ``HdrHistogram.add`` give
    (tests/unit/metrics/test_latency.py), with each block's counts decoded by the library's own
    varint decoder into one scratch array and added from there: no histogram object and no second
    inflate per block (half the cost of a large run's records)."""
    out = histogram()
    n, word = out.counts_len, out.word_size
    scratch = (ctypes.c_uint64 * n)()
    dst, src, size = ctypes.addressof(out.counts), ctypes.addressof(scratch), ctypes.sizeof(ctypes.c_uint64)
    bucket: dict[int, tuple[int, int]] = {}  # index -> its lowest and highest value (few distinct)
    lows, zero, top_all, count_all = sys.maxsize, False, out.max_value, 0
    head, memset = _PAYLOAD_HEAD.size, ctypes.memset
    counts, bucket_lows = np.ctypeslib.as_array(scratch), _bucket_lows()
    for b in blocks:
        payload = _payload(b)
        try:
            got = _hdr_decode(payload, head, src, n, word)
        except Exception as exc:  # the library's own exception types, whatever it raises
            raise ValueError(f"requests.hist: undecodable ({type(exc).__name__})") from None
        total, low_index, top_index = got["total"], got["min_nonzero_index"], got["max_nonzero_index"]
        if total != b.get("count"):
            _counted(b, total)
        top, top_low = (bucket.get(top_index) or _bucket(out, bucket, top_index))[::-1] if total else (0, 0)
        floor = 0
        if top_index >= 0:  # only the block's lowest to top buckets are set in the scratch array
            low = low_index if low_index > 0 else 0
            if seen is not None:  # exact: every product and sum stays below 2**53
                floor = int(counts[low:top_index + 1] @ bucket_lows[low:top_index + 1])
            _hdr_add(dst + low * size, src + low * size, top_index + 1 - low, word)
            memset(src + low * size, 0, (top_index + 1 - low) * size)
        if seen is not None:
            seen[id(b)] = Block(top, top_low, floor)
        count_all += total
        if top > top_all:
            top_all = top
        if total == 0 or low_index == 0:
            zero = True
        else:
            lows = min(lows, (bucket.get(low_index) or _bucket(out, bucket, low_index))[0])
    out.total_count += count_all
    out.max_value = top_all
    if zero or lows != sys.maxsize:  # as HdrHistogram.add leaves it: 0 once a block is empty or at 0
        out.min_value = 0 if zero else lows
    return out


def _bucket(histogram: HdrHistogram, cache: dict[int, tuple[int, int]], index: int) -> tuple[int, int]:
    """The lowest and the highest value of bucket ``index`` (the library's own arithmetic)."""
    if index not in cache:
        v = histogram.get_value_from_index(index)
        cache[index] = (histogram.get_lowest_equivalent_value(v), histogram.get_highest_equivalent_value(v))
    return cache[index]


def percentiles_ms(histogram: HdrHistogram) -> dict[str, float]:
    """count, p50, p90, p99, p99_9 and max (ms) of a histogram."""
    got = histogram.get_percentile_to_value_dict(list(PERCENTILES.values()))
    out: dict[str, float] = {"count": histogram.get_total_count()}
    out.update({name: got[p] / 1e6 for name, p in PERCENTILES.items()})
    out["max"] = histogram.get_max_value() / 1e6
    return out


def cdf_ms(histogram: HdrHistogram) -> tuple[list[float], list[float]]:
    """The histogram's distribution as (latency ms, fraction of requests at or under it): one point
    per bucket that holds requests, for a plot."""
    xs: list[float] = []
    ys: list[float] = []
    total = histogram.get_total_count()
    for item in histogram.get_recorded_iterator():
        xs.append(item.value_iterated_to / 1e6)
        ys.append(item.total_count_to_this_value / total)
    return xs, ys


def _op_duration_ns(recs: Sequence[Mapping[str, Any]]) -> int:
    return max(int(r["t1_ns"]) - int(r["t0_ns"]) for r in recs)


def summary(ops: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], seen: Seen | None = None
            ) -> dict[str, object]:
    """Summary format 6's latency, IOPS and phases, from ``(op kind, records of one op)`` pairs of
    durable-tier ops (see the module docstring); ``seen`` as :func:`merged`'s."""
    out: dict[str, object] = {}
    for kind, phases in (("write", WRITE_PHASES), ("read", READ_PHASES)):
        mine = [recs for op, recs in ops if op == kind]
        if not mine or any("requests" not in r for recs in mine for r in recs):
            continue
        try:
            everything = merged((r["requests"] for recs in mine for r in recs), seen)
        except ValueError:  # a histogram that is no evidence (RECORDS-REQUESTS says which): no figure
            continue
        out[f"{kind}_latency_ms"] = percentiles_ms(everything)
        if all(_op_duration_ns(recs) > 0 for recs in mine):  # (RESULT-TIMES names one that is not)
            out[f"{kind}_iops_mean"] = statistics.fmean(
                sum(int(r["requests"]["count"]) for r in recs) / (_op_duration_ns(recs) / 1e9)
                for recs in mine)
        if all("phases_ns" in r for recs in mine for r in recs):
            slowest = [max(recs, key=lambda r: int(r["t1_ns"]) - int(r["t0_ns"])) for recs in mine]
            out[f"{kind}_phases"] = {
                p: statistics.fmean(int(r["phases_ns"].get(p, 0)) / 1e9 for r in slowest) for p in phases}
    return out
