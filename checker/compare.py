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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from checker import imported
from checker.compare_rows import RESUME_ROWS, ROWS, SERVING_ROWS, Row
from checker.leaderboard import BundleDocs, Entry, entry_from_docs, read_bundle
from mlckpt import formats
from mlckpt.errors import BundleIntegrityError, ExitStatus, IntegrityError, UsageError

if TYPE_CHECKING:
    from mlckpt.bundle import TrustedKeys

COMPARE_FORMAT = formats.COMPARE.version


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
