"""``mlckpt-check compare A B``: two result bundles side by side, metric by metric.

    mlckpt-check compare A B [--json] [--trusted-keys FILE]

A and B are bundle folders or packed ``.tar.gz`` bundles; one of them may be a DLIO or
mlpstorage result folder (``checker.imported``: labelled unverified, only the rows it states).
Both are first checked to *be* bundles (a folder holding ``bundle.dsse.json``, or a gzip archive)
or such a folder: otherwise one line and exit 2.  Then the bundles are verified (signature, every
file's digest, paths; with ``--trusted-keys`` the signer must also be registered): a failure is
one line naming the bundle and exit 3.  Only then are their files parsed (strictly, and against
their JSON Schemas).

Every numeric row shows A, B and the ratio B/A (``—`` when either is missing or A is 0).  This
is not the checker: a signed bundle can still break the rules; ``mlckpt-check ROOT`` judges that.
When the two results fall in different leaderboard classes (division × workload × full/scaled ×
checkpoint mode) the output says so: such numbers are not ranked against each other.

Asynchronous and tiered checkpoints (mlckpt/workload/pipeline.py): the checkpoint mode and write stages,
the stall (what training waited), the time to durable, the overlap efficiency, the back-pressure,
the measured training interval, the bandwidth and duration of each stage before the durable one
(``memory``, ``fast``), and the restores a fast tier served (``read_fast_*``; ``read_mixed_*``
when only some ranks read the fast tier).  ``write_*`` is always the durable tier's persist and
``read_*`` the restores from the durable tier, as in summary.json.  Rows that only some modes
have are shown when either bundle has a value.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from checker import imported
from checker.leaderboard import BundleDocs, Entry, entry_from_docs, read_bundle
from checker.leaderboard.numbers import LATENCY_POINTS
from mlckpt import formats
from mlckpt.errors import BundleIntegrityError, ExitStatus, IntegrityError, UsageError
from mlckpt.units import GiB, MiB

if TYPE_CHECKING:
    from mlckpt.bundle import TrustedKeys

COMPARE_FORMAT = formats.COMPARE.version


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str
    decimals: int | None  # None: text
    get: Callable[[Entry, BundleDocs], object]
    optional: bool = False  # shown only when either side has a value


def _opt(key: str, label: str, unit: str, decimals: int | None) -> Row:
    return Row(key, label, unit, decimals, _m(key), optional=True)


def _m(key: str) -> Callable[[Entry, BundleDocs], object]:
    return lambda e, d: e.m(key)


# The I/O settings that change the numbers: two runs at 4 MiB × 4 and 1 MiB × 16 are not alike.
IO_ROWS = (
    Row("io_mode", "I/O mode", "", None, lambda e, d: e.io_mode),
    Row("io_block_mib", "I/O request size", "MiB", 3,
        lambda e, d: None if e.io_block_size is None else e.io_block_size / MiB),
    Row("io_threads", "I/O requests in flight per rank", "", 0, lambda e, d: e.io_threads),
)


def _rows() -> tuple[Row, ...]:
    rows = [
        Row("workload", "workload", "", None, lambda e, d: e.workload),
        Row("division", "division", "", None, lambda e, d: e.division),
        Row("class", "leaderboard class", "", None, lambda e, d: e.class_key.id),
        Row("system", "system", "", None, lambda e, d: d.run.get("system_name") or "—"),
        Row("verdict", "verdict (recorded by the runner)", "", None, lambda e, d: d.run.get("verdict")),
        Row("mode", "mode", "", None, lambda e, d: e.mode),
        Row("pipeline", "checkpoint mode", "", None, lambda e, d: e.pipeline),
        Row("tiers", "write stages", "", None, lambda e, d: " → ".join(e.tiers)),
        Row("fast_fs", "fast tier filesystem", "", None, lambda e, d: ", ".join(e.fast_fs) or None,
            optional=True),
        Row("verification", "verification", "", None, lambda e, d: e.verification),
        *IO_ROWS,
        Row("ranks", "ranks", "", 0, lambda e, d: e.ranks),
        Row("hosts", "hosts", "", 0, lambda e, d: e.hosts),
        Row("num_writes", "checkpoint writes", "", 0, lambda e, d: e.num_writes),
        Row("num_reads", "restores", "", 0, lambda e, d: e.num_reads),
        Row("checkpoint_gib", "checkpoint size", "GiB", 3, lambda e, d: e.checkpoint_bytes / GiB),
        Row("restore_gib", "bytes read per restore", "GiB", 3, lambda e, d: e.restore_bytes / GiB),
        Row("fast_reads", "restores served by a fast tier", "", 0,
            lambda e, d: e.fast_reads if e.pipeline.endswith("+tiers") else None, optional=True),
        Row("compute_interval_s", "training interval (configured)", "s", 3,
            lambda e, d: e.compute_interval_s),
        Row("write_compute_mean_s", "training interval (measured, mean)", "s", 3, _m("write_compute_mean_s"),
            optional=True),
        # rules 1.11: a library writer, and its figures over the engine's of the same run
        Row("framework", "framework writer", "", None, lambda e, d: e.framework, optional=True),
        _opt("framework_write_ratio", "write bandwidth / the engine's in the same run", "×", 2),
        _opt("framework_read_ratio", "read bandwidth / the engine's in the same run", "×", 2),
    ]
    for op in ("write", "read"):
        rows += _op_rows(op)
        if op == "write":
            rows += _pipeline_rows()
    for tier in ("fast", "mixed"):
        name, label = f"read_{tier}", f"read ({tier} tier)" if tier == "fast" else "read (mixed tiers)"
        for stat in ("mean", "median", "min", "max", "stdev"):
            rows.append(_opt(f"{name}_bandwidth_{stat}_gib_s", f"{label} bandwidth {stat}", "GiB/s", 2))
        for stat in ("mean", "median", "min", "max"):
            rows.append(_opt(f"{name}_duration_{stat}_s", f"{label} duration {stat}", "s", 3))
        for stat in ("mean", "min"):
            rows.append(_opt(f"{name}_slowest_rank_bandwidth_{stat}_gib_s",
                             f"{label} slowest rank bandwidth {stat}", "GiB/s", 3))
        rows.append(_opt(f"{name}_straggler_ratio_max", f"{label} straggler ratio max", "×", 2))
    return tuple(rows)


def _op_rows(op: str) -> list[Row]:
    """One op kind's figures: bandwidth and duration, the slowest rank, bytes, IOPS and latency."""
    rows = [Row(f"{op}_bandwidth_{stat}_gib_s", f"{op} bandwidth {stat}", "GiB/s", 2,
                _m(f"{op}_bandwidth_{stat}_gib_s")) for stat in ("mean", "median", "min", "max", "stdev")]
    rows += [Row(f"{op}_duration_{stat}_s", f"{op} duration {stat}", "s", 3, _m(f"{op}_duration_{stat}_s"))
             for stat in ("mean", "median", "min", "max")]
    for stat in ("mean", "min"):
        key = f"{op}_slowest_rank_bandwidth_{stat}_gib_s"
        rows.append(Row(key, f"{op} slowest rank bandwidth {stat}", "GiB/s", 3, _m(key)))
    rows.append(Row(f"{op}_straggler_ratio_max", f"{op} straggler ratio max", "×", 2,
                    _m(f"{op}_straggler_ratio_max")))
    rows.append(Row(f"{op}_gib_per_op", f"{op} bytes per op", "GiB", 3,
                    lambda e, d: e.m(f"{op}_bytes_per_op") / GiB))
    rows.append(_opt(f"{op}_iops_mean", f"{op} IOPS (requests per second), mean", "/s", 0))
    rows += [_opt(f"{op}_latency_{point}_ms", f"{op} request latency {point.replace('_', '.')}", "ms", 3)
             for point in LATENCY_POINTS]
    return rows


