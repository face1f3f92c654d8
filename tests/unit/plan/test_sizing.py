"""Sizing: totals, per-rank files and bytes, rank mapping, stages, scaling, restore."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt.resources import workloads_dir
from mlckpt.workload.layout import (
    PAGE,
    Plan,
    auto_rank_shift,
    make_plan,
    rank_coords,
    scale_bytes,
    stage_layers,
)
from mlckpt.workload.model import Workload, workload_from_config

GiB = 2**30
WORKLOAD_DIR = Path(workloads_dir()) / "workload"


@cache
def workload(name: str) -> Workload:
    node = yaml.safe_load((WORKLOAD_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    return workload_from_config(node)


@cache
def plan(name: str, ranks: int | None = None, scale: float = 1.0) -> Plan:
    w = workload(name)
    return make_plan(w, ranks if ranks is not None else w.closed_ranks, scale)


def files(p: Plan, rank: int) -> list[tuple[str, int]]:
    return [(f.name, f.bytes) for f in p.rank_plans[rank].files]


# ---------------------------------------------------------------------------------------------
# Reference figures (DLIO's own code).

# name: (closed ranks, parameters, total bytes, files, max bytes on one rank)
TOTALS = {
    "llama_7b": (8, 6_738_415_616, 94_339_784_704, 9, 23_584_700_416),
    "llama_7b_zero3": (8, 6_738_415_616, 94_339_784_704, 16, 11_792_473_088),
    "llama3_8b": (8, 8_030_261_248, 112_425_623_552, 16, 14_053_202_944),
    "llama_70b": (64, 69_882_617_856, 978_406_572_032, 728, 17_603_069_440),
    "llama_70b_zero3": (64, 69_882_617_856, 978_406_572_032, 128, 15_287_602_688),
    "llama3_70b": (64, 69_882_617_856, 978_406_572_032, 128, 15_287_602_688),
    "llama_405b": (512, 405_853_388_800, 5_682_508_791_808, 1544, 13_226_441_600),
    "llama3_405b": (512, 405_853_388_800, 5_682_508_791_808, 1544, 13_226_441_600),
    "llama_1t": (1024, 1_183_035_102_480, 16_564_174_094_592, 2072, 19_290_344_604),
    "llama3_1t": (1024, 1_183_035_102_480, 16_564_174_094_592, 2072, 19_290_344_604),
}
# The canonical totals in GiB (2 decimals).
TOTAL_GIB = {"llama_7b": 87.86, "llama3_8b": 104.70, "llama3_70b": 911.21, "llama3_405b": 5292.25,
             "llama3_1t": 15426.59}


def test_every_workload_file_has_reference_figures() -> None:
    assert sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml")) == sorted(TOTALS)


@pytest.mark.parametrize("name", sorted(TOTALS))
def test_workload_totals(name: str) -> None:
    ranks, params, total, nfiles, max_rank = TOTALS[name]
    w = workload(name)
    assert w.closed_ranks == ranks
    assert w.model.num_parameters == params
    p = plan(name)
    assert p.total_bytes == total
    assert p.model_bytes + p.optimizer_bytes == total
    assert p.num_files == nfiles
    assert p.max_rank_bytes == max_rank
    assert sum(rp.bytes for rp in p.rank_plans) == total


@pytest.mark.parametrize("name", sorted(TOTAL_GIB))
def test_totals_in_gib_match_spec(name: str) -> None:
    assert round(plan(name).total_bytes / GiB, 2) == TOTAL_GIB[name]


def test_max_rank_gib_of_the_large_workloads() -> None:
    assert round(plan("llama3_405b").max_rank_bytes / GiB, 2) == 12.32
    assert round(plan("llama3_1t").max_rank_bytes / GiB, 2) == 17.97


def test_head_dim_floors_like_dlio() -> None:
    m = workload("llama3_1t").model
    assert m.head_dim == 134  # 25872 / 192 = 134.75
    assert m.kv_dim == 134 * 32


# ---------------------------------------------------------------------------------------------
# Per-rank files and bytes.

def test_llama_7b_zero1_single_stage() -> None:
    p = plan("llama_7b")
    assert files(p, 0) == [("model_0_model_states.pt", 13_476_831_232),
                           ("zero_pp_rank_0_mp_rank_0_optim_states.pt", 10_107_869_184)]
    for r in range(1, 8):  # ZeRO 1: replicas write no model states
        assert files(p, r) == [(f"zero_pp_rank_{r}_mp_rank_0_optim_states.pt", 10_107_869_184)]


def test_llama_7b_zero3_every_rank_writes_a_model_shard() -> None:
    p = plan("llama_7b_zero3")
    for r in range(8):
        assert files(p, r) == [(f"zero_pp_rank_{r}_mp_rank_0_model_states.pt", 1_684_603_904),
                               (f"zero_pp_rank_{r}_mp_rank_0_optim_states.pt", 10_107_869_184)]


def test_llama3_8b_per_rank() -> None:
    p = plan("llama3_8b")
    for r in (0, 3, 7):
        assert files(p, r) == [(f"zero_pp_rank_{r}_mp_rank_0_model_states.pt", 2_007_565_312),
                               (f"zero_pp_rank_{r}_mp_rank_0_optim_states.pt", 12_045_637_632)]
        assert p.rank_plans[r].bytes == 14_053_202_944


def test_llama3_70b_per_rank() -> None:
    p = plan("llama3_70b")
    for r, dp, mp in ((0, 0, 0), (7, 0, 7), (8, 1, 0), (63, 7, 7)):
        assert files(p, r) == [(f"zero_pp_rank_{dp}_mp_rank_{mp}_model_states.pt", 2_184_120_320),
                               (f"zero_pp_rank_{dp}_mp_rank_{mp}_optim_states.pt", 13_103_482_368)]


LLAMA70_BLOCK, LLAMA70_EMB, LLAMA70_NORM, LLAMA70_OPT = 211_845_120, 262_668_288, 16_384, 13_103_482_368


def test_llama_70b_pp4_stages() -> None:
    p = plan("llama_70b")  # TP8 PP4 ZeRO1, 64 ranks, DP 2; 80 layers → 20 blocks per stage
    first = files(p, 0)
    assert first[0] == ("layer_0-model_0_model_states.pt", LLAMA70_EMB)
    assert first[1:21] == [(f"layer_{i}-model_0_model_states.pt", LLAMA70_BLOCK) for i in range(1, 21)]
    assert first[21:] == [("zero_pp_rank_0_mp_rank_0_optim_states.pt", LLAMA70_OPT)]
    # middle stage 2, tp 0 → rank 16
    assert files(p, 16) == [(f"layer_{i}-model_16_model_states.pt", LLAMA70_BLOCK) for i in range(41, 61)] + [
        ("zero_pp_rank_0_mp_rank_16_optim_states.pt", LLAMA70_OPT)]
    # last stage 3, tp 7 → rank 31: blocks 61..80, lm_head 81, final norm 82
    assert files(p, 31) == (
        [(f"layer_{i}-model_31_model_states.pt", LLAMA70_BLOCK) for i in range(61, 81)]
        + [("layer_81-model_31_model_states.pt", LLAMA70_EMB),
           ("layer_82-model_31_model_states.pt", LLAMA70_NORM),
           ("zero_pp_rank_0_mp_rank_31_optim_states.pt", LLAMA70_OPT)])
    # dp 1 under ZeRO 1: optimizer only
    assert files(p, 32) == [("zero_pp_rank_1_mp_rank_0_optim_states.pt", LLAMA70_OPT)]
    assert files(p, 63) == [("zero_pp_rank_1_mp_rank_31_optim_states.pt", LLAMA70_OPT)]
    layer_counts = {sum(f.kind == "model" for f in rp.files) for rp in p.rank_plans if rp.dp == 0}
    assert layer_counts == {20, 21, 22}


B405, E405, N405, O405 = 796_983_296, 525_336_576, 32_768, 9_513_171_840


def test_llama3_405b_stages() -> None:
    p = plan("llama3_405b")  # TP8 PP32 ZeRO1; 126 blocks = 30 stages of 4 + 2 stages of 3
    assert files(p, 0) == [("layer_0-model_0_model_states.pt", E405)] + [
        (f"layer_{i}-model_0_model_states.pt", B405) for i in range(1, 5)] + [
        ("zero_pp_rank_0_mp_rank_0_optim_states.pt", O405)]
    assert p.rank_plans[0].bytes == E405 + 4 * B405 + O405 == 13_226_441_600
    # middle: rank 123 = tp 3, stage 15 → blocks 61..64
    assert files(p, 123) == [(f"layer_{i}-model_123_model_states.pt", B405) for i in range(61, 65)] + [
        ("zero_pp_rank_0_mp_rank_123_optim_states.pt", O405)]
    # stage 30 (first of the short stages): rank 240 → blocks 121..123
    assert files(p, 240) == [(f"layer_{i}-model_240_model_states.pt", B405) for i in range(121, 124)] + [
        ("zero_pp_rank_0_mp_rank_240_optim_states.pt", O405)]
    # last stage 31: rank 255 → blocks 124..126, lm_head 127, final norm 128
    assert files(p, 255) == [(f"layer_{i}-model_255_model_states.pt", B405) for i in range(124, 127)] + [
        ("layer_127-model_255_model_states.pt", E405),
        ("layer_128-model_255_model_states.pt", N405),
        ("zero_pp_rank_0_mp_rank_255_optim_states.pt", O405)]
    assert p.rank_plans[255].bytes == 3 * B405 + E405 + N405 + O405
    for r, mp in ((256, 0), (300, 44), (511, 255)):  # dp 1: optimizer only
        assert files(p, r) == [(f"zero_pp_rank_1_mp_rank_{mp}_optim_states.pt", O405)]
    layer_counts = {sum(f.kind == "model" for f in rp.files) for rp in p.rank_plans if rp.dp == 0}
    assert layer_counts == {3, 4, 5}
    assert {rp.optimizer_bytes for rp in p.rank_plans} == {O405}


B1T, E1T, N1T, O1T = 2_297_744_064, 829_559_808, 51_744, 13_865_244_924


def test_llama3_1t_stages() -> None:
    p = plan("llama3_1t")  # TP8 PP64 ZeRO1; 128 blocks = 2 per stage
    assert files(p, 0) == [("layer_0-model_0_model_states.pt", E1T),
                           ("layer_1-model_0_model_states.pt", B1T),
                           ("layer_2-model_0_model_states.pt", B1T),
                           ("zero_pp_rank_0_mp_rank_0_optim_states.pt", O1T)]
    # middle: rank 261 = tp 5, stage 32 → blocks 65, 66
    assert files(p, 261) == [("layer_65-model_261_model_states.pt", B1T),
                             ("layer_66-model_261_model_states.pt", B1T),
                             ("zero_pp_rank_0_mp_rank_261_optim_states.pt", O1T)]
    # last stage 63: rank 511 → blocks 127, 128, lm_head 129, final norm 130
    assert files(p, 511) == [("layer_127-model_511_model_states.pt", B1T),
                             ("layer_128-model_511_model_states.pt", B1T),
                             ("layer_129-model_511_model_states.pt", E1T),
                             ("layer_130-model_511_model_states.pt", N1T),
                             ("zero_pp_rank_0_mp_rank_511_optim_states.pt", O1T)]
    assert p.rank_plans[511].bytes == 2 * B1T + E1T + N1T + O1T == 19_290_344_604
    for r, mp in ((512, 0), (777, 265), (1023, 511)):
        assert files(p, r) == [(f"zero_pp_rank_1_mp_rank_{mp}_optim_states.pt", O1T)]
    layer_counts = {sum(f.kind == "model" for f in rp.files) for rp in p.rank_plans if rp.dp == 0}
    assert layer_counts == {2, 3, 4}


def test_zero0_only_dp0_writes() -> None:
    # mlckpt/workload/layout.py: "ZeRO 0: only dp == 0 ranks write, as DLIO does" (DLIO's base_checkpointing
    # sets rank_to_checkpoint only for rank < MP when zero_stage == 0; optimizer n = P // MP).
    w = workload("llama_7b")
    w0 = dataclasses.replace(w, parallelism=dataclasses.replace(w.parallelism, zero_stage=0))
    p = make_plan(w0, 8)
    opt = (3 * (w.model.num_parameters // 1) + 15 * 4096) * 4
    assert files(p, 0) == [("zero_pp_rank_0_mp_rank_0_model_states.pt", 13_476_831_232),
                           ("zero_pp_rank_0_mp_rank_0_optim_states.pt", opt)]
    assert all(files(p, r) == [] for r in range(1, 8))


# ---------------------------------------------------------------------------------------------
# An independent re-implementation of DLIO's formulas, compared on every rank of every workload.

def spec_rank_files(w: Workload, ranks: int, r: int) -> list[tuple[str, int]]:
    m, par = w.model, w.parallelism
    h, L, f, V = m.hidden_size, m.num_layers, m.ffn_hidden_size, m.vocab_size
    TP, PP, Z = par.tensor, par.pipeline, par.zero_stage
    MP = TP * PP
    DP = ranks // MP
    pp, dp, mp_rank = (r // TP) % PP, r // MP, r % MP
    head = h // m.num_attention_heads
    dkv = head * m.num_kv_heads
    P = V * h + L * (h + h * (h + 2 * dkv) + h * h + h + 2 * f * h + f * h) + h + V * h
    base, extra = divmod(L, PP)
    blocks_before = sum(base + (1 if s < extra else 0) for s in range(pp))
    count = base + (1 if pp < extra else 0)
    layers = list(range(blocks_before + 1, blocks_before + 1 + count))
    if pp == 0:
        layers = [0, *layers]
    if pp == PP - 1:
        layers += [L + 1, L + 2]
    s = DP if Z >= 3 else 1

    def elems(i: int) -> int:
        if i in (0, L + 1):
            return h * V // TP // s
        if i == L + 2:
            return h // s
        return sum([h // s, h * (h + 2 * dkv) // TP // s, h * h // TP // s, h // s,
                    h * 2 * f // TP // s, h * f // TP // s])

    n = P // (DP * MP) if Z > 0 else P // MP
    optim = (3 * n + 15 * h) * 4
    out: list[tuple[str, int]] = []
    if Z in (1, 2):
        if dp == 0:
            if PP > 1:
                out += [(f"layer_{i}-model_{mp_rank}_model_states.pt", elems(i) * 2) for i in layers]
            else:
                out.append((f"model_{mp_rank}_model_states.pt", sum(map(elems, layers)) * 2))
    else:
        out.append((f"zero_pp_rank_{dp}_mp_rank_{mp_rank}_model_states.pt",
                    sum(map(elems, layers)) * 2))
    out.append((f"zero_pp_rank_{dp}_mp_rank_{mp_rank}_optim_states.pt", optim))
    return out


@pytest.mark.parametrize("name", sorted(TOTALS))
def test_every_rank_matches_the_spec_formulas(name: str) -> None:
    p = plan(name)
    w = workload(name)
    for r in range(p.ranks):
        assert files(p, r) == spec_rank_files(w, p.ranks, r), f"rank {r}"


@pytest.mark.parametrize(("name", "ranks"), [("llama3_405b", 1024), ("llama_70b", 128),
                                             ("llama3_70b", 128), ("llama3_8b", 16)])
def test_non_canonical_rank_counts_match_the_spec_formulas(name: str, ranks: int) -> None:
    p = plan(name, ranks)
    w = workload(name)
    assert p.dp == ranks // w.parallelism.model_parallel
    for r in range(0, ranks, 7):
        assert files(p, r) == spec_rank_files(w, ranks, r), f"rank {r}"


def test_405b_on_1024_ranks_totals() -> None:
    p = plan("llama3_405b", 1024)
    assert (p.dp, p.total_bytes, p.num_files) == (4, 5_683_012_108_288, 2056)


# ---------------------------------------------------------------------------------------------
# Rank mapping and stages.

@pytest.mark.parametrize(("rank", "tp", "pp", "expected"), [
    (0, 8, 32, (0, 0, 0, 0)),
    (7, 8, 32, (7, 0, 0, 7)),
    (8, 8, 32, (0, 1, 0, 8)),
    (123, 8, 32, (3, 15, 0, 123)),
    (255, 8, 32, (7, 31, 0, 255)),
    (256, 8, 32, (0, 0, 1, 0)),
    (300, 8, 32, (4, 5, 1, 44)),
    (511, 8, 32, (7, 31, 1, 255)),
    (0, 8, 64, (0, 0, 0, 0)),
    (261, 8, 64, (5, 32, 0, 261)),
    (511, 8, 64, (7, 63, 0, 511)),
    (512, 8, 64, (0, 0, 1, 0)),
    (777, 8, 64, (1, 33, 1, 265)),
    (1023, 8, 64, (7, 63, 1, 511)),
    (5, 1, 1, (0, 0, 5, 0)),
    (13, 8, 1, (5, 0, 1, 5)),
])
def test_rank_coords(rank: int, tp: int, pp: int, expected: tuple[int, int, int, int]) -> None:
    assert rank_coords(rank, tp, pp) == expected


def test_rank_plans_carry_their_coordinates() -> None:
    p = plan("llama3_1t")
    for r in (0, 261, 511, 512, 777, 1023):
        rp = p.rank_plans[r]
        assert (rp.rank, rp.tp, rp.pp, rp.dp, rp.mp_rank) == (r, *rank_coords(r, 8, 64))


def check_stage_cover(L: int, PP: int) -> None:
    seen: list[int] = []
    base, extra = divmod(L, PP)
    for s in range(PP):
        layers = list(stage_layers(L, PP, s))
        assert layers == sorted(layers) and layers, (L, PP, s)
        seen += layers
        blocks = [i for i in layers if 1 <= i <= L]
        assert len(blocks) == base + (1 if s < extra else 0), (L, PP, s)
        assert (0 in layers) == (s == 0)
        assert (L + 1 in layers) == (L + 2 in layers) == (s == PP - 1)
    assert seen == list(range(L + 3))  # every layer exactly once, in stage order


@pytest.mark.parametrize(("L", "PP"), [(32, 1), (80, 4), (126, 32), (128, 64), (7, 7), (10, 3), (5, 1)])
def test_stage_layers_cover(L: int, PP: int) -> None:
    check_stage_cover(L, PP)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200).flatmap(lambda pp: st.tuples(st.integers(pp, 400), st.just(pp))))
def test_stage_layers_cover_property(lp: tuple[int, int]) -> None:
    check_stage_cover(*lp)


def test_stage_layers_examples() -> None:
    assert stage_layers(126, 32, 0) == range(0, 5)
    assert stage_layers(126, 32, 29) == range(117, 121)
    assert stage_layers(126, 32, 30) == range(121, 124)
    assert stage_layers(126, 32, 31) == range(124, 129)
    assert stage_layers(128, 64, 63) == range(127, 131)
    assert stage_layers(32, 1, 0) == range(0, 35)


def test_make_plan_refuses_structurally_invalid_input() -> None:
    w = workload("llama3_405b")
    for ranks, scale in ((1000, 1.0), (0, 1.0), (512, 0.0), (512, 1.5)):
        with pytest.raises(ValueError):
            make_plan(w, ranks, scale)
    short = dataclasses.replace(w, model=dataclasses.replace(w.model, num_layers=16))
    with pytest.raises(ValueError):
        make_plan(short, 512)


# ---------------------------------------------------------------------------------------------
# Scaling (open division).

def expected_scaled(b: int, scale: float) -> int:
    return min(b, max(4096, round(b * scale / 4096) * 4096))


@pytest.mark.parametrize("name", ["llama3_8b", "llama_70b", "llama3_405b", "llama3_1t"])
def test_scale_001_keeps_layout(name: str) -> None:
    full, small = plan(name), plan(name, None, 0.01)
    assert small.num_files == full.num_files
    for a, b in zip(full.rank_plans, small.rank_plans, strict=True):
        assert [f.name for f in a.files] == [f.name for f in b.files]
        assert [f.kind for f in a.files] == [f.kind for f in b.files]
        assert [f.bytes for f in b.files] == [expected_scaled(f.bytes, 0.01) for f in a.files]
        assert all(f.bytes % PAGE == 0 and f.bytes >= PAGE for f in b.files)


def test_scale_001_figures() -> None:
    p = plan("llama3_1t", None, 0.01)
    assert files(p, 511)[-2:] == [("layer_130-model_511_model_states.pt", 4096),  # 517 B → 1 page
                                  ("zero_pp_rank_0_mp_rank_511_optim_states.pt", 138_653_696)]
    assert files(p, 0)[0] == ("layer_0-model_0_model_states.pt", 8_294_400)


def test_scale_bytes_edges() -> None:
    assert scale_bytes(13_865_244_924, 1.0) == 13_865_244_924  # full scale is exact, not paged
    assert scale_bytes(10, 0.5) == 10  # never larger than the full size
    assert scale_bytes(10 * PAGE, 0.01) == PAGE
    assert scale_bytes(1_000_000, 1e-9) == PAGE
    assert scale_bytes(3 * PAGE, 0.5) == 2 * PAGE  # 1.5 pages rounds to even (banker's) → 2
    assert scale_bytes(5 * PAGE, 0.5) == 2 * PAGE  # 2.5 pages → 2


SCALE_WORKLOADS = ["llama_7b", "llama3_8b", "llama_70b", "llama3_405b"]


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(SCALE_WORKLOADS),
       s1=st.floats(min_value=1e-6, max_value=1.0, exclude_min=False, exclude_max=True),
       s2=st.floats(min_value=1e-6, max_value=1.0, exclude_min=False, exclude_max=True))
def test_scale_property(name: str, s1: float, s2: float) -> None:
    lo, hi = sorted((s1, s2))
    full, a, b = plan(name), make_plan(workload(name), workload(name).closed_ranks, lo), \
        make_plan(workload(name), workload(name).closed_ranks, hi)
    assert a.num_files == b.num_files == full.num_files
    for fr, ar, br in zip(full.rank_plans, a.rank_plans, b.rank_plans, strict=True):
        assert [f.name for f in ar.files] == [f.name for f in br.files] == [f.name for f in fr.files]
        for ff, af, bf in zip(fr.files, ar.files, br.files, strict=True):
            # Whole pages, except a file capped at its (not page-aligned) full size.
            assert af.bytes % PAGE == 0 or af.bytes == ff.bytes
            assert bf.bytes % PAGE == 0 or bf.bytes == ff.bytes
            assert min(PAGE, ff.bytes) <= af.bytes <= bf.bytes <= ff.bytes
            assert af.bytes == expected_scaled(ff.bytes, lo)
    assert a.total_bytes <= b.total_bytes


@settings(max_examples=25, deadline=None)
@given(st.floats(min_value=1e-6, max_value=1.0))
def test_scale_keeps_file_count_including_full(scale: float) -> None:
    p = make_plan(workload("llama_70b"), 64, scale)
    assert p.num_files == 728
    full = plan("llama_70b")
    assert [f.name for f in p.rank_plans[31].files] == [f.name for f in full.rank_plans[31].files]


def test_scaled_file_never_exceeds_full_size() -> None:
    full, near = plan("llama3_1t"), plan("llama3_1t", None, 0.9999)
    for fr, nr in zip(full.rank_plans, near.rank_plans, strict=True):
        for ff, nf in zip(fr.files, nr.files, strict=True):
            assert nf.bytes <= ff.bytes, (nf.name, ff.bytes, nf.bytes)


# ---------------------------------------------------------------------------------------------
# Restore, residency, balance, layout groups.

def test_restore_own_reads_what_each_rank_wrote() -> None:
    p = plan("llama3_405b")
    for r in (0, 255, 256, 511):
        reads = p.restore_reads(r, "own")
        assert [(rd.writer, rd.file) for rd in reads] == [(r, f) for f in p.rank_plans[r].files]
    assert p.restore_bytes("own") == p.total_bytes


def test_restore_repopulate_zero1_reads_dp0_model_files() -> None:
    p = plan("llama3_405b")
    reads = p.restore_reads(256, "repopulate")  # dp 1, mp_rank 0 → source rank 0
    model = [rd for rd in reads if rd.file.kind == "model"]
    assert [rd.writer for rd in model] == [0] * 5
    assert [rd.file.name for rd in model] == [f"layer_{i}-model_0_model_states.pt" for i in range(5)]
    optim = [rd for rd in reads if rd.file.kind == "optimizer"]
    assert [(rd.writer, rd.file.name) for rd in optim] == [
        (256, "zero_pp_rank_1_mp_rank_0_optim_states.pt")]
    reads = p.restore_reads(511, "repopulate")  # dp 1, mp_rank 255 → source rank 255 (last stage)
    assert {rd.writer for rd in reads if rd.file.kind == "model"} == {255}
    assert sum(rd.file.bytes for rd in reads) == 3 * B405 + E405 + N405 + O405
    # dp 0 ranks read only their own files either way
    assert p.restore_reads(0, "repopulate") == p.restore_reads(0, "own")
    assert p.restore_bytes("repopulate") == p.total_bytes + p.model_bytes  # DP = 2


def test_restore_repopulate_scales_with_dp() -> None:
    p = plan("llama3_405b", 1024)  # DP 4: three replicas re-read the model states
    assert p.restore_bytes("repopulate") == p.total_bytes + 3 * p.model_bytes == 8_118_306_537_472
    p1t = plan("llama3_1t")
    assert p1t.restore_bytes("repopulate") == 18_930_337_387_008 == p1t.total_bytes + p1t.model_bytes


@pytest.mark.parametrize("name", ["llama3_8b", "llama3_70b", "llama_7b_zero3"])
def test_restore_zero3_patterns_equal(name: str) -> None:
    p = plan(name)
    for r in range(p.ranks):
        assert p.restore_reads(r, "repopulate") == p.restore_reads(r, "own")
    assert p.restore_bytes("repopulate") == p.restore_bytes("own") == p.total_bytes


def pg(nbytes: int) -> int:
    """Page-rounded size of one buffer."""
    return -(-nbytes // PAGE) * PAGE


def test_resident_bytes_are_page_rounded_buffers() -> None:
    p = plan("llama3_405b")
    assert pg(O405) == 9_513_172_992  # O405 is not a whole number of pages
    assert p.resident_bytes(256) == p.resident_bytes(256, "own") == pg(O405)
    assert p.resident_bytes(256, "repopulate") == pg(E405) + 4 * pg(B405) + pg(O405) == 13_226_442_752
    assert p.resident_bytes(0, "own") == p.resident_bytes(0, "repopulate") == 13_226_442_752
    assert p.resident_bytes(255) == 3 * pg(B405) + pg(E405) + pg(N405) + pg(O405)
    p8 = plan("llama3_8b")
    assert p8.resident_bytes(3, "repopulate") == p8.resident_bytes(3)
    assert p8.resident_bytes(3) == pg(2_007_565_312) + pg(12_045_637_632)


def test_restore_shift_reads_another_ranks_files() -> None:
    p = plan("llama3_405b")
    # shift 8: rank 0 restores what rank 8 wrote; the last rank wraps around to rank 7
    assert [(rd.writer, rd.file.name) for rd in p.restore_reads(0, "own", 8)] == [
        (8, f.name) for f in p.rank_plans[8].files]
    assert [rd.writer for rd in p.restore_reads(511, "own", 8)] == [7] * len(p.rank_plans[7].files)
    # rank 248 + 8 = 256 (dp 1): under repopulate it reads rank 0's model files plus 256's optimizer
    reads = p.restore_reads(248, "repopulate", 8)
    assert [rd.writer for rd in reads] == [0] * 5 + [256]
    assert [rd.index for rd in reads] == [0, 1, 2, 3, 4, 0]
    # resident state covers the larger of own shard and what is restored
    assert p.resident_bytes(256, "own", 256) == p.resident_bytes(0)
    assert auto_rank_shift([4, 4]) == 4
    assert auto_rank_shift([3, 3, 2]) == 3
    assert auto_rank_shift([8]) == 0


def test_imbalance() -> None:
    assert plan("llama3_8b").imbalance == 1.0
    assert plan("llama3_70b").imbalance == 1.0
    p = plan("llama3_1t")
    assert p.imbalance == pytest.approx(19_290_344_604 * 1024 / 16_564_174_094_592)
    assert round(p.imbalance, 4) == 1.1925
    assert round(plan("llama_7b").imbalance, 4) == round(23_584_700_416 * 8 / 94_339_784_704, 4) == 2.0


@pytest.mark.parametrize(("name", "groups"), [("llama3_8b", 1), ("llama_7b", 2), ("llama_70b", 5),
                                              ("llama3_405b", 33), ("llama3_1t", 65)])
def test_layout_groups_cover_every_rank_once(name: str, groups: int) -> None:
    p = plan(name)
    gs = p.layout_groups()
    assert len(gs) == groups
    members = sorted(r for ranks, _ in gs for r in ranks)
    assert members == list(range(p.ranks))
    for ranks, rep in gs:
        assert rep.rank == ranks[0]
        assert all(p.rank_plans[r].layout_key() == rep.layout_key() for r in ranks)
        assert all(p.rank_plans[r].bytes == rep.bytes for r in ranks)


def test_layout_groups_1t() -> None:
    p = plan("llama3_1t")
    gs = p.layout_groups()
    # one group per pipeline stage among the dp 0 ranks (8 TP ranks each), one for all dp 1 ranks
    sizes = sorted(len(ranks) for ranks, _ in gs)
    assert sizes == [8] * 64 + [512]
    replicas = next(ranks for ranks, _ in gs if len(ranks) == 512)
    assert replicas == list(range(512, 1024))
    key = dict(gs[0][1].layout_key())
    assert key == {"layer_0-model_{mp}_model_states.pt": E1T, "layer_1-model_{mp}_model_states.pt": B1T,
                   "layer_2-model_{mp}_model_states.pt": B1T,
                   "zero_pp_rank_{dp}_mp_rank_{mp}_optim_states.pt": O1T}


# ---------------------------------------------------------------------- failures (Young/Daly)
def test_failure_cost_known_values() -> None:
    from mlckpt.plan.sizer import failure_cost

    r = failure_cost(86_400, 60, 120, 3600)
    assert r.young_interval_s == pytest.approx(math.sqrt(2 * 60 * 86_400))  # 3219.9 s
    assert r.daly_interval_s == pytest.approx(3180.06, abs=0.01)
    assert r.lost_per_failure_s == pytest.approx((3600 + 60) / 2 + 120)
    assert r.wasted_fraction == pytest.approx(60 / 3600 + r.lost_per_failure_s / 86_400)
    # asynchronous: training waits 2 s, but the checkpoint is safe only after 60 s
    a = failure_cost(86_400, 2, 120, 3600, durable_after_s=60)
    assert a.young_interval_s == pytest.approx(math.sqrt(2 * 2 * 86_400))
    assert a.lost_per_failure_s == pytest.approx((3600 + 2) / 2 + 58 + 120)
    assert failure_cost(10, 30, 0, 60).daly_interval_s == 10  # C ≥ 2M: checkpoint every M
    with pytest.raises(ValueError):
        failure_cost(0, 1, 1, 1)


@given(st.floats(1, 600), st.floats(3600, 30 * 86_400), st.floats(0, 600))
def test_the_daly_interval_wastes_least(cost: float, mtbf: float, restore: float) -> None:
    from mlckpt.plan.sizer import failure_cost

    best = failure_cost(mtbf, cost, restore, 1.0)
    at = best.daly_interval_s
    waste = failure_cost(mtbf, cost, restore, at).wasted_fraction
    for other in (at / 2, at * 2):
        assert waste <= failure_cost(mtbf, cost, restore, other).wasted_fraction + 1e-12


def test_size_cli_with_mtbf_and_stall(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "mlckpt"
    proc = subprocess.run([str(exe), "size", "workload=llama3_70b", "--interval", "1h", "--bandwidth",
                           "20GiB/s", "--mtbf", "12h", "--stall", "3s", "--json"],
                          text=True, capture_output=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)["failures"]
    assert f["cost_s"] == 3 and f["durable_after_s"] == pytest.approx(978_406_572_032 / (20 * 2**30))
    assert f["young_interval_s"] == pytest.approx(math.sqrt(2 * 3 * 12 * 3600))
    bad = subprocess.run([str(exe), "size", "--interval", "1h", "--bandwidth", "1GiB/s", "--stall", "3s"],
                         text=True, capture_output=True, check=False, timeout=60)
    assert bad.returncode == 2 and "give --mtbf too" in bad.stderr
