"""The workload model: a transformer's shape, dtypes and parallelism.  Pure data.

A ``Workload`` is built from the resolved ``workload`` node of the Hydra configuration
(``workloads/workload/*.yaml``) and is what sizing and the rules reason about.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from mlckpt.errors import ConfigError

DTYPE_BYTES: dict[str, int] = {
    "int8": 1, "uint8": 1, "fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8,
}


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_layers: int
    ffn_hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int
    model_datatype: str = "fp16"
    optimizer_datatype: str = "fp32"
    type: str = "transformer"

    @classmethod
    def of_counts(cls, counts: Mapping[str, int], **names: str) -> ModelShape:
        """The shape from its six counts (``_INT_MODEL_KEYS``) and, by name, its data types."""
        return cls(hidden_size=counts["hidden_size"], num_layers=counts["num_layers"],
                   ffn_hidden_size=counts["ffn_hidden_size"], vocab_size=counts["vocab_size"],
                   num_attention_heads=counts["num_attention_heads"], num_kv_heads=counts["num_kv_heads"],
                   **names)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads  # floor, as DLIO (1T: 134)

    @property
    def kv_dim(self) -> int:
        return self.head_dim * self.num_kv_heads

    @property
    def num_parameters(self) -> int:
        """DLIO's parameter count (untied lm_head)."""
        h, L, f, V = self.hidden_size, self.num_layers, self.ffn_hidden_size, self.vocab_size
        block = h + h * (h + 2 * self.kv_dim) + h * h + h + 2 * f * h + f * h
        return V * h + L * block + h + V * h

    @property
    def model_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.model_datatype]

    @property
    def optimizer_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.optimizer_datatype]


@dataclass(frozen=True)
class Parallelism:
    tensor: int
    pipeline: int
    zero_stage: int

    @property
    def model_parallel(self) -> int:
        return self.tensor * self.pipeline


@dataclass(frozen=True)
class Workload:
    name: str
    model: ModelShape
    parallelism: Parallelism
    closed_ranks: int
    canonical: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


_INT_MODEL_KEYS = ("hidden_size", "num_layers", "ffn_hidden_size", "vocab_size",
                   "num_attention_heads", "num_kv_heads")


def _positive_int(node: Mapping[str, object], key: str, where: str) -> int:
    value = node.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key}: expected an integer, got {value!r}", key=f"{where}.{key}")
    if value <= 0:
        raise ConfigError(f"{where}.{key}: must be positive, got {value}", key=f"{where}.{key}")
    return value


def workload_from_config(node: Mapping[str, Any]) -> Workload:
    """Build a Workload from the resolved ``workload`` config node, validating structure.

    Structural impossibilities (ZeRO 3 with PP > 1, fewer layers than stages) are the rules
    ZERO3-PIPELINE and LAYERS-PIPELINE; they are checked in :mod:`mlckpt.rules`, not here.
    """
    model = node.get("model") or {}
    par = node.get("parallelism") or {}
    ints = {k: _positive_int(model, k, "workload.model") for k in _INT_MODEL_KEYS}
    for key in ("model_datatype", "optimizer_datatype"):
        dtype = model.get(key)
        if dtype not in DTYPE_BYTES:
            raise ConfigError(
                f"workload.model.{key}: unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}",
                key=f"workload.model.{key}")
    if model.get("type", "transformer") != "transformer":
        raise ConfigError(f"workload.model.type: only 'transformer' is modelled, got "
                          f"{model.get('type')!r}", key="workload.model.type")
    zero = par.get("zero_stage")
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise ConfigError(f"workload.parallelism.zero_stage: expected 0, 1, 2 or 3, got {zero!r}",
                          key="workload.parallelism.zero_stage")
    return Workload(
        name=str(node.get("name")),
        model=ModelShape.of_counts(ints, model_datatype=model["model_datatype"],
                         optimizer_datatype=model["optimizer_datatype"]),
        parallelism=Parallelism(
            tensor=_positive_int(par, "tensor", "workload.parallelism"),
            pipeline=_positive_int(par, "pipeline", "workload.parallelism"),
            zero_stage=zero,
        ),
        closed_ranks=_positive_int(node, "closed_ranks", "workload"),
        canonical=bool(node.get("canonical", False)),
    )
