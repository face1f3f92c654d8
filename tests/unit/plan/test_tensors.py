"""The named tensors a library writer is handed (mlckpt/workload/tensors.py): they tile every
planned file exactly, carry the model's names and shapes, and count what the rules hold a record to."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt.resources import workloads_dir
from mlckpt.workload.layout import Plan, make_plan
from mlckpt.workload.model import DTYPE_BYTES, ModelShape, Parallelism, Workload, workload_from_config
from mlckpt.workload.tensors import TensorSpec, rank_tensors, tensors_of

WORKLOAD_DIR = Path(workloads_dir()) / "workload"


@cache
def workload(name: str) -> Workload:
    return workload_from_config(yaml.safe_load((WORKLOAD_DIR / f"{name}.yaml").read_text(encoding="utf-8")))


def assert_tiles(plan: Plan, rank: int, tensors: tuple[tuple[TensorSpec, ...], ...]) -> None:
    files = plan.rank_plans[rank].files
    assert len(tensors) == len(files)
    for f, ts in zip(files, tensors, strict=True):
        offset = 0
        for t in ts:
            size = DTYPE_BYTES[t.dtype]
            assert t.offset == offset, (f.name, t.name)
            assert t.offset % size == 0  # a typed view of the state is aligned
            n = 1
            for d in t.shape:
                assert d >= 1
                n *= d
            assert n * size == t.nbytes
            offset += t.nbytes
        assert offset == f.bytes, f.name
        assert len({t.name for t in ts}) == len(ts)


@pytest.mark.parametrize("name", sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml")))
def test_every_canonical_file_is_tiled_exactly(name: str) -> None:
    w = workload(name)
    plan = make_plan(w, w.closed_ranks)
    for ranks, _ in plan.layout_groups():
        assert_tiles(plan, ranks[0], rank_tensors(plan, ranks[0]))


def test_llama3_8b_rank_holds_its_shard_by_name() -> None:
    plan = make_plan(workload("llama3_8b"), 8)  # TP 1, PP 1, ZeRO 3: every tensor a flat 1/8 shard
    model, optim = rank_tensors(plan, 3)
    assert len(model) == 32 * 6 + 3 and len(optim) == 3 * (32 * 6 + 3) + 1
    assert model[0] == TensorSpec("model.embed_tokens.weight", "fp16", (4096 * 128256 // 8,), 0,
                                  4096 * 128256 // 8 * 2)
    names = [t.name for t in model]
    assert names[1:7] == [f"model.layers.0.{n}.weight" for n in (
        "input_layernorm", "self_attn.qkv_proj", "self_attn.o_proj", "post_attention_layernorm",
        "mlp.gate_up_proj", "mlp.down_proj")]
    assert names[-2:] == ["lm_head.weight", "model.norm.weight"]
    assert [t.name for t in optim[:3]] == ["optimizer.state.model.embed_tokens.weight.exp_avg",
                                           "optimizer.state.model.embed_tokens.weight.exp_avg_sq",
                                           "optimizer.master.model.embed_tokens.weight"]
    assert {t.dtype for t in optim[:-1]} == {"fp32"}
    # DLIO's optimizer size is an average over ranks: the moments are resized to fill it, the
    # whole elements they leave over are one uint8 tensor
    assert optim[-1].name.endswith("optim_states.pt.rest") and optim[-1].dtype == "uint8"
    assert optim[-1].nbytes < 3 * len(model) * 4


def test_tensor_parallel_matrices_keep_their_shapes() -> None:
    w = dataclasses.replace(workload("llama3_8b"), parallelism=Parallelism(2, 2, 1))
    plan = make_plan(w, 8)  # ZeRO 1 with PP: one model file per layer on the dp == 0 ranks
    files = plan.rank_plans[0].files
    tensors = rank_tensors(plan, 0)
    first_block = next(ts for f, ts in zip(files, tensors, strict=True) if f.name.startswith("layer_1-"))
    shapes = {t.name.rsplit(".", 2)[-2]: t.shape for t in first_block}
    assert shapes == {"input_layernorm": (4096,), "qkv_proj": ((4096 + 2 * 1024) // 2, 4096),
                      "o_proj": (4096 // 2, 4096), "post_attention_layernorm": (4096,),
                      "gate_up_proj": (14336, 4096), "down_proj": (14336 // 2, 4096)}
    assert sum(len(ts) for ts in tensors) > 100
    assert_tiles(plan, 0, tensors)


def test_a_scaled_file_keeps_every_tensor() -> None:
    plan = make_plan(workload("llama3_8b"), 8, 0.001)
    full = make_plan(workload("llama3_8b"), 8)
    for rank in (0, 7):
        small = rank_tensors(plan, rank)
        assert_tiles(plan, rank, small)
        assert len(small[0]) >= len(rank_tensors(full, rank)[0])


def test_flat_is_one_uint8_tensor_per_file() -> None:
    plan = make_plan(workload("llama3_8b"), 8)
    flat = tensors_of(plan, 5, "flat")
    assert [len(ts) for ts in flat] == [1, 1]
    files = plan.rank_plans[5].files
    assert [(t.dtype, t.nbytes) for ts in flat for t in ts] == [("uint8", f.bytes) for f in files]


def test_a_file_too_small_for_its_tensors_is_one() -> None:
    m = ModelShape(hidden_size=64, num_layers=400, ffn_hidden_size=128, vocab_size=512, num_attention_heads=4,
                   num_kv_heads=4)
    plan = make_plan(Workload("tiny", m, Parallelism(1, 1, 3), 2), 2, 0.0001)  # one page per file
    tensors = rank_tensors(plan, 0)
    assert_tiles(plan, 0, tensors)
    assert [len(ts) for ts in tensors] == [1, 1] and tensors[0][0].dtype == "uint8"


@settings(max_examples=60, deadline=None)
@given(h=st.sampled_from([64, 128, 4096]), layers=st.integers(1, 12), heads=st.sampled_from([1, 2, 4]),
       ffn=st.sampled_from([96, 256, 11008]), vocab=st.sampled_from([100, 32000]),
       tp=st.sampled_from([1, 2, 4]), pp=st.integers(1, 4), zero=st.sampled_from([0, 1, 2, 3]),
       dp=st.integers(1, 4), scale=st.sampled_from([1.0, 0.5, 0.01]),
       dtype=st.sampled_from(["fp16", "bf16", "fp32"]))
def test_any_layout_is_tiled_exactly(h: int, layers: int, heads: int, ffn: int, vocab: int, tp: int, pp: int,
                                     zero: int, dp: int, scale: float, dtype: str) -> None:
    if pp > layers or (zero == 3 and pp > 1):
        return  # LAYERS-PIPELINE, ZERO3-PIPELINE refuse these
    m = ModelShape(hidden_size=h, num_layers=layers, ffn_hidden_size=ffn, vocab_size=vocab,
                   num_attention_heads=heads, num_kv_heads=heads, model_datatype=dtype)
    plan = make_plan(Workload("w", m, Parallelism(tp, pp, zero), tp * pp * dp), tp * pp * dp, scale)
    for rank in range(plan.ranks):
        assert_tiles(plan, rank, rank_tensors(plan, rank))