def _pipeline_rows() -> list[Row]:
    """What training saw of the checkpoints, and the stages before the durable one."""
    rows = []
    for what, label in (("stall", "write stall"), ("time_to_durable", "write time to durable")):
        for stat in ("mean", "median", "min", "max"):
            rows.append(_opt(f"write_{what}_{stat}_s", f"{label} {stat}", "s", 3))
    rows += [
        Row("goodput_pct", "goodput at the rules version's reference job (mlckpt goodput)", "%", 1,
            lambda e, d: 100 * e.m("goodput"), optional=True),
        _opt("write_overlap_efficiency", "write overlap efficiency", "", 3),
        _opt("write_backpressure_ops", "writes that waited for the previous one (back-pressure)", "", 0),
        _opt("write_backpressure_total_s", "write back-pressure total", "s", 3),
        _opt("write_compute_mean_s", "training interval measured, mean", "s", 3),
    ]
    for stage in ("memory", "fast"):
        for stat in ("mean", "min", "max"):
            rows.append(_opt(f"write_{stage}_bandwidth_{stat}_gib_s", f"write {stage} stage bandwidth {stat}",
                             "GiB/s", 2))
        for stat in ("mean", "max"):
            rows.append(_opt(f"write_{stage}_duration_{stat}_s", f"write {stage} stage duration {stat}",
                             "s", 3))
    return rows


