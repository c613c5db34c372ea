"""The target kinds' registry: each kind is one class every room asks (pack's members, the Loader's
batches, verify's check, the empty val batch, the task train picks); a kind from outside the package
runs through the Loader and `stoker train`."""

import contextlib
import io
import json

import numpy as np
import pytest
import torch

from stoker.pipeline import Loader
from stoker.pipeline.shards import kinds
from stoker.pipeline.shards.kinds import TargetKind, get_kind, kind_names, register_kind
from stoker.pipeline.shards.kinds import base as kinds_base
from stoker.pipeline.shards.manifest import Manifest
from stoker.pipeline.shards.stats import StatsAccumulator
from stoker.pipeline.shards.targets import Target
from stoker.pipeline.shards.writer import ShardWriter
from stoker.tools.common.synth import CLASSES, draw, encode


class ScoreKind(TargetKind):
    """A kind of the user's: one score a sample, stored as JSON (``{"score": 3.5}``), regressed."""

    name, member, task = "score", "score.json", "regress"

    def encode(self, value):
        return json.dumps({"score": float(value)}).encode()

    def meta(self, value, classes):
        return {"score": float(value)}

    def decode(self, raws, *, classes, where, split):
        out = np.empty(len(raws), np.float32)
        for k, raw in enumerate(raws):
            try:
                out[k] = json.loads(bytes(raw))["score"]
            except (ValueError, KeyError) as e:
                raise kinds.bad_target(where(k), f"score does not parse: {e}", split) from None
        return out

    def check(self, raw, *, num_classes, image_wh=None, names=None):
        try:
            json.loads(raw)["score"]
        except (ValueError, KeyError, TypeError) as e:
            return f"score does not parse: {e}"
        return None

    def describe(self):
        return "score (JSON)"

    def accumulator(self):
        return StatsAccumulator("float", 1)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(kinds_base, "_REGISTRY", kinds_base._REGISTRY.copy())  # undone after the test
    register_kind(ScoreKind)
    return ScoreKind


def _write(split, n, spec, target, value_of, seed=0):
    import random

    rng = random.Random(seed)
    split.mkdir(parents=True)
    with ShardWriter(split / "shard-000000.tar") as w:
        for i in range(n):
            image = encode(draw(CLASSES[i % 6], (rng.randint(40, 80), rng.randint(40, 80)), rng), quality=90)
            w.write(f"{i:09d}", {"jpg": image, target.member: target.encode(value_of(i))})
    Manifest(num_samples=n, classes=[], shards=[w.info], target=target).save(split)


def test_the_builtin_kinds_describe_themselves():
    assert kind_names()[:4] == ("class", "float", "multilabel", "mask")
    assert {k: get_kind(k).task for k in kind_names()[:4]} == {
        "class": "classify",
        "float": "regress",
        "multilabel": "multilabel",
        "mask": "segment",
    }
    assert [get_kind(k).spatial for k in ("class", "mask")] == [False, True]
    assert Target.of("mask").ignore_index == 255 and Target.of("float", columns=("y",)).member == "target.npy"
    with pytest.raises(ValueError, match="target kind 'polygons' is not one of"):
        Target(kind="polygons")
    with pytest.raises(ValueError, match="already registered"):
        register_kind(type("Again", (TargetKind,), {"name": "class", "member": "x"}))


def test_a_kind_from_outside_runs_through_the_loader_verify_and_train(registered, tmp_path):
    target = Target(kind="score", member="score.json", columns=("score",))
    value = lambda i: 20.0 + 3.0 * (i % 6)  # noqa: E731 - a score a pattern class determines
    _write(tmp_path / "data" / "train", 48, registered, target, value)
    _write(tmp_path / "data" / "val", 12, registered, target, value, seed=1)
    m = Manifest.load(tmp_path / "data" / "train")
    assert m.format == 2 and isinstance(m.target, ScoreKind) and m.target.describe() == "score (JSON)"
    with Loader(tmp_path / "data" / "train", batch_size=8, crop=32, backend="pil", threads=1, train=False) as ld:
        got = torch.cat([y for _, y in ld])
        assert got.dtype == torch.float32 and got.tolist() == [value(i) for i in range(48)]
        assert (
            ld.target_stats.count == 48 and abs(ld.target_stats.mean[0] - np.mean([value(i) for i in range(48)])) < 1e-4
        )
    from stoker.tools.cli import main as cli

    assert cli(["verify", str(tmp_path / "data" / "train")]) == 0
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli(
            ["train", str(tmp_path / "data"), "--out", str(tmp_path / "run"), "--epochs", "2", "--batch-size", "8"]
            + ["--crop", "32", "--no-progress", "--json", "--threads", "1"]
        )
    assert rc == 0, err.getvalue()
    summary = json.loads(out.getvalue())
    assert summary["task"] == "regress" and set(summary["val"]) >= {"mse", "r2"} and summary["val"]["n"] == 12
    assert "targets standardized (mean 27.5" in err.getvalue()
