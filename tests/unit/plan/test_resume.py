"""Resuming at another scale (mlckpt/workload/resume.py): every new rank's state is tiled by byte
ranges of the old files, each range holds exactly the elements it is placed as, and the ranges it
reads are whole pages that cover them."""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt.errors import ConfigError
from mlckpt.resources import workloads_dir
from mlckpt.workload.layout import PAGE, make_plan
from mlckpt.workload.model import DTYPE_BYTES, ModelShape, Parallelism, Workload, workload_from_config
from mlckpt.workload.resume import (
    Index,
    ResumePlan,
    checkpoint_index,
    held_to_whole_pieces,
    resume_plan,
    stored_pieces,
)
from mlckpt.workload.tensors import rank_tensors


@cache
def workload(name: str) -> Workload:
    path = Path(workloads_dir()) / "workload" / f"{name}.yaml"
    return workload_from_config(yaml.safe_load(path.read_text(encoding="utf-8")))


def element_source(index: Index, name: str, element: int, copy: int) -> tuple[int, int, int]:
    """Where ``element`` of global tensor ``name`` is stored: (writer, file index, byte offset)."""
    g = index.by_name[name]
    for s in g.copies[copy]:
        if s.start <= element < s.start + s.numel:
            return s.writer, s.index, s.offset + (element - s.start) * DTYPE_BYTES[g.dtype]
    raise AssertionError(f"{name}: element {element} not stored")


def assert_sound(plan: ResumePlan) -> None:
    """Needs tile each state; each tensor's first and last elements come from where the index stores
    the elements its place says; reads are whole pages inside their files and cover every need."""
    index = plan.index
    sizes = index.file_bytes
    for rr in plan.rank_resumes:
        needs = sorted(rr.needs, key=lambda n: n.dest)
        at = 0
        for n in needs:
            assert n.dest == at and n.length > 0
            assert 0 <= n.offset and n.offset + n.length <= sizes[(n.writer, n.index)]
            at += n.length
        assert at == rr.bytes
        offset = 0
        for t in rr.tensors:
            assert t.offset == offset
            offset += t.nbytes
            g = index.by_name[t.name]
            size = DTYPE_BYTES[g.dtype]
            copy = rr.tp % len(g.copies)
            first = next(n for n in needs if n.dest <= t.offset < n.dest + n.length)
            last = next(n for n in needs if n.dest <= t.offset + t.nbytes - size < n.dest + n.length)
            # the tensor's first element is the global element its range starts at
            start = _first_element(plan, rr, t.name)
            assert (first.writer, first.index, first.offset + t.offset - first.dest) == \
                element_source(index, t.name, start, copy)
            end = start + t.nbytes // size - 1
            assert (last.writer, last.index, last.offset + t.offset + t.nbytes - size - last.dest) == \
                element_source(index, t.name, end, copy)
        reads = rr.reads(sizes)
        for rd in reads:
            assert rd.offset % PAGE == 0 and rd.offset + rd.length <= sizes[(rd.writer, rd.index)]
            assert rd.length % PAGE == 0 or rd.offset + rd.length == sizes[(rd.writer, rd.index)]
        for n in rr.needs:
            assert any(rd.writer == n.writer and rd.index == n.index and rd.offset <= n.offset
                       and n.offset + n.length <= rd.offset + rd.length for rd in reads)
        by_file = defaultdict(list)
        for rd in reads:
            by_file[(rd.writer, rd.index)].append((rd.offset, rd.offset + rd.length))
        for spans in by_file.values():
            spans.sort()
            assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))  # merged, disjoint


def _first_element(plan: ResumePlan, rr: object, name: str) -> int:
    """The global element a rank's shard of ``name`` starts at, recomputed from first principles:
    TP's near-equal parts of whole rows, then DP's near-equal parts of those elements."""
    from mlckpt.workload.serving import part

    g = plan.index.by_name[name]
    tp, dp = rr.tp, rr.dp  # type: ignore[attr-defined]
    a = 0
    n = g.numel
    if g.tp_split:
        rows = g.numel // g.cols
        a = sum(part(rows, plan.tp, i) for i in range(tp)) * g.cols
        n = part(rows, plan.tp, tp) * g.cols
    if (plan.index.zero > 0) if g.optimizer else (plan.index.zero >= 3):
        a += sum(part(n, plan.dp, i) for i in range(dp))
    return a


