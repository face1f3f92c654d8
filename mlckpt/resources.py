"""Where the shipped data folders are.

In a wheel, ``workloads/`` and ``rules/`` are force-included under ``mlckpt/_data/``; in a source
checkout (editable install, tests) they are the repository's top-level folders.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@cache
def data_dir(name: str) -> Path:
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"mlckpt data folder {name!r} not found next to {_PKG}")


def workloads_dir() -> Path:
    return data_dir("workloads")


def rules_dir() -> Path:
    return data_dir("rules")
