"""A result folder's documents, read for its report (the one effect of mlckpt.report)."""

from __future__ import annotations

from pathlib import Path

from mlckpt import strict
from mlckpt.report.model import Report, build

DOCS = ("run.json", "summary.json", "system.json", "records.jsonl")


def read(folder: Path) -> Report:
    """The report of the run in ``folder``; ValueError naming what is missing or unreadable."""
    missing = [d for d in DOCS if not (folder / d).is_file()]
    if missing:
        raise ValueError(f"not a run's result folder (no {', '.join(missing)})")
    try:
        run, summary, system = (strict.parse_json((folder / d).read_bytes()) for d in DOCS[:3])
        records = [strict.parse_json(line) for line in (folder / "records.jsonl").read_bytes().splitlines()
                   if line.strip()]
        config = (strict.parse_yaml((folder / "config.yaml").read_bytes())
                  if (folder / "config.yaml").is_file() else None)
    except (OSError, ValueError) as exc:
        raise ValueError(f"unreadable ({exc})") from None
    try:
        return build(run, summary, system, records, config)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"its records do not make a report ({type(exc).__name__}: {exc}); check it with "
                         "mlckpt-check") from None