def stored_tensor_bytes(plan_ranks: int, w: Workload, scale: float) -> int:
    plan = make_plan(w, plan_ranks, scale)
    return sum(t.nbytes for rp in plan.rank_plans for ts, f in zip(rank_tensors(plan, rp.rank), rp.files,
                                                                   strict=True)
               for t in ts if t.name != f"{f.name}.rest")


@pytest.mark.parametrize("ranks", [4, 8, 16])
def test_llama3_8b_written_at_8_resumes_at_other_data_parallelism(ranks: int) -> None:
    w = workload("llama3_8b")  # TP 1, PP 1, ZeRO 3: every tensor sharded over DP
    index = checkpoint_index(make_plan(w, 8, 0.01))
    plan = resume_plan(index, w, ranks, 1, 1)
    assert_sound(plan)
    # sharded over DP: the new ranks hold every stored tensor byte once, no more
    assert plan.state_bytes == index.tensor_bytes == stored_tensor_bytes(8, w, 0.01)
    held = [rr.bytes for rr in plan.rank_resumes]  # near-equal: at most an element a tensor apart
    assert max(held) - min(held) <= 4 * len(index.tensors)
    touched = {(n.writer, n.index) for n in plan.rank_resumes[0].needs}
    assert len({wr for wr, _ in touched}) == (2 if ranks == 4 else 1)  # 4: two old ranks' shards each


def test_the_same_layout_reads_its_own_files() -> None:
    w = workload("llama3_8b")
    old = make_plan(w, 8, 0.01)
    plan = resume_plan(checkpoint_index(old), w, 8, 1, 1)
    for rr in plan.rank_resumes:
        assert {(n.writer, n.index) for n in rr.needs} == {(rr.rank, 0), (rr.rank, 1)}
        reads = rr.reads(plan.index.file_bytes)
        assert [(rd.writer, rd.index, rd.offset) for rd in reads] == [(rr.rank, 0, 0), (rr.rank, 1, 0)]


