"""`mlckpt report BUNDLE [--html FILE] [--csv FILE]`: one run's report (its tables in the terminal,
an offline page with its charts, its ops as CSV), from the records in its result folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlckpt.errors import ExitStatus, UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="one run's report: tables, an offline page with charts, CSV",
                       description="Print a result folder's report: what ran, the verdict and findings, "
                       "one row per op (duration, bandwidth, IOPS, request latency percentiles, where the "
                       "time went), the latency of every request; with --html an offline page with the op "
                       "timeline, each rank's duration per op and the latency CDF; with --csv the ops.")
    p.add_argument("bundle", type=Path, help="a run's result folder (mlckpt run's bundle)")
    p.add_argument("--html", type=Path, default=None, metavar="FILE", help="write the page here")
    p.add_argument("--csv", type=Path, default=None, metavar="FILE", help="write one row per op here")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from mlckpt.report import files, model, page, text

    folder: Path = args.bundle
    try:
        rep = model.with_signature(files.read(folder), signature_status(folder))
    except ValueError as exc:
        raise UsageError(f"{folder}: {exc}", key="bundle") from None
    print(text.render(rep), end="")
    for path, body in ((args.html, lambda: page.render(rep)), (args.csv, lambda: text.csv_text(rep))):
        if path is not None:
            try:
                path.write_text(body(), encoding="utf-8")
            except OSError as exc:
                raise UsageError(f"{path}: cannot write it ({exc.strerror or exc})", key="--html") from None
            print(f"wrote {path}")
    return ExitStatus.OK


def signature_status(folder: Path) -> str:
    """Whether the bundle's signature holds (against the key it names: whether that key is trusted
    is a checker's question)."""
    from mlckpt import bundle
    from mlckpt.errors import BundleIntegrityError

    if not (folder / "bundle.dsse.json").is_file():
        return "unsigned"
    try:
        vb = bundle.verify_bundle(folder)
    except BundleIntegrityError as exc:
        return f"does not hold: {str(exc).splitlines()[0]}"
    return f"holds, by key fingerprint {vb.keyid[:16]} (trust is mlckpt-check's question)"
