"""The leaderboard: results that pass the checker, as comparable tables.

    mlckpt-check leaderboard ROOT [--format md|csv|json|html] [--out PATH] [--trusted-keys FILE]
                                  [--jobs N]

Design (the pure core first, then a thin layer of effects at the bottom of this module):

- **Which results.**  Only bundles the checker passes (verdict ``closed`` or ``open``), judged
  in-process by :func:`checker.cli.check_tree` with the same trust rules as ``mlckpt-check ROOT``
  (``--trusted-keys FILE``, default ``ROOT/trusted-keys.yaml``).  The numbers shown are read from
  the very bytes the checker verified: each listed bundle is verified again, its signed statement
  must be the one the checker passed (``statement_sha256``), and every file read must match its
  signed digest; a bundle that changed in between is excluded.  Failing bundles are listed as
  excluded (path, verdict, rule IDs), never ranked.
- **Classes.**  A class is *division × workload × scale × checkpoint mode* where scale is
  ``full`` (``scale=1``) or ``scaled`` (``scale<1``, open division only) and the checkpoint mode
  is :attr:`mlckpt.pipeline.Pipeline.label`: ``sync``, ``sync+tiers``, ``async`` or
  ``async+tiers`` (all but ``sync`` open division only).  Results are ranked only within their
  class, so a closed full-scale result never shares a table with a scaled or an open one, and an
  asynchronous or tiered result never shares one with a synchronous one: their write bandwidth is
  the durable tier's persist in every mode, but only in sync mode does training wait for it (the
  Stall column says what training waited).  Classes are ordered closed before open, then
  canonical workloads (llama3 8B, 70B, 405B, 1T) before the others, smaller models first, then
  full before scaled, then sync, sync+tiers, async, async+tiers.
- **Order within a class.**  Write bandwidth (mean over the checkpoint writes, the MLPerf
  headline) descending; ties by read bandwidth descending, then result ID.  Missing values last.
- **Result IDs.**  ``XXXXX-XXXXX``: the first 50 bits of
  ``sha256("mlckpt-result-id-v1\\0org\\0system\\0workload\\0run_id")`` in RFC 4648 base32
  (letters and 2-7: no 0/O or 1/I confusion).  Derived, not allocated: the same result has the
  same ID in every build, adding or removing other bundles never changes it, and no map file
  has to be kept and merged.  The run id is the runner's random 64-bit id, and the checker
  refuses a run submitted twice (DUPLICATE-RUN), so two listed results never share an ID (a hash
  collision among them is reported as an internal error rather than printed).
- **Columns** (:data:`COLUMNS`): MLPerf Storage's published checkpoint columns (public ID,
  organisation, system, division, client nodes, processes, accelerator, write/read bandwidth in
  GiB/s and write/read duration in seconds, each the mean over ops) plus mlckpt's: the stall
  (what training waited per checkpoint) and the time to durable, the slowest rank's own
  bandwidth (mean over ops), the straggler ratio (the worst op of the run: slowest rank's
  duration ÷ median rank duration), the verification status of the reads and the mode
  (checkpoint mode, residency, I/O path, scale).  Writes are the durable tier's persist in every
  mode; reads are the restores from the durable tier only (restores a fast tier served are not
  storage reads of the durable tier: a run with none from the durable tier shows no read
  numbers).  Fixed decimals per column, units in the headers; the same rounded values appear in
  every output format.

Pure: :func:`entry_from_docs`, :func:`build`, :func:`result_id`; effects: :func:`collect`, the
command.  Rendering lives in :mod:`checker.render`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mlckpt.errors import InternalError, MlckptError, UsageError
from mlckpt.pipeline import DURABLE, Pipeline

LEADERBOARD_FORMAT = 2  # 2: classes split by checkpoint mode (ClassKey.pipeline); Stall, Time to durable
DIVISIONS = ("closed", "open")
SCALES = ("full", "scaled")
PIPELINES = ("sync", "sync+tiers", "async", "async+tiers")  # Pipeline.label, in class order
ID_DOMAIN = "mlckpt-result-id-v1"


# ----------------------------------------------------------------------------------------------
# Columns


@dataclass(frozen=True)
class Column:
    key: str
    name: str
    kind: str  # "text" | "int" | "num"
    decimals: int = 0
    unit: str = ""
    help: str = ""

    @property
    def label(self) -> str:
        """The header with its unit, as md, csv and json show it."""
        return f"{self.name} ({self.unit})" if self.unit else self.name

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "num")


COLUMNS: tuple[Column, ...] = (
    Column("result_id", "Result ID", "text",
           help="stable ID: derived from organisation, system, workload and run id"),
    Column("organisation", "Organisation", "text"),
    Column("system", "System", "text", help="the system description the result was measured on"),
    Column("division", "Division", "text"),
    Column("hosts", "Hosts", "int", help="client hosts (MLPerf: # client nodes)"),
    Column("ranks", "Ranks", "int", help="MPI ranks, one per simulated accelerator"),
    Column("accelerator", "Accelerator", "text",
           help="declared accelerator (accelerator=), else the system description's"),
    Column("write_gib_s", "Write", "num", 2, "GiB/s",
           help="checkpoint write bandwidth to the durable tier, mean over the writes (all ranks' bytes ÷ "
                "slowest rank's time; async or tiered: the persist that runs behind training)"),
    Column("write_duration_s", "Write duration", "num", 3, "s",
           help="mean time of one checkpoint's write to the durable tier"),
    Column("read_gib_s", "Read", "num", 2, "GiB/s",
           help="restore bandwidth from the durable tier, mean over those restores (cold, every byte "
                "verified; restores served by a fast tier are not counted)"),
    Column("read_duration_s", "Read duration", "num", 3, "s",
           help="mean time of one restore from the durable tier"),
    Column("stall_s", "Stall", "num", 3, "s",
           help="what training waited per checkpoint, mean over the writes (sync, one tier: the whole write; "
                "async: the copy into host memory; sync with tiers: the fast-tier write; plus any wait "
                "for the previous checkpoint's background work)"),
    Column("time_to_durable_s", "Time to durable", "num", 3, "s",
           help="from the checkpoint request until it is durable on the durable tier, mean over the writes "
                "(sync, one tier: the same as the stall)"),
    Column("write_slowest_rank_gib_s", "Slowest rank write", "num", 3, "GiB/s",
           help="the slowest rank's own write bandwidth to the durable tier, mean over the writes"),
    Column("read_slowest_rank_gib_s", "Slowest rank read", "num", 3, "GiB/s",
           help="the slowest rank's own read bandwidth, mean over the restores from the durable tier"),
    Column("straggler_ratio", "Straggler", "num", 2, "×",
           help="worst op of the run (durable-tier writes and restores): slowest rank's duration ÷ median "
                "rank duration (1 = no straggler)"),
    Column("verification", "Verification", "text",
           help="reads: every byte verified and read cold (page cache emptied, residency measured); "
                "how many restores a fast tier served"),
    Column("mode", "Mode", "text",
           help="checkpoint mode (sync / async; +tiers: written to a fast tier first, drained to the "
                "durable one in the background), residency (full state / stream), I/O path "
                "(direct / buffered / dontcache), scale"),
)
COLUMN = {c.key: c for c in COLUMNS}
SORT_NOTE = ("sorted by write bandwidth, highest first (ties: read bandwidth, then result ID); "
             "click a header to sort by another column")


def fmt(value: Any, col: Column, missing: str = "—") -> str:
    """``value`` as the tables print it: fixed decimals for numbers, ``missing`` for none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    if col.kind == "num":
        return f"{float(value):.{col.decimals}f}"
    if col.kind == "int":
        return str(int(value))
    return str(value)


