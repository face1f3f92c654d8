"""Rank 0's note of the bundle a run wrote, for `mlckpt run --json` (mlckpt/cli/run_outcome.py):
one JSON line appended to the file named in ``MLCKPT_OUTCOME``, where the launcher set it."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

OUTCOME_ENV = "MLCKPT_OUTCOME"


def note(folder: Path, verdict: str, environ: Mapping[str, str] = os.environ) -> None:
    target = environ.get(OUTCOME_ENV)
    if target:
        with open(target, "a") as fh:
            fh.write(json.dumps({"bundle": str(Path(folder).absolute()), "verdict": verdict}) + "\n")
