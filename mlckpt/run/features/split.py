"""The runner's side of split invocations (see mlckpt.rules.checks.split).

A write invocation that keeps its checkpoints and reads none (``checkpoint.num_reads=0
checkpoint.keep=true``) leaves its content key in its run folder's marker, beside its checkpoints.
A read-only invocation (``checkpoint.num_writes=0 checkpoint.restore_from=...``) finds the write
invocation's bundle, verifies it (signature and every digest) and their compatibility, reads the
key from the marker, and checks every file it will read is there at its size: all before any
timed I/O.  It then verifies every page against the content the write invocation stamped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlckpt import bundle
from mlckpt.errors import BundleIntegrityError, ConfigError, MlckptError
from mlckpt.rules import content_proof, proof_matches, split_problems
from mlckpt.run.storage.cleanup import RUN_MARKER
from mlckpt.witness import protocol
from mlckpt.written import Written

KEY = "checkpoint.restore_from"
_NAME = re.compile(r"^[0-9]{8}T[0-9]{6}Z-.+-[0-9]+r-[0-9a-f]{16}$")


@dataclass(frozen=True)
class Source:
    """The write invocation a read-only invocation restores (read from its verified bundle)."""

    folder: Path
    run_id: int
    name: str
    statement_sha256: str
    ended: str
    num_writes: int
    # Checkpoint -> the run id its page tags carry (the writes a witness sealed; run.json's
    # witness.nonces)
    tags: tuple[tuple[int, int], ...] = ()
    commitment: str | None = None  # run.json content_commitment (run format 10): the key's

    def manifest_entry(self, key: bytes) -> dict[str, object]:
        """run.json's ``restored_from``, with the proof that this invocation held the write
        invocation's content key (``key``: read from its marker)."""
        return {"run_id": f"{self.run_id:016x}", "name": self.name, "num_writes": self.num_writes,
                "statement_sha256": self.statement_sha256, "ended": self.ended,
                "content_proof": content_proof(key)}


def keeps_key(config: Mapping[str, Any]) -> bool:
    """A write invocation meant to be restored by another: it reads nothing and keeps its files."""
    ck = config["checkpoint"]
    return int(ck["num_reads"]) == 0 and bool(ck["keep"]) and int(ck["num_writes"]) > 0


def locate(value: str, output_root: Path) -> Path:
    """``restore_from``: a bundle folder, or a run name or 16-hex run id under ``output_root``
    (and one level of sub-folders, as a sweep leaves them)."""
    given = Path(value).expanduser()
    if given.is_dir():
        return given.absolute()
    if "/" not in value and output_root.is_dir():
        candidates = [p for p in [*output_root.iterdir(), *output_root.glob("*/*")]
                      if p.is_dir() and _NAME.match(p.name)
                      and (p.name == value or p.name.endswith(f"-{value}"))]
        if len(candidates) == 1:
            return candidates[0].absolute()
        if len(candidates) > 1:
            raise ConfigError(f"{KEY}: {value!r} names {len(candidates)} bundles under {output_root}; "
                              "give the bundle's folder", key=KEY)
    raise ConfigError(f"{KEY}: no bundle folder {value!r} (nor a run of that name or id under "
                      f"{output_root})", key=KEY)


def load_source(value: str, output_root: Path, read_config: Mapping[str, object]) -> Source:
    """The write invocation's verified bundle, or one line naming why it cannot be restored."""
    folder = locate(value, output_root)
    try:
        vb = bundle.verify_bundle(folder)
        run = bundle.parse_document("run.json", bundle.read_document(folder, "run.json", vb))
        config = bundle.parse_document("config.yaml", bundle.read_document(folder, "config.yaml", vb))
    except BundleIntegrityError as exc:  # tampered, unsigned or incomplete: nothing to restore
        raise ConfigError(f"{KEY}: {folder} is not an intact signed bundle: "
                          f"{str(exc).splitlines()[0]}", key=KEY) from None
    except MlckptError as exc:
        raise ConfigError(f"{KEY}: {folder}: {str(exc).splitlines()[0]}", key=KEY) from None
    problems = split_problems(run, config, read_config)
    rules = str(read_config.get("rules_version"))
    if Written.of(rules).has("content_commitment") and not run.get("content_commitment"):
        was = run.get("rules_version")
        problems.append(f"it has no content commitment (rules {was}), which rules {rules} bind a restore "
                        f"to: restore it under rules_version={was}, or write it again under {rules}")
    if problems:
        raise ConfigError(f"{KEY}: {run.get('name')} cannot be restored here: {problems[0]}"
                          + "".join(f"; {p}" for p in problems[1:3]), key=KEY)
    run_id = int(run["run_id"], 16)
    nonces = (run.get("witness") or {}).get("nonces") or []
    tags = tuple((k, protocol.tag_run_id(run_id, n)) for k, n in enumerate(nonces, 1) if n)
    return Source(folder, run_id, str(run["name"]), vb.statement_sha256,
                  str(run["ended"]), int(config["checkpoint"]["num_writes"]), tags,
                  run.get("content_commitment"))


def read_key(root: Path, source: Source) -> bytes:
    """The content key the write invocation left in its run folder's marker."""
    try:
        text = (root / RUN_MARKER).read_text().strip()
        key = bytes.fromhex(text)
    except (OSError, ValueError):
        raise ConfigError(f"{KEY}: {root} holds no content key of {source.name} (its checkpoint "
                          "folder is not here, or it was not run with num_reads=0 keep=true)",
                          key=KEY) from None
    if int.from_bytes(key[:8], "little") != source.run_id or (
            source.commitment is not None and not proof_matches(content_proof(key), source.commitment)):
        raise ConfigError(f"{KEY}: the checkpoints in {root} are not {source.name}'s", key=KEY)
    return key


def missing(paths: Sequence[tuple[str, int]]) -> str | None:
    """The first of these (path, size) files that is not there at its size, described."""
    for path, size in paths:
        try:
            have = os.stat(path).st_size
        except OSError as exc:
            return f"{path}: {exc.strerror}"
        if have != size:
            return f"{path}: {have} bytes, the write invocation wrote {size}"
    return None