def rounded(value: Any, col: Column) -> Any:
    """The value as published in JSON: exactly what :func:`fmt` prints, as a number."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    if col.kind == "num":
        return float(f"{float(value):.{col.decimals}f}")
    if col.kind == "int":
        return int(value)
    return str(value)


# ----------------------------------------------------------------------------------------------
# Result IDs


def result_id(org: str, system: str, workload: str, run_id: str) -> str:
    digest = hashlib.sha256("\0".join((ID_DOMAIN, org, system, workload, run_id)).encode()).digest()
    code = base64.b32encode(digest).decode("ascii")[:10]
    return f"{code[:5]}-{code[5:]}"


# ----------------------------------------------------------------------------------------------
# One result


@dataclass(frozen=True)
class ClassKey:
    division: str
    workload: str
    scale: str  # "full" | "scaled"
    pipeline: str = "sync"  # Pipeline.label: sync | sync+tiers | async | async+tiers

    @property
    def id(self) -> str:
        base = f"{self.division}-{self.workload}-{self.scale}"
        return base if self.pipeline == "sync" else f"{base}-{self.pipeline.replace('+', '-')}"

    @property
    def title(self) -> str:
        title = f"{self.workload} · {'full scale' if self.scale == 'full' else 'scaled'}"
        return title if self.pipeline == "sync" else f"{title} · {self.pipeline}"

    def describe(self) -> str:
        scale = "full scale" if self.scale == "full" else "scaled"
        return f"{self.division} division, {self.workload}, {scale}, {self.pipeline} checkpoints"


@dataclass(frozen=True)
class Entry:
    """A passing result: what the tables, charts and ``compare`` need, read from its bundle."""

    path: str  # the bundle, relative to the tree root (folder or .tar.gz)
    org: str
    system: str
    division: str
    workload: str
    run_id: str
    rules_version: str
    canonical: bool
    model_size: float  # parameters (orders workloads)
    hosts: int
    ranks: int
    accelerator: str | None
    scale: float
    residency: str
    io_mode: str  # direct | buffered | dontcache
    restore: str
    fsync: bool
    num_writes: int
    num_reads: int
    checkpoint_bytes: int
    restore_bytes: int
    read_cold: bool | None
    read_verified: bool | None
    metrics: Mapping[str, float] = field(default_factory=dict)  # summary numbers, nan if absent
    pipeline: str = "sync"  # Pipeline.label
    tiers: tuple[str, ...] = (DURABLE,)  # the write stages, in order (summary.json "tiers")
    compute_interval_s: float = 0.0
    fast_fs: tuple[str, ...] = ()  # the fast tier's filesystem type(s), as the runner measured
    fast_reads: int = 0  # restores not (or not only) from the durable tier

    @property
    def result_id(self) -> str:
        return result_id(self.org, self.system, self.workload, self.run_id)

    @property
    def scaled(self) -> bool:
        return self.scale != 1.0

    @property
    def class_key(self) -> ClassKey:
        return ClassKey(self.division, self.workload, "scaled" if self.scaled else "full", self.pipeline)

    def m(self, key: str) -> float:
        return float(self.metrics.get(key, math.nan))

    @property
    def straggler_ratio(self) -> float:
        vals = [v for v in (self.m("write_straggler_ratio_max"), self.m("read_straggler_ratio_max"))
                if math.isfinite(v)]
        return max(vals) if vals else math.nan

    @property
    def verification(self) -> str:
        if self.num_reads == 0:
            return "no reads"
        if not self.read_verified:
            return "not verified"
        if self.fast_reads >= self.num_reads:
            return "verified, all from the fast tier"
        text = "verified, cold" if self.read_cold else "verified, not cold"
        if self.fast_reads:
            text += f", {self.fast_reads} of {self.num_reads} from the fast tier"
        return text

    @property
    def mode(self) -> str:
        parts = [self.pipeline, self.residency, self.io_mode]
        if self.restore != "own":
            parts.append(f"restore {self.restore}")
        if not self.fsync:
            parts.append("no fsync")
        parts.append(f"scaled ×{self.scale:g}" if self.scaled else "full scale")
        return ", ".join(parts)

    def row(self) -> dict[str, Any]:
        """The table row: one value per column of :data:`COLUMNS` (numbers unrounded)."""
        return {
            "result_id": self.result_id, "organisation": self.org, "system": self.system,
            "division": self.division, "hosts": self.hosts, "ranks": self.ranks,
            "accelerator": self.accelerator,
            "write_gib_s": self.m("write_bandwidth_mean_gib_s"),
            "write_duration_s": self.m("write_duration_mean_s"),
            "read_gib_s": self.m("read_bandwidth_mean_gib_s"),
            "read_duration_s": self.m("read_duration_mean_s"),
            "stall_s": self.m("write_stall_mean_s"),
            "time_to_durable_s": self.m("write_time_to_durable_mean_s"),
            "write_slowest_rank_gib_s": self.m("write_slowest_rank_bandwidth_mean_gib_s"),
            "read_slowest_rank_gib_s": self.m("read_slowest_rank_bandwidth_mean_gib_s"),
            "straggler_ratio": self.straggler_ratio, "verification": self.verification,
            "mode": self.mode,
        }


# Summary numbers an Entry keeps (all optional: absent or null → nan).  ``read``: restores from
# the durable tier; ``read_fast``/``read_mixed``: restores a fast tier served (all or some ranks);
# ``write_memory``/``write_fast``: the stages before the durable one (mlckpt/metrics.py).
STATS = ("mean", "median", "stdev", "min", "max")
IO_GROUPS = ("write", "read", "read_fast", "read_mixed")
SUMMARY_NUMBERS = (
    *(f"{op}_{what}_{stat}_{unit}"
      for op in IO_GROUPS
      for what, unit in (("bandwidth", "gib_s"), ("duration", "s"), ("slowest_rank_bandwidth", "gib_s"))
      for stat in STATS),
    *(f"{op}_straggler_ratio_max" for op in IO_GROUPS),
    *(f"{op}_bytes_per_op" for op in IO_GROUPS),
    *(f"write_{stage}_{what}_{stat}_{unit}"
      for stage in ("memory", "fast")
      for what, unit in (("bandwidth", "gib_s"), ("duration", "s"))
      for stat in STATS),
    *(f"write_{what}_{stat}_s" for what in ("stall", "time_to_durable") for stat in STATS),
    "write_overlap_efficiency", "write_backpressure_ops", "write_backpressure_total_s",
    "write_compute_mean_s", "read_resident_fraction_max",
)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    v = float(value)
    return v if math.isfinite(v) else math.nan


def _get(doc: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(k)
    return doc


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = " ".join(str(value).split())
    return text[:64] if text else None


def model_size(model: Any) -> float:
    """Parameters of a transformer (SPEC §3 formula), to order workloads; nan if unknown."""
    try:
        h, layers = int(model["hidden_size"]), int(model["num_layers"])
        ffn, vocab = int(model["ffn_hidden_size"]), int(model["vocab_size"])
        heads, kv = int(model["num_attention_heads"]), int(model["num_kv_heads"])
        dkv = (h // heads) * kv
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return math.nan
    return float(vocab * h + layers * (h + h * (h + 2 * dkv) + h * h + h + 3 * ffn * h) + h + vocab * h)


def entry_from_docs(path: str, org: str, system: str, run: Mapping[str, Any], config: Mapping[str, Any],
                    summary: Mapping[str, Any], system_doc: Mapping[str, Any],
                    division: str | None = None) -> Entry:
    """An :class:`Entry` from a bundle's parsed, schema-valid documents.  ``division``: the one it
    is published in (its folder in the tree; a closed-eligible run may be submitted under open/),
    by default the run's own."""
    io_cfg = config.get("io") or {}
    io_mode = "direct" if io_cfg.get("direct") else "dontcache" if io_cfg.get("dontcache") else "buffered"
    accelerator = _text(config.get("accelerator")) or _text(
        _get(system_doc, "description", "clients", "accelerator"))
    workload = config.get("workload") or {}

    def flag(key: str) -> bool | None:
        v = summary.get(key)
        return v if isinstance(v, bool) else None

    pipe = Pipeline.of(config)
    tiers = summary.get("tiers")
    fast_fs = (_get(run, "pipeline", "fast_fs") or {}) if pipe.tiered else {}
    ops = summary.get("ops") or ()
    fast_reads = sum(1 for o in ops if isinstance(o, Mapping) and o.get("op") == "read"
                     and o.get("tier", DURABLE) != DURABLE)

    return Entry(
        path=path, org=org, system=system, division=division or str(run["division"]),
        workload=str(run["workload"]), run_id=str(run["run_id"]),
        rules_version=str(run.get("rules_version", "")),
        canonical=bool(workload.get("canonical", False)), model_size=model_size(workload.get("model")),
        hosts=len(run.get("hosts") or ()), ranks=int(run["ranks"]), accelerator=accelerator,
        scale=float(run["scale"]), residency=str(config.get("residency", "full")), io_mode=io_mode,
        restore=str(_get(config, "checkpoint", "restore") or "own"),
        fsync=bool(_get(config, "checkpoint", "fsync")),
        num_writes=int(summary.get("num_writes", 0)), num_reads=int(summary.get("num_reads", 0)),
        checkpoint_bytes=int(summary.get("checkpoint_bytes", 0)),
        restore_bytes=int(summary.get("restore_bytes", 0)),
        read_cold=flag("read_cold"), read_verified=flag("read_verified"),
        metrics={k: _number(summary.get(k)) for k in SUMMARY_NUMBERS},
        pipeline=pipe.label,
        tiers=tuple(str(t) for t in tiers) if isinstance(tiers, list) else tuple(pipe.stages),
        compute_interval_s=pipe.compute_interval_s,
        fast_fs=tuple(sorted({t for t in (_text(v) for v in fast_fs.values()) if t})),
        fast_reads=fast_reads,
    )


