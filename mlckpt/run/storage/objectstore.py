"""The runner's side of object storage (``checkpoint.folder=s3://bucket/prefix``, rules 1.6): the
store a run opens from its configuration, what each host's leader measures of it before any I/O
(OBJECT-STORE-USABLE), the storage block run.json records, and the sweep that removes a failed
run's objects (its planned keys, and the unfinished multipart uploads under its own prefix).

Objects that are not this run's are never touched: deletes name planned keys only, and the
uploads aborted are those under ``<prefix>/<run name>/``, which no other run can share (the name
carries the run's random id).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from mlckpt.engine import IOOptions, buckets, objects
from mlckpt.errors import MlckptError
from mlckpt.host.facts import host_facts
from mlckpt.locations import ObjectPath, parse_object_url, s3_settings
from mlckpt.run.storage.backends import Piece, Span

PROBE_PREFIX = ".mlckpt-probe-"


def options(settings: Mapping[str, Any], pool: str = "main") -> objects.S3Options:
    return objects.S3Options(
        part_size=int(settings["part_size"]),
        inflight=int(settings["inflight"]),
        addressing_style=str(settings["addressing_style"]),
        verify_tls=bool(settings["verify_tls"]),
        endpoint=settings.get("endpoint"),
        region=settings.get("region"),
        pool=pool,
    )


def open_store(config: Mapping[str, Any]) -> tuple[objects.Store, ObjectPath]:
    """The configured store and folder (ConfigError for a malformed URL or no S3 client)."""
    loc = parse_object_url(str(config["checkpoint"]["folder"]))
    return objects.Store(loc.bucket, options(s3_settings(config))), loc


def measure(config: Mapping[str, Any], host: str, mpi_library: str,
            results: Path | None) -> dict[str, object]:
    """What one host's leader measures of the store for the gates: whether it can use it (the
    probe), and its facts with the store as the checkpoint 'filesystem'."""
    problem: str | None
    try:
        store, loc = open_store(config)
        problem = buckets.probe(store, loc / f"{PROBE_PREFIX}{host}-{secrets.token_hex(6)}")
        endpoint = store.endpoint_host
    except MlckptError as exc:
        problem, endpoint = str(exc), ""
    except Exception as exc:  # a client that cannot even be built (a malformed endpoint, a profile)
        problem, endpoint = f"the S3 client cannot be set up: {type(exc).__name__}: {exc}", ""
    facts = host_facts(results or Path.cwd(), mpi_library)
    folder = str(config["checkpoint"]["folder"])
    facts.update(
        target_path=folder,
        block_device=None,
        filesystem={"fs_type": "s3", "source": endpoint, "mount_point": folder},
    )
    return {"store_problem": problem, "facts": facts}


def planned(root: ObjectPath, names: Sequence[str], upto: int) -> list[ObjectPath]:
    return [root / f"ckpt-{k:04d}" / n for k in range(1, upto + 1) for n in names]


def sweep(url: str, names: Sequence[str], upto: int, settings: Mapping[str, object], *, keep: bool) -> str:
    """Remove what a run that cannot finish left under ``url`` (its run prefix): the planned
    objects of checkpoints 1..upto and every unfinished multipart upload under the prefix.
    Returns a short account for the user; never raises."""
    if keep:
        return f"checkpoint.keep=true: checkpoint objects kept under {url}"
    try:
        root = parse_object_url(url)
        store = objects.Store(root.bucket, options(settings, pool="cleanup"))
        aborted = buckets.abort_uploads(store, root.prefix)
        removed, left = buckets.delete_objects(store, planned(root, sorted(set(names)), upto))
    except Exception as exc:  # the store is gone or refuses: say so, never hide it
        return f"could not remove this run's objects under {url}: {exc}"
    note = f"removed {removed} checkpoint object{'s' if removed != 1 else ''} of this run"
    if aborted:
        note += f" and aborted {aborted} unfinished upload{'s' if aborted != 1 else ''}"
    if left:
        note += f"; {len(left)} could not be removed: {left[0]}"
    return note


def remove(store: objects.Store, urls: Sequence[str]) -> list[str]:
    """Delete these objects (a run's normal end); returns the failures, one line each."""
    paths = [parse_object_url(u) for u in dict.fromkeys(urls)]
    return buckets.delete_objects(store, paths)[1]


@dataclass(frozen=True)
class Objects:
    """A prefix in an S3-compatible store, as a :class:`mlckpt.run.storage.backends.Storage`: each
    file of the plan is one object of the same relative name and size.  No page cache of this
    host holds objects (nothing to evict, 0 resident) and objects need no folders."""

    root: ObjectPath
    store: objects.Store
    kind: ClassVar[str] = "s3"
    cached: ClassVar[bool] = False
    folders: ClassVar[bool] = False

    @classmethod
    def open(cls, config: Mapping[str, object]) -> Objects:
        store, loc = open_store(config)
        return cls(loc, store)

    def path(self, name: str) -> ObjectPath:
        p = self.root
        for segment in name.split("/") if name else ():
            p = p / segment
        return p

    def at(self, name: str = "") -> str:
        return str(self.path(name))

    def below(self, name: str) -> Objects:
        return Objects(self.path(name), self.store)

    def _store(self, opts: IOOptions) -> objects.Store:
        return self.store if opts.pool == "main" else self.store.with_pool(opts.pool)

    def put(self, pieces: Sequence[Piece], opts: IOOptions) -> None:
        # durable once the store acknowledged every object: there is nothing to fsync
        objects.put_objects(self._store(opts), [objects.ObjectIO(self.path(p.name), p.buf, p.nbytes)
                                                for p in pieces])

    def get(self, pieces: Sequence[Piece], opts: IOOptions) -> None:
        objects.get_objects(self._store(opts), [objects.ObjectIO(self.path(p.name), p.buf, p.nbytes)
                                                for p in pieces])

    def get_spans(self, spans: Sequence[Span], opts: IOOptions) -> int:
        return objects.get_ranges(self._store(opts), [
            objects.ObjectRange(self.path(s.name), s.file_bytes, s.offset, s.buf, s.nbytes) for s in spans])

    def evict(self, names: Sequence[str]) -> int:
        return 0

    def resident(self, names: Sequence[str]) -> int:
        return 0

    def remove(self, locations: Sequence[str]) -> list[str]:
        return remove(self.store, locations)

    def describe(self) -> dict[str, object]:
        d = self.store.describe()
        return {
            "kind": self.kind,
            "client": d["client"],
            "endpoint_host": d["endpoint_host"],
            "region": d["region"],
            "bucket": self.root.bucket,
            "prefix": self.root.key,
            "part_size": d["part_size"],
            "inflight": d["inflight"],
            "addressing_style": d["addressing_style"],
            "verify_tls": d["verify_tls"],
        }
