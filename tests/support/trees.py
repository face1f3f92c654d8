"""Submission trees of the honest bundles (the session's ``honest_bundles``, made by the real
runner), and the checker run over them as the tests read its report."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from checker.report import REPORT_SCHEMA
from checker.tree_check import check_tree
from mlckpt import bundle
from mlckpt.schemas import validator
from support.cli import CHECKER_ORG as ORG
from support.cli import CHECKER_SYSTEM as SYSTEM


def write_system(root: Path, h: Mapping[str, Path], division: str = "open", system: str = SYSTEM,
                 text: str | None = None, org: str = ORG) -> Path:
    p = root / division / org / "systems" / f"{system}.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text if text is not None else (h["dir"] / "laptop-ext4.yaml").read_text())
    return p


def tree_of(h: Mapping[str, Path], root: Path, *bundles: Path) -> Path:
    """``bundles`` (llama3_8b runs) under the open division of the checker's organisation and
    system, with its system description."""
    write_system(root, h)
    for b in bundles:
        shutil.copytree(b, root / "open" / ORG / "results" / SYSTEM / "llama3_8b" / b.name)
    return root


def honest_tree(root: Path, h: Mapping[str, Path], *, pack_7b: bool = True) -> Path:
    """The two honest bundles in place, llama_7b packed as <run-id>.tar.gz."""
    write_system(root, h)
    for w in ("llama3_8b", "llama_7b"):
        dest = root / "open" / ORG / "results" / SYSTEM / w
        dest.mkdir(parents=True, exist_ok=True)
        if w == "llama_7b" and pack_7b:
            bundle.pack(h[w], dest / f"{h[w].name}.tar.gz")
        else:
            shutil.copytree(h[w], dest / h[w].name)
    shutil.copy(h["dir"] / "trusted-keys.yaml", root / "trusted-keys.yaml")
    return root


def check(root: Path, h: Mapping[str, Path], **kw: Any) -> dict[str, Any]:
    report = check_tree(root, bundle.TrustedKeys.load(h["dir"] / "trusted-keys.yaml"), **kw)
    assert_report_valid(report)
    return report


def assert_report_valid(report: Mapping[str, Any]) -> None:
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator("report", REPORT_SCHEMA).iter_errors(report)]
    assert not errors, errors[:5]
    json.dumps(report, allow_nan=False)  # strict JSON