def test_tensor_parallelism_changed_reads_the_old_shards_rows() -> None:
    w = dataclasses.replace(workload("llama3_8b"), parallelism=Parallelism(2, 1, 1))
    index = checkpoint_index(make_plan(w, 8, 0.01))  # ZeRO 1: model states on the dp == 0 ranks
    plan = resume_plan(index, w, 8, 4, 1)
    assert_sound(plan)
    rr = plan.rank_resumes[1]  # new TP rank 1 of 4: the second half of old TP rank 0's rows
    q = next(t for t in rr.tensors if t.name == "model.layers.0.self_attn.qkv_proj.weight")
    g = index.by_name[q.name]
    assert g.cols == 4096 and q.shape == (g.numel // 4096 // 4, 4096)
    src = {n.writer for n in rr.needs if n.dest == q.offset}
    assert src == {0}
    norm = next(t for t in rr.tensors if t.name == "model.layers.0.input_layernorm.weight")
    # the norms are whole on every TP rank (resized with the file, as the index stores them), read
    # from old TP rank 1 % 2
    assert norm.shape == (index.by_name[norm.name].numel,)
    assert {n.writer for n in rr.needs if n.dest == norm.offset} == {1}


def test_index_round_trips_and_refuses_an_unknown_format() -> None:
    index = checkpoint_index(make_plan(workload("llama3_8b"), 2, 0.001))
    assert Index.from_json(index.to_json()) == index
    with pytest.raises(ConfigError, match="format"):
        Index.from_json(index.to_json().replace(b'"resume_index_format":1', b'"resume_index_format":99'))


def test_a_file_too_small_for_its_tensors_cannot_be_resumed() -> None:
    m = ModelShape(hidden_size=64, num_layers=400, ffn_hidden_size=128, vocab_size=512, num_attention_heads=4,
                   num_kv_heads=4)
    with pytest.raises(ConfigError, match="scale"):
        checkpoint_index(make_plan(Workload("tiny", m, Parallelism(1, 1, 3), 2), 2, 0.0001))


def test_a_new_layout_that_cannot_be_is_refused() -> None:
    w = workload("llama3_8b")
    index = checkpoint_index(make_plan(w, 8, 0.01))
    with pytest.raises(ConfigError, match="multiple"):
        resume_plan(index, w, 6, 4, 1)
    with pytest.raises(ConfigError, match="ZeRO 3"):
        resume_plan(index, w, 8, 1, 2)


@settings(max_examples=40, deadline=None)
@given(h=st.sampled_from([64, 256]), layers=st.integers(1, 6), ffn=st.sampled_from([96, 256]),
       vocab=st.sampled_from([100, 512]), tp=st.sampled_from([1, 2]), pp=st.integers(1, 3),
       zero=st.sampled_from([0, 1, 2, 3]), dp=st.integers(1, 3), new_tp=st.sampled_from([1, 2, 4]),
       new_pp=st.integers(1, 3), new_dp=st.integers(1, 4), scale=st.sampled_from([1.0, 0.5]))
def test_any_resume_is_sound(h: int, layers: int, ffn: int, vocab: int, tp: int, pp: int, zero: int, dp: int,
                             new_tp: int, new_pp: int, new_dp: int, scale: float) -> None:
    if max(pp, new_pp) > layers or (zero == 3 and max(pp, new_pp) > 1):
        return  # LAYERS-PIPELINE, ZERO3-PIPELINE refuse these
    m = ModelShape(hidden_size=h, num_layers=layers, ffn_hidden_size=ffn, vocab_size=vocab,
                   num_attention_heads=4, num_kv_heads=4)
    w = Workload("w", m, Parallelism(tp, pp, zero), tp * pp * dp)
    try:
        index = checkpoint_index(make_plan(w, tp * pp * dp, scale))
    except ConfigError:
        return  # a file too small for one row of each tensor
    plan = resume_plan(index, w, new_tp * new_pp * new_dp, new_tp, new_pp)
    assert_sound(plan)
    if zero == 3 and new_tp == 1:  # sharded over DP, no tensor TP replicates held twice
        assert plan.state_bytes == index.tensor_bytes


def test_a_reader_of_whole_pieces_reads_each_piece_its_shard_overlaps_once() -> None:
    """DCP's load (rules 1.22): one read item a stored piece a new shard overlaps, the piece read
    whole; TP 1 -> 2 makes both new TP ranks read the whole old rows of every weight."""
    w = dataclasses.replace(workload("llama3_8b"), parallelism=Parallelism(2, 1, 1))
    old = dataclasses.replace(w, parallelism=Parallelism(1, 1, 1))
    index = checkpoint_index(make_plan(old, 8, 0.01))
    plan = resume_plan(index, w, 4, 2, 1, spread=False)
    for rr in plan.rank_resumes:
        pieces = stored_pieces(index, rr)
        assert len(pieces) == len(rr.needs)  # one overlap a piece
        assert len(set(pieces)) == len(pieces)
        assert sum(p[3] for p in pieces) >= rr.bytes  # whole pieces: at least what the shard holds
    q = "model.layers.0.self_attn.qkv_proj.weight"
    by_rank = [{p for p in stored_pieces(index, rr) if p[0] == q} for rr in plan.rank_resumes]
    assert by_rank[0] == by_rank[1] == {(q, 0, 0, index.by_name[q].numel * 2)}  # old rank 0's whole rows


def test_records_of_whole_pieces_are_held_to_that_plan() -> None:
    w = workload("llama3_8b")
    index = checkpoint_index(make_plan(w, 8, 0.01))
    plan = resume_plan(index, w, 4, 1, 1, spread=False)
    overhead = 8192

    def honest() -> list[dict[str, object]]:
        out = []
        for rr in plan.rank_resumes:
            pieces = stored_pieces(index, rr)
            out.append({"rank": rr.rank, "bytes": rr.bytes, "needs": len(rr.needs), "reads": len(pieces),
                        "tensors": len(rr.tensors), "files": len({p[2] for p in pieces}),
                        "read_bytes": sum(p[3] for p in pieces) + 1500 * len(pieces), "index_bytes": 4321,
                        "verified_bytes": rr.bytes})
        return out

    assert held_to_whole_pieces(plan, honest(), overhead) == []
    for key, value, says in [("read_bytes", 1, "rank 2: read_bytes 1, its "),
                             ("read_bytes", 10**12, "rank 2: read_bytes 1000000000000"),
                             ("files", 3, "rank 2: files 3, the plans give 2"),
                             ("index_bytes", 1234, "index_bytes ['1234', '4321']"),
                             ("verified_bytes", 7, "rank 2: verified_bytes 7")]:
        recs = honest()
        recs[2][key] = value
        assert any(p.startswith(says) for p in held_to_whole_pieces(plan, recs, overhead)), (key, says)
    assert held_to_whole_pieces(plan, honest()[1:], overhead)[0].startswith("ranks [1, 2, 3]")
