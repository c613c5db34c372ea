"""The combination matrix (issue 48): every target kind x every backend that runs here x every
order x 1 and 3 ranks x a mid-epoch resume, on splits whose pixels carry their targets
(:mod:`marked_splits`). For each supported cell: each epoch's multiset is exact, every rank takes
the same steps, each decoded row's target is the one its pixels carry (after its crop, flip and
resize) and its sample is the one the order planned, and a resume mid-epoch is bit-exact. A cell
that is not supported is a one-line refusal, asserted. docs/loader.md shows :data:`CELLS` as a
table (:func:`matrix_table`; a test checks the page against it)."""

from __future__ import annotations

import collections
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from marked_splits import KINDS, check_batch, write_marked

from stoker.errors import ArgumentError
from stoker.pipeline import Loader
from stoker.pipeline.balance_tables import class_members
from stoker.pipeline.deps import HAS_DALI

BACKENDS = ("pil", "dali", "pixels")
ORDERS = ("plain", "block", "mix", "balance", "buckets", "mix+buckets")
BATCH, LENGTH = 4, 24  # a mix's and a balance's epoch: whole global batches on 1 and on 3 ranks
#: aspect-ratio buckets (height, width) at crop 32, and their batch: the splits' sizes fill a few steps
SHAPES, BUCKET_BATCH = [(24, 40), (32, 32), (40, 24)], 2
SIZES = (24, 15)  # the mix's two splits (the first is the plain one)

#: what a cell that is not supported says (a regular expression of its one line)
REFUSED = {
    ("float", "balance"): r"balance='classes' balances a split of class or multilabel targets; .* is a float split",
    ("mask", "balance"): r"balance='classes' balances a split of class or multilabel targets; .* is a mask split",
    ("boxes", "balance"): r"balance='classes' balances a split of class or multilabel targets; .* is a boxes split",
}


def refusal(kind: str, backend: str, order: str) -> str | None:
    return REFUSED.get((kind, order)) or REFUSED.get((kind, backend, order))


#: every cell: (kind, backend, order, the refusal it gets or None)
CELLS = [(k, b, o, refusal(k, b, o)) for k in KINDS for b in BACKENDS for o in ORDERS]


def matrix_table() -> str:
    """The matrix as docs/loader.md shows it: a row per kind and backend, a column per order."""
    head = "| kind | backend | " + " | ".join(ORDERS) + " |"
    rows = [head, "|" + "---|" * (2 + len(ORDERS))]
    for k in KINDS:
        for b in BACKENDS:
            marks = ["refused" if refusal(k, b, o) else "✔" for o in ORDERS]
            rows.append(f"| {k} | {b} | " + " | ".join(marks) + " |")
    return "\n".join(rows)


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> Path:
    """Per kind, two marked splits of different sizes (samples 0.. and 1000..); shared by every cell."""
    root = tmp_path_factory.mktemp("matrix")
    for kind in KINDS:
        write_marked(root / kind / "a", kind, n=SIZES[0], per_shard=6)
        write_marked(root / kind / "b", kind, n=SIZES[1], per_shard=5, first_uid=1000)
    return root


def _kw(packs: Path, kind: str, backend: str, order: str, tmp: Path) -> tuple:
    a, b = packs / kind / "a", packs / kind / "b"
    kw = {"batch_size": BATCH, "crop": 32, "train": True, "seed": 5, "prefetch": 1}
    kw.update(
        {"pil": {"backend": "pil", "threads": 0}, "dali": {"backend": "dali", "threads": 1}}.get(
            backend, {"backend": "pil", "threads": 0, "pixel_cache": tmp / "pixels"}
        )
    )
    if order == "block":
        kw.update(shuffle="block", block_shards=2)
    if "buckets" in order:
        kw.update(buckets=SHAPES, batch_size=BUCKET_BATCH)
    if order == "mix+buckets":
        return [a, b], {**kw, "weights": [0.6, 0.4], "epoch_length": LENGTH}
    if order == "mix":
        return [a, b], {**kw, "weights": [0.6, 0.4], "epoch_length": LENGTH}
    if order == "balance":
        return a, {**kw, "balance": "classes", "epoch_length": LENGTH}
    return a, kw