ROWS = _rows()


# What a serving or resume result shares with a checkpoint run's rows: the run, its I/O settings.
RUN_KEYS = ("workload", "division", "class", "system", "verdict", "mode", "verification", "ranks", "hosts",
            *(r.key for r in IO_ROWS))


def _serving_rows() -> tuple[Row, ...]:
    """Two serving results (rules 1.13): the run, then the loads' figures."""
    def serving(i: int) -> Callable[[Entry, BundleDocs], object]:
        return lambda e, d: e.serving[i] if e.serving else None

    return (*(r for r in ROWS if r.key in RUN_KEYS),
            Row("strategy", "loading strategy", "", None, serving(0)),
            Row("replicas", "replicas", "", 0, serving(1)),
            Row("tp", "GPUs per replica", "", 0, serving(2)),
            Row("ready_s_median", "time to ready, median", "s", 3, _m("ready_s_median")),
            Row("ready_s_min", "time to ready, fastest load", "s", 3, _m("ready_s_min")),
            Row("ready_s_max", "time to ready, slowest load", "s", 3, _m("ready_s_max")),
            Row("effective_gb_s", "effective loading rate", "GB/s", 2, _m("effective_gb_s")),
            Row("placed_gb", "bytes placed in the replicas per load", "GB", 3,
                lambda e, d: e.m("placed_bytes") / 1e9),
            Row("storage_gb", "bytes the storage served per load", "GB", 3,
                lambda e, d: e.m("storage_bytes") / 1e9),
            Row("storage_gb_s", "storage rate", "GB/s", 2, _m("storage_gb_s")))


SERVING_ROWS = _serving_rows()


# Two resume results (rules 1.21): the run, then the resumes' figures.
RESUME_ROWS: tuple[Row, ...] = (
    *(r for r in ROWS if r.key in RUN_KEYS),
    Row("layouts", "layouts (written → resumed)", "", None, lambda e, d: e.layouts or None),
    *(Row(f"resume_s_{k}", f"time to resume, {what}", "s", 3, _m(f"ready_s_{k}"))
      for k, what in (("median", "median"), ("min", "fastest"), ("max", "slowest"))),
    *(Row(f"{p}_s_median", f"{p}, slowest rank, median", "s", 4, _m(f"{p}_s_median"))
      for p in ("metadata", "planning", "read", "placing")),
    Row("rate_gb_s", "resume rate (state placed per second)", "GB/s", 2, _m("rate_gb_s")),
    Row("state_gb", "state placed per resume", "GB", 3, lambda e, d: e.m("state_bytes") / 1e9),
    Row("read_gb", "bytes read per resume", "GB", 3, lambda e, d: e.m("read_bytes") / 1e9),
    Row("amplification", "bytes read ÷ state placed", "×", 3, _m("amplification")))


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _cell(v: Any, row: Row) -> str:
    if row.decimals is None:
        return "—" if v is None else str(v)
    if not _finite(v):
        return "—"
    return f"{v:.{row.decimals}f}" if row.decimals else str(int(v))


def _ratio(a: Any, b: Any) -> float | None:
    if not (_finite(a) and _finite(b)) or a == 0:
        return None
    return b / a


def _is_bundle(path: Path, which: str) -> None:
    if path.is_dir():
        from mlckpt.bundle import SIGNATURE_FILE

        if not os.path.lexists(path / SIGNATURE_FILE):
            raise UsageError(f"{which} {path}: not a bundle (a bundle folder holds {SIGNATURE_FILE})")
        return
    if not path.is_file():
        raise UsageError(f"{which} {path}: no such bundle folder or archive")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
    except OSError as exc:
        raise UsageError(f"{which} {path}: cannot read: {exc.strerror or exc}") from None
    if magic != b"\x1f\x8b":
        raise UsageError(f"{which} {path}: not a bundle (neither a bundle folder nor a .tar.gz)")