# ----------------------------------------------------------------------------------------------
# Tables


@dataclass(frozen=True)
class Excluded:
    path: str
    verdict: str
    rules: tuple[str, ...]  # rule IDs of the blocking findings
    reason: str = ""


@dataclass(frozen=True)
class ClassTable:
    key: ClassKey
    frame: pd.DataFrame  # one row per result, COLUMNS keys + EXTRA_FIELDS, in ranking order
    entries: tuple[Entry, ...]  # same order


@dataclass(frozen=True)
class Leaderboard:
    tables: tuple[ClassTable, ...]
    excluded: tuple[Excluded, ...] = ()
    rules_versions: tuple[str, ...] = ()

    @property
    def results(self) -> int:
        return sum(len(t.entries) for t in self.tables)

    @property
    def organisations(self) -> tuple[str, ...]:
        return tuple(sorted({e.org for t in self.tables for e in t.entries}))

    def divisions(self) -> list[tuple[str, list[ClassTable]]]:
        return [(d, [t for t in self.tables if t.key.division == d])
                for d in DIVISIONS if any(t.key.division == d for t in self.tables)]


EXTRA_FIELDS = ("bundle", "workload", "scale", "write_min_gib_s", "write_max_gib_s",
                "read_min_gib_s", "read_max_gib_s")


