"""The three extension points from outside the package, as a plugin package would add them: a
target kind, a pack source and a decode backend in a module of their own, found through its
entry points (no code of stoker's changed, nothing registered by hand), run through pack (with
the kind's statistics) -> verify -> index -> Loader -> train in fresh processes."""

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest

from stoker.tools.common.synth import CLASSES, draw, encode

PLUGIN = '''
"""A plugin of the user's: scores as JSON members, a JSON-lines source, a counting backend."""
import json
import os
from pathlib import Path

import numpy as np

from stoker.pipeline.backends import Backend
from stoker.pipeline.shards.kinds import TargetKind, bad_target
from stoker.pipeline.shards.stats import StatsAccumulator
from stoker.pipeline.shards.targets import Target
from stoker.tools.pack.sources.base import FileReader, Item, Scan


class ScoreKind(TargetKind):
    """One score a sample, stored as ``{"score": 3.5}``, regressed: its fields are a Target's, its
    methods say how it is packed, read, checked and counted (no stoker code names it)."""

    name, member, task = "score", "score.json", "regress"

    def encode(self, value):
        return json.dumps({"score": float(value[0])}).encode()

    def meta(self, value, classes):
        return {"score": float(value[0])}

    def decode(self, raws, *, classes, where, split):
        out = np.empty(len(raws), np.float32)
        for k, raw in enumerate(raws):
            try:
                out[k] = json.loads(bytes(raw))["score"]
            except (ValueError, KeyError) as e:
                raise bad_target(where(k), f"score does not parse: {e}", split) from None
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


class JsonlReader(FileReader):
    """A JSON-lines file of ``{"image": PATH, "score": X}`` rows, paths relative to its folder."""

    name, priority, summary = "scores-jsonl", 5, "JSON lines of image and score"

    @classmethod
    def recognizes(cls, src, options):
        return Path(src).suffix == ".jsonl"

    def __init__(self, src, options):
        super().__init__(src, options)
        self.base = Path(src).parent

    def scan(self):
        rows = [json.loads(line) for line in Path(self.src).read_text().splitlines() if line.strip()]
        items = [Item(r["image"], target=(float(r["score"]),)) for r in rows]
        target = Target(kind="score", member="score.json", columns=("score",))
        return Scan([], {"train": items}, target=target, val_source="no val split")


class CountingRunner:
    """Pillow's runner, writing one line a batch to $PLUGIN_LOG (proof that this backend ran)."""

    def __init__(self, settings):
        from stoker.pipeline.backends.pil import PilRunner

        self.inner = PilRunner(settings)

    def iterate(self, batches, epoch, seed):
        for batch in self.inner.iterate(batches, epoch, seed):
            with open(os.environ["PLUGIN_LOG"], "a") as f:
                f.write(f"{len(batch.images)}\\n")
            yield batch

    def close(self):
        self.inner.close()


class CountingBackend(Backend):
    name, where, priority, summary = "counting", ("cpu",), 90, "pillow, counted"

    def runner_class(self):
        return CountingRunner
'''

ENTRY_POINTS = """
[stoker.target_kinds]
score = stoker_scores:ScoreKind

[stoker.pack_sources]
scores-jsonl = stoker_scores:JsonlReader

[stoker.backends]
counting = stoker_scores:CountingBackend
"""