def _same(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return torch.equal(x, y)
    return all(torch.equal(getattr(x, f), getattr(y, f)) for f in ("boxes", "labels", "counts", "crowd"))


def _check_multiset(loaders: list, order: str) -> None:
    """Every rank the same steps; the ranks' union, the epoch's exact multiset (bucketed: what the
    buckets hand out of it, all but fewer than a batch in each bucket)."""
    steps = {len(ld) for ld in loaders}
    assert len(steps) == 1
    world = len(loaders)
    batch = loaders[0].batch_size
    got = [np.concatenate(list(ld.epoch_batches())) for ld in loaders]
    assert {len(g) for g in got} == {steps.pop() * batch}
    drawn = np.concatenate(got)
    index = loaders[0].index
    if "buckets" in order:
        waiting = loaders[0].order.waiting()
        assert 0 < len(drawn) and waiting < len(SHAPES) * batch * world + batch * world
        if order == "buckets":  # a permutation's: each sample at most once
            assert len(set(drawn.tolist())) == len(drawn) == len(index) - waiting
        else:  # a mix's draws: each split at most its quota, each sample at most its cycles
            mix = loaders[0].mix
            assert all(n <= q for n, q in zip(np.bincount(mix.split_of(drawn), minlength=2), mix.quotas, strict=True))
            for s, size in enumerate(SIZES):
                counts = np.bincount(drawn[mix.split_of(drawn) == s], minlength=sum(SIZES))
                assert counts.max() <= -(-mix.quotas[s] // size)
    elif order in ("plain", "block"):  # a permutation's: each sample at most once, drop_last of whole batches
        assert len(set(drawn.tolist())) == len(drawn) == len(index) // (BATCH * world) * BATCH * world
    elif order == "mix":
        mix = loaders[0].mix
        assert np.bincount(mix.split_of(drawn)).tolist() == mix.quotas == [round(LENGTH * 0.6), round(LENGTH * 0.4)]
        for s, size in enumerate(SIZES):  # each split drawn without replacement, cycle after cycle
            counts = np.bincount(drawn[mix.split_of(drawn) == s], minlength=sum(SIZES))
            q = mix.quotas[s]
            assert set(counts[counts > 0].tolist()) <= {q // size, -(-q // size)}
    else:  # balance: each group of the split (class, or rarest label) exactly its quota
        starts, members = class_members(index)
        group = np.empty(len(index), np.int64)
        for c in range(len(starts) - 1):
            group[np.asarray(members[starts[c] : starts[c + 1]], np.int64)] = c
        plan = loaders[0].order.plan
        want = {int(c): int(q) for c, q in zip(plan.slot_class, plan.slot_quota, strict=True) if q}
        assert dict(collections.Counter(group[drawn].tolist())) == want


@pytest.mark.parametrize(("kind", "backend", "order", "refused"), CELLS, ids=["-".join(c[:3]) for c in CELLS])
def test_cell(packs, tmp_path, kind, backend, order, refused):
    if backend == "dali" and not HAS_DALI:
        pytest.skip("DALI is not installed")
    path, kw = _kw(packs, kind, backend, order, tmp_path)
    if refused:
        with pytest.raises(ArgumentError, match=refused) as got:
            Loader(path, **kw)
        assert "\n" not in str(got.value)
        return
    for world in (1, 3):
        _check_multiset([Loader(path, rank=r, world_size=world, **kw) for r in range(world)], order)
    # rank 1 of 3: its epoch decoded; each row's pixels carry its target and are the sample planned
    loader = Loader(path, rank=1, world_size=3, **kw)
    planned = [[int(loader.index.key(int(p))) for p in b] for b in loader.epoch_batches()]
    full, state = [], None
    for x, y in loader:
        assert check_batch(kind, x, y).tolist() == planned[len(full)]
        full.append((x, y))
        if len(full) == 1:
            state = loader.state_dict()
    assert len(full) == len(planned) >= 2
    # a resume mid-epoch, in a new Loader: the rest of the epoch, bit for bit
    again = Loader(path, rank=1, world_size=3, **kw)
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == len(full) - 1
    for (x, y), (rx, ry) in zip(full[1:], rest, strict=True):
        assert torch.equal(x, rx) and _same(y, ry)
    loader.close(), again.close()


def test_the_docs_show_the_matrix_of_this_test():
    page = (Path(__file__).parents[2] / "docs" / "loader.md").read_text()
    shown = re.search(r"<!-- matrix -->\n(.*?)\n<!-- /matrix -->", page, re.S)
    assert shown is not None and shown.group(1).strip() == matrix_table()
