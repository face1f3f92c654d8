"""I/O engine: checkpoint content (fill, verify), timed file writes and reads, page-cache control.

Modules: ``content`` (buffers, fill, verify), ``files`` (timed writes and reads), ``stream``
(the bounded ring, snapshot, drain), ``cache`` (eviction, residency, probes), ``objects`` (the
second storage backend: S3-compatible object storage, same request queue; see its docstring),
``buckets`` (a bucket outside the timed ops: sizes, removal, the probe), ``gpu`` (GPU-resident
state: the one module that imports the array library, imported on demand).

Effects on files only: no MPI, no printing.  The runner times the calls; the engine's own clock
reads are each request's latency and each phase of an op, collected for the runner's records
(``requests``).

Content
-------
Every file of every checkpoint gets different, incompressible bytes, so storage that dedups,
compresses or delta-encodes cannot shrink it (real training changes every byte between
checkpoints).  The payload is the AES-128-CTR keystream under the 16-byte run key, whose initial
counter block is (big-endian)::

    rank u32 | checkpoint u16 | file_index u16 | block counter u64 (starts at 0)

so distinct (rank, checkpoint, file) never share keystream (a file would need 2**68 bytes for its
counter to carry into the identity fields).  The key must be random per run.

Then the first ``TAG_BYTES`` = 32 bytes of every 4 KiB page (and of a final partial page of at
least 32 bytes) are overwritten by a tag, all fields little-endian::

    offset size field
         0    4 magic        b"MLCK"
         4    2 format       u16, TAG_FORMAT_VERSION (1)
         6    2 reserved     u16, 0
         8    8 run_id       u64
        16    4 rank         u32
        20    2 checkpoint   u16
        22    2 file_index   u16
        24    8 page_index   u64, page number within the file (byte offset // 4096)

The tag makes every page unique across the run even if a key were reused, and tells a failed
verification *what* came back instead (another rank's data, a stale checkpoint, a misplaced page).

I/O
---
``write_files``/``read_files`` put every request of every file of one rank into one queue,
consumed by ``threads`` workers (the calling thread is one of them; the others come from one
persistent pool), each issuing blocking ``pwritev``/``preadv`` calls that release the GIL.  That is
``threads`` requests in flight, like fio's ``iodepth`` with a synchronous engine.  Buffers come from
``alloc`` (page-aligned, pre-touched) and are written from / read into in place, without copies.
"""

from mlckpt.engine.cache import (
    drop_caches,
    evict,
    probe_direct,
    probe_dontcache,
    resident_bytes,
)
from mlckpt.engine.content import (
    KEY_BYTES,
    MAGIC,
    PAGE,
    TAG_BYTES,
    TAG_FORMAT_VERSION,
    VERIFY_SCRATCH_BYTES,
    Buffer,
    Mismatch,
    PageId,
    alloc,
    decode_tag,
    fill,
    huge_bytes,
    seal,
    verify,
    wipe_tags,
)
from mlckpt.engine.files import (
    RWF_DONTCACHE,
    FileIO,
    FileResult,
    IOOptions,
    StreamFile,
    read_files,
    write_files,
)
from mlckpt.engine.objects import ObjectIO, S3Options, Store, get_objects, put_objects
from mlckpt.engine.requests import Requests, collect, collected
from mlckpt.engine.stream import (
    SNAPSHOT_CHUNK,
    DrainResult,
    StreamMismatch,
    drain,
    read_stream,
    snapshot,
    stream_ring_bytes,
    write_stream,
)

__all__ = [
    "KEY_BYTES",
    "MAGIC",
    "PAGE",
    "RWF_DONTCACHE",
    "SNAPSHOT_CHUNK",
    "TAG_BYTES",
    "TAG_FORMAT_VERSION",
    "VERIFY_SCRATCH_BYTES",
    "Buffer",
    "DrainResult",
    "FileIO",
    "FileResult",
    "IOOptions",
    "Mismatch",
    "ObjectIO",
    "PageId",
    "Requests",
    "S3Options",
    "Store",
    "StreamFile",
    "StreamMismatch",
    "alloc",
    "collect",
    "collected",
    "decode_tag",
    "drain",
    "drop_caches",
    "evict",
    "fill",
    "get_objects",
    "huge_bytes",
    "probe_direct",
    "probe_dontcache",
    "put_objects",
    "read_files",
    "read_stream",
    "resident_bytes",
    "seal",
    "snapshot",
    "stream_ring_bytes",
    "verify",
    "wipe_tags",
    "write_files",
    "write_stream",
]
