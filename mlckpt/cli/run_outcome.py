"""`mlckpt run --json`: the run's outcome as one JSON line on stdout, for scripts (the human lines
go to stderr). A launch's ranks say which bundle they wrote through a file named in
``OUTCOME_ENV`` (rank 0 appends one line per run: a disturbed run retried writes one per try); the
figures are read back from that bundle, so they are the bundle's own numbers, never recomputed.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from mlckpt.errors import status_word
from mlckpt.formats import RUN_OUTCOME
from mlckpt.run.outcome_note import OUTCOME_ENV

FLAG = "--json"
IO_KEYS = ("block_size", "threads", "direct")  # the settings that change the numbers


def wanted(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """Whether ``--json`` was given, and the arguments without it (the rest are Hydra's)."""
    return FLAG in argv, [a for a in argv if a != FLAG]


@contextmanager
def noted() -> Iterator[tuple[dict[str, str], Path]]:
    """The environment that makes a launch's rank 0 note its bundle, and the note's file."""
    fd, name = tempfile.mkstemp(prefix="mlckpt-outcome-", suffix=".jsonl")
    os.close(fd)
    try:
        yield {OUTCOME_ENV: name}, Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def last_note(path: Path) -> Mapping[str, object] | None:
    """The last run's note (the last try of a retried one), or None where no rank wrote one."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
    return json.loads(lines[-1]) if lines else None


def outcome(status: int, overrides: Sequence[str], note: Mapping[str, Any] | None) -> dict[str, object]:
    """One launch's outcome line."""
    bundle = Path(note["bundle"]) if note else None
    out: dict[str, object] = {"outcome_format": RUN_OUTCOME.version, "status": status,
                           "status_word": (status_word(status) or "unknown"), "overrides": list(overrides),
                           "bundle": str(bundle) if bundle else None,
                           "verdict": note["verdict"] if note else None, "io": None, "figures": None}
    if bundle is not None and (bundle / "summary.json").is_file():
        config = yaml.safe_load((bundle / "config.yaml").read_text())
        out["io"] = {k: config["io"][k] for k in IO_KEYS}
        out["figures"] = figures(json.loads((bundle / "summary.json").read_text()))
    return out


def refused(status: int, error: str) -> dict[str, object]:
    """The outcome of a command refused before any launch."""
    return {"outcome_format": RUN_OUTCOME.version, "status": status,
            "status_word": (status_word(status) or "unknown"), "error": error}


def figures(summary: Mapping[str, object]) -> dict[str, object]:
    """summary.json's figures: its numbers and its latency percentiles (``*_latency_ms``), without
    the format fields; what each means is on the measurements page."""
    out: dict[str, object] = {}
    for key, value in summary.items():
        if key.endswith("_format"):
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value
        elif key.endswith("_latency_ms") and isinstance(value, dict):
            out[key] = value
    return out


def line(doc: Mapping[str, object]) -> str:
    return json.dumps(doc, sort_keys=False, allow_nan=False)