def _frame(entries: Sequence[Entry]) -> pd.DataFrame:
    rows = []
    for e in entries:
        row = e.row()
        row.update(bundle=e.path, workload=e.workload, scale=e.scale,
                   write_min_gib_s=e.m("write_bandwidth_min_gib_s"),
                   write_max_gib_s=e.m("write_bandwidth_max_gib_s"),
                   read_min_gib_s=e.m("read_bandwidth_min_gib_s"),
                   read_max_gib_s=e.m("read_bandwidth_max_gib_s"))
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[*(c.key for c in COLUMNS), *EXTRA_FIELDS])
    for c in COLUMNS:
        if c.kind == "num":
            frame[c.key] = frame[c.key].astype("float64")
        elif c.kind == "int":
            frame[c.key] = frame[c.key].astype("int64")
    return frame


def _workload_order(entries: Iterable[Entry]) -> dict[str, tuple[int, float, str]]:
    out: dict[str, tuple[int, float, str]] = {}
    for e in entries:
        size = e.model_size if math.isfinite(e.model_size) else math.inf
        key = (0 if e.canonical else 1, size, e.workload)
        out[e.workload] = min(out.get(e.workload, key), key)
    return out


def build(entries: Iterable[Entry], excluded: Iterable[Excluded] = (),
          rules_versions: Iterable[str] = ()) -> Leaderboard:
    """Group passing results into classes and rank each class (see the module docstring)."""
    entries = list(entries)
    seen: dict[str, Entry] = {}
    for e in entries:
        other = seen.setdefault(e.result_id, e)
        if other is not e:
            raise InternalError(f"result ID {e.result_id} would name both {other.path} and {e.path}")
    order = _workload_order(entries)
    groups: dict[ClassKey, list[Entry]] = {}
    for e in entries:
        groups.setdefault(e.class_key, []).append(e)

    def class_order(k: ClassKey) -> tuple[Any, ...]:
        div = DIVISIONS.index(k.division) if k.division in DIVISIONS else len(DIVISIONS)
        pipe = PIPELINES.index(k.pipeline) if k.pipeline in PIPELINES else len(PIPELINES)
        return (div, k.division, order[k.workload], SCALES.index(k.scale), pipe, k.pipeline)

    tables = []
    for key in sorted(groups, key=class_order):
        frame = _frame(groups[key])
        frame = frame.sort_values(["write_gib_s", "read_gib_s", "result_id"], ascending=[False, False, True],
                                  na_position="last", kind="mergesort").reset_index(drop=True)
        by_id = {e.result_id: e for e in groups[key]}
        tables.append(ClassTable(key, frame, tuple(by_id[i] for i in frame["result_id"])))
    excluded = tuple(sorted(excluded, key=lambda x: x.path))
    return Leaderboard(tuple(tables), excluded, tuple(sorted(set(rules_versions))))


