"""Where checkpoints live: a folder on a filesystem, or a prefix in an S3 bucket
(``checkpoint.folder=s3://bucket/prefix``).  Pure: parsing and joining, no I/O.

An object location behaves like a folder for the runner: ``loc / "ckpt-0001" / name`` is the
object whose key is ``prefix/ckpt-0001/name``, and ``str()`` gives its ``s3://`` URL (what every
message, record and cleanup account names).  Each checkpoint file of the plan becomes one object
with the same relative name and size.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlckpt.errors import ConfigError

SCHEME = "s3://"
# S3's bucket naming rules (3-63 characters, lower case, digits, dots, hyphens), and a key prefix of
# printable characters without empty segments, "." or ".." (a prefix is a folder, not a pattern).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SEGMENT = re.compile(r"^[A-Za-z0-9!_.*'()+,=@-]+$")
KEY = "checkpoint.folder"

# storage.s3.* when left at null (workloads/config.yaml): the object engine's settings.  16 MiB
# parts: S3's minimum is 5 MiB, and larger parts cost fewer requests per GiB.
S3_DEFAULTS: dict[str, object] = {
    "endpoint": None,  # the AWS SDK's own chain: AWS_ENDPOINT_URL, the profile's endpoint_url
    "region": None,  # AWS_REGION, the profile's region
    "part_size": 16 << 20,
    "inflight": 8,  # requests in flight per rank
    "addressing_style": "path",
    "verify_tls": True,
}


def is_object_url(text: object) -> bool:
    """Whether a configured folder names object storage (``s3://…``)."""
    return isinstance(text, str) and text.startswith(SCHEME)


@dataclass(frozen=True)
class ObjectPath:
    """An object (or a prefix) in a bucket: ``bucket`` and ``key`` (no leading or trailing ``/``)."""

    bucket: str
    key: str = ""

    def __truediv__(self, name: str) -> ObjectPath:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not one path segment: {name!r}")
        return ObjectPath(self.bucket, f"{self.key}/{name}" if self.key else name)

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def prefix(self) -> str:
        """The key prefix that holds everything below this path (``key/``)."""
        return f"{self.key}/" if self.key else ""


def parse_object_url(url: str, key: str = KEY) -> ObjectPath:
    """``s3://bucket/prefix`` → its bucket and key prefix; a malformed URL is a ConfigError naming
    ``key`` (one line, exit 2, before anything runs)."""
    if not is_object_url(url):
        raise ConfigError(f"{key}: {url!r} is not an s3://bucket/prefix URL", key=key)
    rest = url[len(SCHEME) :].rstrip("/")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ConfigError(
            f"{key}: {bucket!r} is not a valid S3 bucket name (3-63 characters: lower-case "
            "letters, digits, dots and hyphens)",
            key=key,
        )
    segments = prefix.split("/") if prefix else []
    for seg in segments:
        if seg in ("", ".", "..") or not _SEGMENT.match(seg):
            raise ConfigError(
                f"{key}: {url!r}: the key prefix segment {seg!r} is not allowed (letters, "
                "digits and !_.*'()+,=@- only; no empty, '.' or '..' segments)",
                key=key,
            )
    return ObjectPath(bucket, "/".join(segments))


def s3_settings(config: Mapping[str, Any]) -> dict[str, object]:
    """``storage.s3`` with every null replaced by its default: what an object run uses and records."""
    given = (config.get("storage") or {}).get("s3") or {}
    return {k: (given.get(k) if given.get(k) is not None else v) for k, v in S3_DEFAULTS.items()}
