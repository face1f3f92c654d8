"""The leaderboard: results that pass the checker, as comparable tables.

    mlckpt-check leaderboard ROOT [--format md|csv|json|html] [--out PATH] [--trusted-keys FILE]
                                  [--jobs N]

Design (the pure core first, then a thin layer of effects at the bottom of this module):

- **Which results.**  Only bundles the checker passes (verdict ``closed`` or ``open``), judged
  in-process by :func:`checker.tree_check.check_tree` with the same trust rules as ``mlckpt-check ROOT``
  (``--trusted-keys FILE``, default ``ROOT/trusted-keys.yaml``).  The numbers shown are read from
  the very bytes the checker verified: each listed bundle is verified again, its signed statement
  must be the one the checker passed (``statement_sha256``), and every file read must match its
  signed digest; a bundle that changed in between is excluded.  Failing bundles are listed as
  excluded (path, verdict, rule IDs), never ranked.
- **Classes.**  A class is *division × workload × scale × checkpoint mode* where scale is
  ``full`` (``scale=1``) or ``scaled`` (``scale<1``, open division only) and the checkpoint mode
  is :attr:`mlckpt.workload.pipeline.Pipeline.label`: ``sync``, ``sync+tiers``, ``async`` or
  ``async+tiers`` (all but ``sync`` open division only).  Results are ranked only within their
  class, so a closed full-scale result never shares a table with a scaled or an open one, and an
  asynchronous or tiered result never shares one with a synchronous one: their write bandwidth is
  the durable tier's persist in every mode, but only in sync mode does training wait for it (the
  Stall column says what training waited).  Classes are ordered closed before open, then
  canonical workloads (llama3 8B, 70B, 405B, 1T) before the others, smaller models first, then
  full before scaled, then sync, sync+tiers, async, async+tiers.
- **Order within a class.**  Write bandwidth (mean over the checkpoint writes, the MLPerf
  headline) descending; ties by read bandwidth descending, then result ID.  Missing values last.
- **Result IDs.**  ``XXXXX-XXXXX``: the first 50 bits of
  ``sha256("mlckpt-result-id-v1\\0org\\0system\\0workload\\0run_id")`` in RFC 4648 base32
  (letters and 2-7: no 0/O or 1/I confusion).  Derived, not allocated: the same result has the
  same ID in every build, adding or removing other bundles never changes it, and no map file
  has to be kept and merged.  The run id is the runner's random 64-bit id, and the checker
  refuses a run submitted twice (DUPLICATE-RUN), so two listed results never share an ID (a hash
  collision among them is reported as an internal error rather than printed).
- **Columns** (:data:`COLUMNS`): MLPerf Storage's published checkpoint columns (public ID,
  organisation, system, division, client nodes, processes, accelerator, write/read bandwidth in
  GiB/s and write/read duration in seconds, each the mean over ops) plus mlckpt's: the stall
  (what training waited per checkpoint) and the time to durable, the slowest rank's own
  bandwidth (mean over ops), the straggler ratio (the worst op of the run: slowest rank's
  duration ÷ median rank duration), the verification status of the reads and the mode
  (checkpoint mode, residency, I/O path, scale).  Writes are the durable tier's persist in every
  mode; reads are the restores from the durable tier only (restores a fast tier served are not
  storage reads of the durable tier: a run with none from the durable tier shows no read
  numbers).  Fixed decimals per column, units in the headers; the same rounded values appear in
  every output format.

The package: ``model`` (pure: columns, entries, classes, :func:`~model.build`,
:func:`~model.result_id`), ``collect`` (effects: the tree checked, the passing bundles read
again), ``render`` (md, csv, json, html; imports the model only) and ``command`` (the
``mlckpt-check leaderboard`` command).
"""


from checker.leaderboard.collect import BundleDocs, collect, is_archive, read_bundle
from checker.leaderboard.columns import COLUMN, COLUMNS, Column, fmt, rounded
from checker.leaderboard.model import ClassKey, Entry, Excluded, entry_from_docs, result_id
from checker.leaderboard.tables import ClassTable, Leaderboard, build

__all__ = ["COLUMN", "COLUMNS", "BundleDocs", "ClassKey", "ClassTable", "Column", "Entry", "Excluded",
           "Leaderboard", "build", "collect", "entry_from_docs", "fmt", "is_archive", "read_bundle",
           "result_id", "rounded"]