def scaling_series(table: ClassTable) -> dict[tuple[str, str], list[tuple[int, float, float, int]]]:
    """Per (organisation, system) with results at two or more rank counts: (ranks, mean write
    GiB/s, mean read GiB/s, results) per rank count, ranks ascending (means over the results)."""
    by_sys: dict[tuple[str, str], dict[int, list[Entry]]] = {}
    for e in table.entries:
        by_sys.setdefault((e.org, e.system), {}).setdefault(e.ranks, []).append(e)
    out = {}
    for key in sorted(by_sys):
        points = by_sys[key]
        if len(points) < 2:
            continue
        series = []
        for ranks in sorted(points):
            es = points[ranks]
            w = [e.m("write_bandwidth_mean_gib_s") for e in es]
            r = [v for v in (e.m("read_bandwidth_mean_gib_s") for e in es) if math.isfinite(v)]
            series.append((ranks, sum(w) / len(w), sum(r) / len(r) if r else math.nan, len(es)))
        out[key] = series
    return out


# ----------------------------------------------------------------------------------------------
# Effects: reading the bundles the checker passed


READ_FILES = ("run.json", "config.yaml", "summary.json", "system.json")


@dataclass(frozen=True)
class BundleDocs:
    run: dict[str, Any]
    config: dict[str, Any]
    summary: dict[str, Any]
    system: dict[str, Any]
    statement_sha256: str
    keyid: str
    org: str | None


