"""The named tensors a rank's checkpoint files hold, as a library writer is handed them
(``framework.tensors=model``, rules 1.19).  Pure: the runner builds each rank's state dict from
here, and the rules count the tensors a record claims against it.

A rank holds the tensors of its shard of the model under the workload's TP·PP·ZeRO, named as a
Llama checkpoint names them, in the order of the layout's layers (``mlckpt/workload/layout.py``):

* layer 0: ``model.embed_tokens.weight`` (vocabulary × hidden, split by TP);
* layers 1..L (block ``i = layer - 1``): ``model.layers.{i}.input_layernorm.weight``,
  ``self_attn.qkv_proj.weight`` (hidden × (hidden + 2 × kv), split by TP), ``self_attn.o_proj.weight``,
  ``post_attention_layernorm.weight``, ``mlp.gate_up_proj.weight`` (hidden × 2 FFN, split by TP) and
  ``mlp.down_proj.weight``;
* layer L+1: ``lm_head.weight``; layer L+2: ``model.norm.weight``.

Under ZeRO 3 every model tensor is a flat shard of 1/DP of it (as FSDP keeps it).  The optimizer
file holds, for each of those parameters, Adam's two moments (``optimizer.state.{p}.exp_avg``,
``.exp_avg_sq``) and the fp32 master copy (``optimizer.master.{p}``), flat shards of 1/DP under
ZeRO 1-3.

The tensors tile each planned file's bytes exactly, so a library writes the same bytes the engine
does.  The layout's sizes are DLIO's (the optimizer's is an average over the model-parallel ranks,
and ``scale`` shrinks every file), so a file's tensors are resized in proportion (whole rows of a
matrix, whole elements of a vector) to fill it, and what whole rows leave over is one ``uint8``
tensor named ``{file}.rest``.  Where a file is too small to give every tensor an element, it is
one ``uint8`` tensor, as in ``framework.tensors=flat``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mlckpt.workload.layout import FileSpec, Plan, RestoreRead, stage_layers
from mlckpt.workload.model import DTYPE_BYTES, Workload

STRUCTURES = ("model", "flat")  # framework.tensors


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a file: its name, element type and shape, and its bytes' place in the file."""

    name: str
    dtype: str  # a key of DTYPE_BYTES
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class _Ideal:
    name: str
    rows: int
    cols: int  # 1: a vector (or a flat shard)


