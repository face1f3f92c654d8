"""The vendor-written system description: a YAML file validated against the rules' JSON Schema
(``rules/<version>/schemas/system-description.schema.json``) and stored in ``system.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlckpt import strict
from mlckpt.errors import ConfigError
from mlckpt.schemas import first_error

MAX_DESCRIPTION_BYTES = strict.CAPS["system-description"]


def load_system_description(path: str | Path, rules_version: str = "1.0") -> dict[str, Any]:
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
    return doc
