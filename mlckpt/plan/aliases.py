"""The names users of mlpstorage and DLIO already type, mapped to mlckpt's own.  Pure.

An alias is accepted on the command line and recorded under mlckpt's canonical name (the bundle
never holds an alias), with a one-line note saying so.
"""

from __future__ import annotations

from collections.abc import Sequence

# workload=... : mlpstorage's model names, and DLIO's name of the workload llama3_8b is.
WORKLOADS = {
    "llama3-8b": "llama3_8b",
    "llama3-70b": "llama3_70b",
    "llama3-405b": "llama3_405b",
    "llama3-1t": "llama3_1t",
    "llama_8b_zero3": "llama3_8b",
}

# rules=/rules_version=: rule sets by the name their owners give them.
RULE_SETS = {"mlperf-storage-v3.0": "mlps-v3.0r5"}

# Keys whose value is text to keep as typed, quoted for Hydra where it would read it otherwise: a
# public key (ed25519:<base64>: '+', '/' and '=' are override syntax), a rules version (1.10 would
# be the number 1.1).
VERBATIM = frozenset({"witness.public_key", "rules_version"})


def _misread(value: str) -> bool:
    """Whether Hydra would take ``value`` for something other than the text typed: a number
    (a version is text: 1.10 is not 1.1), or override syntax."""
    if value[:1] in ("'", '"') or "'" in value:
        return False  # quoted already (or not quotable this way: Hydra says what is wrong)
    try:
        float(value)
    except ValueError:
        return any(c in value for c in "=+/:[]{},")
    return True

# Keys: DLIO's checkpoint keys, bare, under checkpoint. or under workload.checkpoint. (as
# mlpstorage passes them to DLIO), and `rules=` for `rules_version=`.
_DLIO_KEYS = {
    "checkpoint_folder": "checkpoint.folder",
    "num_checkpoints_write": "checkpoint.num_writes",
    "num_checkpoints_read": "checkpoint.num_reads",
    "time_between_checkpoints": "checkpoint.compute_interval_s",
}
# mlpstorage's own names (its `checkpointing run` options), as key=value or as its --flags.
_MLPSTORAGE_KEYS = {
    "model": "workload",
    "num_processes": "ranks",
    "checkpoint-folder": "checkpoint.folder",
    "client_host_memory_in_gb": "host_memory_gib",
    "num_checkpoints_write": "checkpoint.num_writes",
    "num_checkpoints_read": "checkpoint.num_reads",
}
FLAGS = {f"--{k.replace('_', '-')}": v for k, v in _MLPSTORAGE_KEYS.items()}
KEYS = {
    "rules": "rules_version",
    **_MLPSTORAGE_KEYS,
    **{k.replace("-", "_"): v for k, v in _MLPSTORAGE_KEYS.items()},
    **_DLIO_KEYS,
    **{f"checkpoint.{k}": v for k, v in _DLIO_KEYS.items()},
    **{f"workload.checkpoint.{k}": v for k, v in _DLIO_KEYS.items()},
}


def canonical(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """``overrides`` under mlckpt's names, and one note per alias used."""
    out: list[str] = []
    notes: list[str] = []
    for o in overrides:
        if "=" not in o:
            out.append(o)
            continue
        raw_key, value = o.split("=", 1)
        prefix = raw_key[: len(raw_key) - len(raw_key.lstrip("+~"))]
        key = raw_key[len(prefix):]
        new_key = KEYS.get(key, key)
        new_value = {"workload": WORKLOADS, "rules_version": RULE_SETS}.get(new_key, {}).get(value, value)
        renamed = (new_key, new_value) != (key, value)
        if new_key in VERBATIM and _misread(new_value):
            new_value = f"'{new_value}'"
        if renamed:
            # '++' (DLIO's "add or override") on an alias: the canonical key always exists.
            prefix = "" if new_key != key else prefix
            notes.append(f"{o} is taken as {prefix}{new_key}={new_value} (mlckpt's name)")
        out.append(f"{prefix}{new_key}={new_value}")
    return out, notes


def flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """mlpstorage's ``--flag VALUE`` (or ``--flag=VALUE``) options in ``argv`` as mlckpt's
    ``key=value`` overrides, and one note per flag taken; every other argument as it was."""
    out: list[str] = []
    notes: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=")
        if name in FLAGS and (eq or i + 1 < len(args)):
            if not eq:
                value = args[i + 1]
                i += 1
            key = FLAGS[name]
            mine = WORKLOADS.get(value, value) if key == "workload" else value
            out.append(f"{key}={mine}")
            notes.append(f"{name} {value} (mlpstorage's option) is taken as {key}={mine}")
        else:
            out.append(a)
        i += 1
    return out, notes
