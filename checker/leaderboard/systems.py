"""The system under test as the tables show it: facts from the vendor's system description, and
MLPerf Storage's results-table columns (in MLPerf's order and spelling).  Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def dig(doc: object, *keys: str) -> Any:
    """``doc[k1][k2]...``, or None where a level is missing or not a mapping (untrusted YAML)."""
    for k in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(k)
    return doc


# The system-under-test facts the tables show, from the system description (never invented: a
# fact the description lacks stays blank).
SUT_FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("submitter", "Submitter", ("submitter",)),
    ("product", "Storage product", ("storage", "product")),
    ("vendor", "Vendor", ("storage", "vendor")),
    ("type", "Type", ("storage", "type")),
    ("availability", "Availability", ("availability",)),
    ("usable_capacity_tib", "Usable capacity (TiB)", ("storage", "usable_capacity_tib")),
    ("storage_nodes", "Storage nodes", ("storage", "nodes")),
    ("drives", "Drives", ("storage", "drives")),
    ("software", "Software", ("storage", "software")),
    ("clients", "Client nodes", ("clients", "count")),
    ("client_model", "Client model", ("clients", "model")),
    ("client_memory_gib", "Client memory (GiB)", ("clients", "memory_gib")),
    ("network", "Network", ("network", "type")),
    ("network_gbit_s", "Network per client (Gbit/s)", ("network", "bandwidth_gbit_s_per_client")),
    ("description", "Description", ("description",)),
)


def sut_facts(description: object) -> tuple[tuple[str, str], ...]:
    out = []
    for key, _, where in SUT_FIELDS:
        value = dig(description, *where)
        if value is not None and not isinstance(value, Mapping | list):
            text = " ".join(str(value).split())[:500]
            if text:
                out.append((key, text))
    return tuple(out)




# MLPerf Storage v3.0's results table (mlcommons/storage report_generator.py): the shared
# system-under-test block, then the checkpointing block, in MLPerf's order and spelling.  Each
# value is a fact mlckpt has, or blank: Public ID is MLPerf's to assign, and rack units, integrated
# client storage and the code link have no source in an mlckpt bundle.
MLPERF_COLUMNS = (
    "Public ID", "Organization", "Division", "Benchmark Type", "Model", "Name", "Description", "Type",
    "Access Protocol", "Availability", "RU's", "Integrated Client Storage (TiB)", "Usable Capacity (TiB)",
    "Checkpointing - Checkpoint Mode", "Checkpointing - # Client Nodes", "Checkpointing - DP Instances",
    "Checkpointing - Code", "Checkpointing - Logs", "Checkpointing - Write B/W (GiB/s)",
    "Checkpointing - Write Duration (secs)", "Checkpointing - Read B/W (GiB/s)",
    "Checkpointing - Read Duration (secs)",
)
MLPERF_MODELS = {"llama3_8b": "8B", "llama3_70b": "70B", "llama3_405b": "405B", "llama3_1t": "1T"}


def mlperf_row(entry: Any, rec: Mapping[str, object], fmt_num: Any) -> dict[str, str]:
    """One leaderboard row under MLPerf's columns; ``rec`` is the table row (unrounded numbers),
    ``fmt_num(value, key)`` prints a number as the table's column of that key does."""
    return {
        "Public ID": "", "Organization": entry.sut_value("submitter") or entry.org,
        "Division": entry.division.upper(), "Benchmark Type": "checkpointing",
        "Model": MLPERF_MODELS.get(entry.workload, entry.workload)
        + (f" (scaled ×{entry.scale:g})" if entry.scaled else ""),  # never mistaken for a full run
        "Name": entry.system, "Description": entry.sut_value("description"),
        "Type": entry.sut_value("type"),
        "Access Protocol": entry.protocol,  # run.json's storage block: files through POSIX, or S3
        "Availability": entry.sut_value("availability"), "RU's": "", "Integrated Client Storage (TiB)": "",
        "Usable Capacity (TiB)": entry.sut_value("usable_capacity_tib"),
        "Checkpointing - Checkpoint Mode": "Full",  # mlckpt has no subset mode
        "Checkpointing - # Client Nodes": str(entry.hosts),
        "Checkpointing - DP Instances": "" if entry.dp is None else str(entry.dp),
        "Checkpointing - Code": "",
        "Checkpointing - Logs": " + ".join(entry.invocations) if entry.invocations else entry.path,
        "Checkpointing - Write B/W (GiB/s)": fmt_num(rec["write_gib_s"], "write_gib_s"),
        "Checkpointing - Write Duration (secs)": fmt_num(rec["write_duration_s"], "write_duration_s"),
        "Checkpointing - Read B/W (GiB/s)": fmt_num(rec["read_gib_s"], "read_gib_s"),
        "Checkpointing - Read Duration (secs)": fmt_num(rec["read_duration_s"], "read_duration_s"),
    }