LOAD = """
import json, sys
from stoker.pipeline import Loader
with Loader(sys.argv[1], batch_size=8, crop=32, backend="counting", threads=1, train=False) as loader:
    scores = [float(v) for _, y in loader for v in y]
    print(json.dumps({"scores": scores, "stats": loader.target_stats.mean[0]}))
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """A folder on PYTHONPATH holding the plugin module and its installed metadata."""
    root = tmp_path_factory.mktemp("plugin")
    (root / "stoker_scores.py").write_text(PLUGIN)
    info = root / "stoker_scores-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stoker-scores\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(ENTRY_POINTS))
    return root


def _run(plugin, log, *argv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")]))
    env.update(PLUGIN_LOG=str(log), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow  # pack, the Loader and train, each a process of its own, with the plugin
def test_a_kind_a_source_and_a_backend_from_a_plugin_run_through_pack_the_loader_and_train(plugin, tmp_path):
    rng = random.Random(0)
    (tmp_path / "photos").mkdir()
    rows, score = [], {}
    for k in range(40):
        c = CLASSES[k % 6]
        (tmp_path / "photos" / f"{k}.jpg").write_bytes(encode(draw(c, (rng.randint(40, 70), 48), rng)))
        score[f"photos/{k}.jpg"] = 10.0 + 5.0 * (k % 6)  # a score the pattern determines
        rows.append(json.dumps({"image": f"photos/{k}.jpg", "score": score[f"photos/{k}.jpg"]}))
    (tmp_path / "scores.jsonl").write_text("\n".join(rows) + "\n")
    log, out = tmp_path / "batches.log", tmp_path / "out"

    p = _run(plugin, log, "-m", "stoker", "pack", tmp_path / "scores.jsonl", out, "--val-fraction", "0.2", "-q")
    assert p.returncode == 0, p.stderr
    assert "targets: score (JSON)" in p.stdout
    manifest = json.loads((out / "train" / "stoker.json").read_text())
    assert manifest["target"]["kind"] == "score" and manifest["target"]["stats"]["count"] == 32
    packed = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert abs(manifest["target"]["stats"]["mean"][0] - sum(r["score"] for r in packed) / 40) < 5.0

    p = _run(plugin, log, "-m", "stoker", "verify", out / "train")
    assert p.returncode == 0, p.stderr + p.stdout

    # the same tars as foreign shards, one score broken: `stoker index --targets score` checks each
    # by the kind, skips the broken one and keeps the kind's statistics; `stoker verify` agrees
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    tars = sorted((out / "train").glob("*.tar"))
    for t in tars:
        (foreign / t.name).write_bytes(t.read_bytes())
    _break_first_score(foreign / tars[0].name)
    p = _run(plugin, log, "-m", "stoker", "index", foreign, "--targets", "score", "--workers", "1", "-q")
    assert p.returncode == 0, p.stderr + p.stdout
    assert "1 sample(s) marked to skip (1 score does not parse)" in p.stdout and "targets: score (JSON)" in p.stdout
    indexed = json.loads((foreign / "stoker.json").read_text())
    assert indexed["target"]["kind"] == "score" and indexed["target"]["stats"]["count"] == 31
    kept = [m["score"] for m in _metas(out / "train")][1:]  # the first sample of the first tar is the broken one
    assert abs(indexed["target"]["stats"]["mean"][0] - sum(kept) / len(kept)) < 1e-4
    p = _run(plugin, log, "-m", "stoker", "verify", foreign, "--workers", "1", "-q")
    assert p.returncode == 0, p.stderr + p.stdout
    assert "31 images decoded" in p.stdout
    manifest_text = (foreign / "stoker.json").read_text()
    (foreign / "stoker.json").write_text(manifest_text.replace('"skip"', '"skip_was"'))  # nothing marked to skip
    p = _run(plugin, log, "-m", "stoker", "verify", foreign, "--workers", "1", "-q")
    assert p.returncode == 1 and "score does not parse" in p.stderr, p.stderr + p.stdout
    (foreign / "stoker.json").write_text(manifest_text)

    p = _run(plugin, log, "-c", LOAD, out / "train")
    assert p.returncode == 0, p.stderr
    loaded = json.loads(p.stdout)
    assert sorted(loaded["scores"]) == sorted(m["score"] for m in _metas(out / "train"))
    assert set(loaded["scores"]) <= set(score.values())
    assert abs(loaded["stats"] - manifest["target"]["stats"]["mean"][0]) < 1e-4
    assert sum(int(n) for n in log.read_text().split()) == 32  # every sample through the plugin's backend
    log.unlink()

    p = _run(plugin, log, "-m", "stoker", "train", out, "--out", tmp_path / "run", "--epochs", "2", "--batch-size", "8",
             "--crop", "32", "--backend", "counting", "--threads", "1", "--no-progress", "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["task"] == "regress" and summary["val"]["n"] == 8 and "r2" in summary["val"]
    assert "targets standardized" in p.stderr
    assert len(log.read_text().split()) >= 2 * 4  # the train batches (4 an epoch) came from the plugin


def _break_first_score(tar):
    """Overwrite the first ``score.json`` member of ``tar`` with bytes of its size that are no JSON."""
    import tarfile

    with tarfile.open(tar) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith(".score.json"))
    data = bytearray(tar.read_bytes())
    data[member.offset_data : member.offset_data + member.size] = b"x" * member.size
    tar.write_bytes(bytes(data))


def _metas(split):
    """The ``json`` members the packer wrote (each sample's score), read with webdataset."""
    import webdataset as wds

    tars = sorted(str(t) for t in split.glob("*.tar"))
    return [json.loads(s["json"]) for s in wds.WebDataset(tars, shardshuffle=False)]
