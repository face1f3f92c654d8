"""The vendor-written system description: a YAML file validated against the rules' JSON Schema
(``rules/<version>/schemas/system-description.schema.json``) and stored in ``system.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlckpt import strict
from mlckpt.errors import ConfigError
from mlckpt.rules import COMPLETE, placeholders
from mlckpt.schemas import first_error

MAX_DESCRIPTION_BYTES = strict.CAPS["system-description"]


def load_system_description(path: str | Path, rules_version: str = "1.0") -> dict[str, object]:
    p = Path(path)
    where = f"system: {p}"
    try:
        if p.stat().st_size > MAX_DESCRIPTION_BYTES:
            raise ConfigError(f"{where}: larger than {MAX_DESCRIPTION_BYTES} bytes", key="system")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file", key="system") from None
    except IsADirectoryError:
        raise ConfigError(f"{where}: is a directory, expected a YAML file", key="system") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text", key="system") from None
    except OSError as exc:
        raise ConfigError(f"{where}: {exc.strerror}", key="system") from None
    try:
        # The checker's own strict loader: what mlckpt-check refuses, the runner refuses too.
        doc = strict.loads_yaml(text)
    except strict.ParseError as exc:
        raise ConfigError(f"{where}: {exc}", key="system") from None
    problem = first_error(doc, "system-description", rules_version)
    if problem:
        raise ConfigError(f"{where}: {problem}", key="system")
    drafted = placeholders(doc)
    if drafted:
        at, value = drafted[0]
        more = f" (and {len(drafted) - 1} more)" if len(drafted) > 1 else ""
        raise ConfigError(f"{where}: {at} is still the draft's placeholder {value!r}{more}: replace every "
                          f"value marked {COMPLETE} (mlckpt describe-system drafted them)", key="system")
    return doc


# ---------------------------------------------------------------------- a draft from what the host measures
STORAGE_TYPES = {  # filesystem type -> the description's storage.type
    "nfs": "nfs", "nfs4": "nfs", "lustre": "parallel-filesystem", "gpfs": "parallel-filesystem",
    "beegfs": "parallel-filesystem", "wekafs": "parallel-filesystem", "ceph": "parallel-filesystem",
    "ext4": "block", "xfs": "block", "btrfs": "block", "f2fs": "block",
}


def _q(value: object) -> str:
    """A YAML double-quoted scalar (JSON's string syntax is one), whatever the text holds."""
    return json.dumps(str(value)[:200])


def _name(text: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in text).strip("-._")
    return (cleaned or "my-system")[:200]


def draft_description(facts: dict[str, Any], capacity_bytes: int, product_name: str | None) -> str:
    """A system description (YAML text, valid against the schema) filled with what the host
    measured (``mlckpt.host.facts.host_facts``) and marked where the vendor must complete it."""
    fs = facts.get("filesystem") or {}
    fs_type = str(fs.get("fs_type") or "unknown")
    links = facts.get("net_links_mbps") or {}
    memory_gib = round((facts.get("memory_total_bytes") or 2**30) / 2**30, 1)
    cpu = f"{facts.get('cpu_model', 'unknown')} ({facts.get('cpu_cores')} cores)"
    lines = [
        f"# Drafted by `mlckpt describe-system` on {facts.get('hostname')} for {facts.get('target_path')}.",
        f"# Lines marked {COMPLETE} are placeholders or guesses: replace them before you submit.",
        "description_format: 1",
        f"system_name: {_name(str(facts.get('hostname')) + '-' + fs_type)}   # {COMPLETE}: the name "
        "your results appear under",
        f"submitter: {_q(COMPLETE + ': your organisation')}",
        f"availability: research   # {COMPLETE}: available | preview | research",
        "storage:",
        f"  product: {_q(fs_type + ' on ' + str(fs.get('source', 'unknown')))}   # {COMPLETE}: the product",
        f"  type: {STORAGE_TYPES.get(fs_type, 'other')}   # {COMPLETE} if wrong: parallel-filesystem | nfs | "
        "object | block | local-nvme | other",
        f"  usable_capacity_tib: {max(capacity_bytes / 2**40, 1e-6):.6g}   # measured: the filesystem's size",
        "clients:",
        f"  count: 1   # {COMPLETE}: how many client hosts run the benchmark",
        f"  model: {_q(product_name or COMPLETE + ': the client machine model')}",
        f"  cpu: {_q(cpu)}",
        f"  memory_gib: {memory_gib}   # measured",
        f"  os: {_q(facts.get('os', 'unknown'))}",
        "network:",
    ]
    if links:
        lines += [f"  type: {_q('ethernet (' + ', '.join(sorted(links)) + ')')}   # {COMPLETE} if wrong",
                  f"  bandwidth_gbit_s_per_client: {sum(links.values()) / 1000:g}   # measured: link speeds"]
    else:
        lines += [f"  type: {_q(COMPLETE + ': the client network (no link speed reported here)')}"]
    return "\n".join(lines) + "\n"