def is_archive(path: Path) -> bool:
    return path.name.endswith(".tar.gz")


class _Opened:
    """A bundle folder, unpacking an archive into a temporary folder removed on exit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp: str | None = None

    def __enter__(self) -> Path:
        from mlckpt import bundle

        if self.path.is_dir():
            return self.path
        self.tmp = tempfile.mkdtemp(prefix="mlckpt-lb-")
        try:
            root = bundle.safe_unpack(self.path, Path(self.tmp) / "bundle")
        except BaseException:
            self.__exit__()
            raise
        return bundle.find_bundle_root(root)

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def read_bundle(path: Path, trusted: Any = None) -> BundleDocs:
    """Verify the bundle at ``path`` (folder or .tar.gz) and parse the files the tables use, each
    checked against its signed digest, strictly (:mod:`checker.loading`) and against its JSON
    Schema.  Raises BundleIntegrityError (exit 3) or UsageError (not a bundle, malformed)."""
    from checker import loading
    from checker.stages import known_rules_versions
    from mlckpt import bundle
    from mlckpt.schemas import first_error

    with _Opened(path) as folder:
        if not os.path.lexists(folder / bundle.SIGNATURE_FILE):
            raise UsageError(f"{path}: not a bundle (no {bundle.SIGNATURE_FILE})")
        vb = bundle.verify_bundle(folder, trusted)
        docs: dict[str, Any] = {}
        for name in READ_FILES:
            if name not in vb.files:
                raise UsageError(f"{path}: {name}: not in the bundle")
            try:
                data = loading.read_capped(folder / name, loading.CAPS[name])
            except loading.ParseError as exc:
                raise UsageError(f"{path}: {name}: {exc}") from None
            if hashlib.sha256(data).hexdigest() != vb.files[name]:
                raise UsageError(f"{path}: {name}: changed since it was verified")
            try:
                doc = loading.parse_yaml(data) if name.endswith(".yaml") else loading.parse_json(data)
            except loading.ParseError as exc:
                raise UsageError(f"{path}: {name}: {exc}") from None
            if not isinstance(doc, dict):
                raise UsageError(f"{path}: {name}: not an object")
            docs[name] = doc
    version = docs["run.json"].get("rules_version")
    if version not in known_rules_versions():
        raise UsageError(f"{path}: run.json: unknown rules version {version!r}")
    for name, schema in zip(READ_FILES, ("run", "config", "summary", "system"), strict=True):
        problem = first_error(docs[name], schema, str(version))
        if problem:
            raise UsageError(f"{path}: {name}: {problem}")
    return BundleDocs(docs["run.json"], docs["config.yaml"], docs["summary.json"], docs["system.json"],
                      vb.statement_sha256, vb.keyid, vb.org)


def collect(root: Path, trusted: Any, *, jobs: int = 1) -> Leaderboard:
    """Check the tree in-process and build the leaderboard from the bundles that pass."""
    from checker.cli import check_tree

    report = check_tree(root, trusted, jobs=jobs)
    entries: list[Entry] = []
    excluded: list[Excluded] = []
    versions: set[str] = set()
    for b in report["bundles"]:
        if b["verdict"] not in DIVISIONS:
            rules = sorted({f["rule"] for f in b["findings"] if f["severity"] in ("invalid", "internal")})
            if b.get("integrity") == "failed":
                rules = sorted({f["rule"] for f in b["findings"]} & _integrity_rules()) or rules
            excluded.append(Excluded(b["path"], b["verdict"], tuple(rules)))
            continue
        try:
            docs = read_bundle(Path(root) / b["path"], trusted)
            if docs.statement_sha256 != b.get("statement_sha256"):
                raise UsageError("the bundle changed after the checker passed it")
            entry = entry_from_docs(b["path"], b["org"], b["system"], docs.run, docs.config,
                                    docs.summary, docs.system, division=b["division"])
        except (MlckptError, KeyError, TypeError, ValueError) as exc:
            excluded.append(Excluded(b["path"], "unreadable", (), str(exc).splitlines()[0][:200]))
            continue
        entries.append(entry)
        versions.add(entry.rules_version)
    return build(entries, excluded, versions)


def _integrity_rules() -> set[str]:
    from mlckpt.rules.checks.submission import INTEGRITY_RULES

    return set(INTEGRITY_RULES)


# ----------------------------------------------------------------------------------------------
# The command


FORMATS = ("md", "csv", "json", "html")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "leaderboard", help="publish tables of the results that pass the checker",
        description="Check every bundle under ROOT (as `mlckpt-check ROOT` does) and publish the "
        "passing results, one table per class (division × workload × full/scaled × checkpoint "
        "mode), ranked by write bandwidth.")
    p.add_argument("root", type=Path, metavar="ROOT", help="the submission tree")
    p.add_argument("--format", choices=FORMATS, default="md", help="output format (default: md)")
    p.add_argument("--out", type=Path, default=None, metavar="PATH",
                   help="write to PATH (default: stdout); html links to bundles relative to it")
    p.add_argument("--trusted-keys", type=Path, default=None, metavar="FILE",
                   help="organisation -> public keys (default: ROOT/trusted-keys.yaml)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="bundles checked in parallel (default: the number of CPUs)")
    p.set_defaults(func=cmd_leaderboard)


def _trusted(root: Path, given: Path | None) -> Any:
    from checker.cli import TRUSTED_KEYS_FILE
    from mlckpt.bundle import TrustedKeys

    path = given
    if path is None:
        path = root / TRUSTED_KEYS_FILE
        if not path.is_file():
            raise UsageError(f"no trusted keys: give --trusted-keys FILE or put {TRUSTED_KEYS_FILE} "
                             f"in {root}")
    return TrustedKeys.load(path)


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from checker import render

    root: Path = args.root
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder (expected a submission tree)")
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)
    if jobs < 1:
        raise UsageError(f"--jobs: must be at least 1, got {jobs}")
    if args.out is not None and (args.out.is_dir() or not args.out.parent.is_dir()):
        raise UsageError(f"--out {args.out}: not a file in an existing folder")
    trusted = _trusted(root, args.trusted_keys)
    board = collect(root, trusted, jobs=jobs)
    base = Path(os.path.abspath(args.out)).parent if args.out is not None else Path(os.path.abspath("."))
    links = {e.path: _link(Path(os.path.abspath(root)) / e.path, base, is_archive(Path(e.path)))
             for t in board.tables for e in t.entries}
    text = render.render(board, args.format, links=links)
    if args.out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        try:
            with open(args.out, "w", encoding="utf-8", newline="") as fh:
                fh.write(text)
        except OSError as exc:
            raise UsageError(f"--out {args.out}: cannot write: {exc.strerror or exc}") from None
    n, k = board.results, len(board.tables)
    note = f"leaderboard: {n} result{'s' if n != 1 else ''} in {k} class{'es' if k != 1 else ''}"
    if board.excluded:
        note += (f"; {len(board.excluded)} bundle{'s' if len(board.excluded) != 1 else ''} excluded "
                 f"(run `mlckpt-check {root}` for the findings)")
    if args.out is not None:
        note += f"; wrote {args.out}"
    print(note, file=sys.stderr)
    return 0


def _link(target: Path, base: Path, archive: bool) -> str:
    rel = os.path.relpath(target, base).replace(os.sep, "/")
    return rel if archive else rel + "/"