def _param(name: str, numel: int, cols: int, shards: int) -> _Ideal:
    """A parameter of ``numel`` elements (already split by TP): a matrix of ``cols`` columns, or
    a flat shard of 1/``shards`` of it."""
    if shards > 1 or cols <= 1 or numel % cols:
        return _Ideal(name, numel // shards, 1)
    return _Ideal(name, numel // cols, cols)


def layer_params(workload: Workload, layer: int, shards: int) -> list[_Ideal]:
    """The parameters of layout ``layer`` on one rank (their sizes are ``layer_elements``' terms)."""
    m, tp = workload.model, workload.parallelism.tensor
    h, V, L, f = m.hidden_size, m.vocab_size, m.num_layers, m.ffn_hidden_size
    if layer == 0:
        return [_param("model.embed_tokens.weight", h * V // tp, h, shards)]
    if layer == L + 1:
        return [_param("lm_head.weight", h * V // tp, h, shards)]
    if layer == L + 2:
        return [_param("model.norm.weight", h, 1, shards)]
    p = f"model.layers.{layer - 1}."
    return [_param(p + "input_layernorm.weight", h, 1, shards),
            _param(p + "self_attn.qkv_proj.weight", h * (h + 2 * m.kv_dim) // tp, h, shards),
            _param(p + "self_attn.o_proj.weight", h * h // tp, h, shards),
            _param(p + "post_attention_layernorm.weight", h, 1, shards),
            _param(p + "mlp.gate_up_proj.weight", h * 2 * f // tp, h, shards),
            _param(p + "mlp.down_proj.weight", h * f // tp, h, shards)]


def _optimizer(params: list[_Ideal], shards: int) -> list[_Ideal]:
    out = []
    for p in params:
        numel = p.rows * p.cols
        flat = _Ideal("", numel // shards, 1) if shards > 1 else p
        out += [_Ideal(f"optimizer.state.{p.name}.exp_avg", flat.rows, flat.cols),
                _Ideal(f"optimizer.state.{p.name}.exp_avg_sq", flat.rows, flat.cols),
                _Ideal(f"optimizer.master.{p.name}", flat.rows, flat.cols)]
    return out


def _fit(file: FileSpec, ideal: list[_Ideal], dtype: str) -> tuple[TensorSpec, ...]:
    """``ideal`` resized in proportion to tile ``file`` exactly (whole rows, at least one each),
    the rest as one uint8 tensor; one uint8 tensor if the file cannot hold one row of each."""
    size = DTYPE_BYTES[dtype]
    total = sum(t.rows * t.cols for t in ideal) * size
    rows = [max(1, t.rows * file.bytes // total) for t in ideal] if total else []
    if not rows or sum(r * t.cols for r, t in zip(rows, ideal, strict=True)) * size > file.bytes:
        return flat_tensors(file)
    out, offset = [], 0
    for r, t in zip(rows, ideal, strict=True):
        nbytes = r * t.cols * size
        out.append(TensorSpec(t.name, dtype, (r, t.cols) if t.cols > 1 else (r,), offset, nbytes))
        offset += nbytes
    if offset < file.bytes:
        rest = file.bytes - offset
        out.append(TensorSpec(f"{file.name}.rest", "uint8", (rest,), offset, rest))
    return tuple(out)


def _file_params(plan: Plan, rank: int) -> Iterator[tuple[FileSpec, list[_Ideal], str]]:
    """Each planned file of ``rank`` with the parameters it holds and their element type."""
    w, rp = plan.workload, plan.rank_plans[rank]
    zero, dp = plan.zero_stage, plan.dp
    model_shards = dp if zero >= 3 else 1
    layers = list(stage_layers(w.model.num_layers, plan.pp, rp.pp))
    stage = [p for layer in layers for p in layer_params(w, layer, model_shards)]
    model_files = [f for f in rp.files if f.kind == "model"]
    per_layer = len(model_files) == len(layers) > 1  # ZeRO 1/2 with PP: one file per layer
    for i, f in enumerate(model_files):
        held = layer_params(w, layers[i], model_shards) if per_layer else stage
        yield f, held, w.model.model_datatype
    full = [p for layer in layers for p in layer_params(w, layer, 1)]
    for f in rp.files:
        if f.kind == "optimizer":
            yield f, _optimizer(full, dp if zero > 0 else 1), w.model.optimizer_datatype


def rank_tensors(plan: Plan, rank: int) -> tuple[tuple[TensorSpec, ...], ...]:
    """The tensors of each of ``rank``'s planned files, in the plan's file order."""
    fitted = {f.name: _fit(f, ideal, dtype) for f, ideal, dtype in _file_params(plan, rank)}
    return tuple(fitted[f.name] for f in plan.rank_plans[rank].files)


def flat_tensors(file: FileSpec) -> tuple[TensorSpec, ...]:
    """``framework.tensors=flat``: the file as one uint8 tensor."""
    return (TensorSpec(file.name, "uint8", (file.bytes,), 0, file.bytes),)


def tensors_of(plan: Plan, rank: int, structure: str) -> tuple[tuple[TensorSpec, ...], ...]:
    """The tensors of each of ``rank``'s planned files under ``framework.tensors``."""
    if structure == "flat":
        return tuple(flat_tensors(f) for f in plan.rank_plans[rank].files)
    return rank_tensors(plan, rank)


def read_tensors(plan: Plan, reads: Sequence[RestoreRead], structure: str) -> list[tuple[TensorSpec, ...]]:
    """Each restore read's file's tensors, as its writer handed them (each writer's made once)."""
    by_writer = {w: tensors_of(plan, w, structure) for w in {rd.writer for rd in reads}}
    return [by_writer[rd.writer][rd.index] for rd in reads]