def _is_foreign(path: Path, which: str) -> bool:
    """A DLIO / mlpstorage result folder (True) or a bundle (False); else one line, exit 2."""
    from mlckpt.bundle import SIGNATURE_FILE

    if path.is_dir() and not os.path.lexists(path / SIGNATURE_FILE) and imported.is_foreign(path):
        return True
    _is_bundle(path, which)
    return False


def _load(path: Path, which: str, trusted: TrustedKeys | None,
          witnesses: TrustedKeys | None = None) -> BundleDocs:
    try:
        return read_bundle(path, trusted, witnesses, witness=True)
    except BundleIntegrityError as err:
        raise IntegrityError(f"{which} {path}: integrity failure: {err.summary}") from None
    except IntegrityError as err:
        raise IntegrityError(f"{which} {path}: integrity failure: {err}") from None
    except UsageError as err:
        raise UsageError(f"{which} {err}") from None


def compare(a: tuple[str, BundleDocs], b: tuple[str, BundleDocs]) -> dict[str, object]:
    """The comparison as a JSON-ready dict (pure).  A side without a key id is a DLIO or
    mlpstorage result folder (checker.imported): unverified, and labelled so."""
    sides = []
    for path, docs in (a, b):
        entry = entry_from_docs(path, docs.org or "", str(docs.run.get("system_name") or ""), docs.run,
                                docs.config, docs.summary, docs.system, goodput=docs.goodput)
        sides.append((path, docs, entry))
    metrics = []
    rows = (SERVING_ROWS if any(e.serving is not None for _, _, e in sides) else
            RESUME_ROWS if any(e.resume is not None for _, _, e in sides) else ROWS)
    for row in rows:
        va, vb = (_value(row, e, d) for _, d, e in sides)
        if row.decimals is not None:
            va = va if _finite(va) else None
            vb = vb if _finite(vb) else None
        if row.optional and va is None and vb is None:
            continue
        metrics.append({"key": row.key, "label": row.label, "unit": row.unit or None, "a": va, "b": vb,
                        "ratio_b_over_a": _ratio(va, vb) if row.decimals is not None else None})
    ea, eb = sides[0][2], sides[1][2]
    return {
        "compare_format": COMPARE_FORMAT,
        "a": _side(sides[0]), "b": _side(sides[1]),
        "same_class": ea.class_key == eb.class_key and bool(sides[0][1].keyid and sides[1][1].keyid),
        "differences": differences(ea, eb) if sides[0][1].keyid and sides[1][1].keyid else [],
        "metrics": metrics,
    }


# What makes two results unlike: a ratio between them measures the difference as much as the storage.
UNLIKE: tuple[tuple[str, Callable[[Entry], str]], ...] = (
    ("workload", lambda e: e.workload),
    ("scale", lambda e: "full" if not e.scaled else f"×{e.scale:g}"),
    ("rules", lambda e: e.rules_version),
    ("division", lambda e: e.division),
    ("checkpoint mode", lambda e: e.pipeline),
    ("I/O settings", lambda e: e.io_text),
)


def differences(a: Entry, b: Entry) -> list[dict[str, str]]:
    """Each way two results are unlike (``UNLIKE``), with A's and B's value (pure)."""
    return [{"what": what, "a": get(a), "b": get(b)} for what, get in UNLIKE if get(a) != get(b)]


def _value(row: Row, entry: Entry, docs: BundleDocs) -> object:
    if docs.keyid:
        return row.get(entry, docs)
    if row.key == "verification":  # a DLIO / mlpstorage folder: what it states, nothing guessed
        return "none (DLIO verifies no page)"
    return row.get(entry, docs) if row.key in docs.run.get("stated", ()) else None


def _side(side: tuple[str, BundleDocs, Entry]) -> dict[str, object]:
    path, docs, entry = side
    return {"path": path, "run_id": entry.run_id, "name": docs.run.get("name"), "keyid": docs.keyid or None,
            "org": docs.org, "class": entry.class_key.id if docs.keyid else None,
            "started": docs.run.get("started"),
            "verified": bool(docs.keyid), "source": "mlckpt bundle" if docs.keyid else imported.LABEL,
            "witness": docs.witness}


