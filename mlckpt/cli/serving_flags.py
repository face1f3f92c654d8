"""The serving flags `mlckpt plan` and `mlckpt size` share (--replicas, --tp, --gpus-per-host,
--shard-file) and the layout they make of a composed workload."""

from __future__ import annotations

import argparse

from mlckpt.errors import ConfigError, UsageError
from mlckpt.units import parse_size
from mlckpt.workload.model import Workload
from mlckpt.workload.serving import DEFAULT_SHARD_FILE_BYTES, ServingLayout


def add_flags(parser: argparse.ArgumentParser, replicas_help: str, metavar: str = "N") -> None:
    g = parser.add_argument_group("serving (inference model loading: weights only, bf16)")
    g.add_argument("--replicas", default=None, metavar=metavar, help=replicas_help)
    g.add_argument("--tp", type=int, default=None, metavar="T",
                   help="GPUs per replica (tensor parallelism; default: the workload's TP)")
    g.add_argument("--gpus-per-host", type=int, default=8, metavar="G", help="GPUs in a host (default 8)")
    g.add_argument("--shard-file", default=None, metavar="SIZE",
                   help="largest file of a GPU's shard (default 5GB, as save_pretrained writes)")


def replica_range(text: str) -> tuple[int, int]:
    """'64' → (0, 64); '8:64' → (8, 64)."""
    try:
        parts = [int(x) for x in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = [0, *parts]
    if len(parts) != 2 or not 0 <= parts[0] < parts[1]:
        raise UsageError(f"--replicas: expected N or FROM:TO with 0 <= FROM < TO, got {text!r}")
    return parts[0], parts[1]


_FLAGS = {"tp": "--tp", "replicas": "--replicas", "gpus_per_host": "--gpus-per-host",
          "shard_file_bytes": "--shard-file", "dtype": "--dtype"}


def layout(args: argparse.Namespace, workload: Workload, replicas: int) -> ServingLayout:
    try:
        shard = DEFAULT_SHARD_FILE_BYTES if args.shard_file is None else parse_size(args.shard_file)
    except ValueError as exc:
        raise UsageError(f"--shard-file: {exc}") from None
    try:
        return ServingLayout(workload.name, workload.model, args.tp or workload.parallelism.tensor,
                             replicas, args.gpus_per_host, shard)
    except ConfigError as exc:
        key = exc.key or ""
        raise UsageError(f"{_FLAGS.get(key, key)}: {exc.message.removeprefix(key + ': ')}") from None