def render_text(result: dict[str, Any]) -> str:
    a, b = result["a"], result["b"]

    def head(name: str, side: dict[str, Any]) -> str:
        if not side["verified"]:
            return f"{name}: {side['path']} ({side['source']})"
        return f"{name}: {side['path']} (run {side['run_id']}{', org ' + side['org'] if side['org'] else ''})"

    out = [head("A", a), head("B", b), ""]
    by_key = {r.key: r for r in (*ROWS, *SERVING_ROWS, *RESUME_ROWS)}
    text_rows, num_rows = [], []
    for m in result["metrics"]:
        row = by_key[m["key"]]
        if row.decimals is None:
            text_rows.append([m["label"], _cell(m["a"], row), _cell(m["b"], row)])
            continue
        ratio = m["ratio_b_over_a"]
        label = f"{m['label']} ({row.unit})" if row.unit else m["label"]
        shown = "—" if ratio is None else f"{ratio:.3f}"
        num_rows.append([label, _cell(m["a"], row), _cell(m["b"], row), shown])
    out.append(tabulate(text_rows, headers=["run", "A", "B"], tablefmt="simple", disable_numparse=True))
    out.append("")
    out.append(tabulate(num_rows, headers=["metric", "A", "B", "B/A"], tablefmt="simple",
                        colalign=("left", "right", "right", "right"), disable_numparse=True))
    if result["differences"]:
        unlike = ", ".join(f"{d['what']} ({d['a']} vs {d['b']})" for d in result["differences"])
        out += ["", f"warning: A and B differ in {unlike}: the ratios compare unlike runs, not only "
                    "their storage"]
    if not result["same_class"] and a["verified"] and b["verified"]:
        if not result["differences"]:
            out.append("")
        out.append(f"note: A is in class {a['class']}, B in {b['class']}: the leaderboard never ranks "
                   "these against each other")
    for name, side in (("A", a), ("B", b)):
        w = side.get("witness")
        if w:
            out.append(f"note: {name} {_witness_text(w)}")
    for name, side in (("A", a), ("B", b)):
        if not side["verified"]:
            out.append(f"note: {name} is not an mlckpt bundle: nothing of it is signed or recomputed, its "
                       "durations are rank 0's (mlckpt's: the slowest rank's), its restores may have read "
                       "the page cache, and no page was verified")
    out.append("note: compare verifies integrity only; `mlckpt-check ROOT` judges the rules")
    return "\n".join(out) + "\n"


def _witness_text(w: dict[str, object]) -> str:
    if w["status"] != "witnessed":
        return f"asked {w['endpoint']} to witness it; the witness was lost, it is not witnessed"
    if w["transcript"] != "signature holds":
        return f"says {w['endpoint']} witnessed it, but its transcript: {w['transcript']}"
    who = (f"{w['by']} (a trusted witness)" if w["by"]
           else f"key {str(w['keyid'])[:16]}… (not checked as trusted)")
    keys = (("write", "write_bandwidth_witnessed_mean_gib_s"),
            ("read", "read_bandwidth_witnessed_mean_gib_s"))
    figs = [f"{op} ≥ {w[k]:.2f} GiB/s" for op, k in keys if k in w]
    return f"witnessed by {who}: {', '.join(figs) or 'no ops'} by the witness's clock"


# ----------------------------------------------------------------------------------------------
# The command


def cmd_compare(args: argparse.Namespace) -> int:
    from mlckpt.bundle import WITNESSES, TrustedKeys

    trusted = TrustedKeys.load(args.trusted_keys) if args.trusted_keys is not None else None
    witnesses = (TrustedKeys.load(args.trusted_witnesses, WITNESSES)
                 if args.trusted_witnesses is not None else None)
    sides = [(path, which, _is_foreign(path, which)) for path, which in ((args.a, "A"), (args.b, "B"))]
    # Both are known to be bundles or result folders before either is verified or read.
    da, db = (imported.load_foreign(path, which) if other else _load(path, which, trusted, witnesses)
              for path, which, other in sides)
    if not (da.keyid or db.keyid):
        raise UsageError("compare needs at least one mlckpt bundle (both are DLIO / mlpstorage folders)")
    result = compare((str(args.a), da), (str(args.b), db))
    if args.json:
        sys.stdout.write(json.dumps(result, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    else:
        sys.stdout.write(render_text(result))
    sys.stdout.flush()
    return ExitStatus.OK
