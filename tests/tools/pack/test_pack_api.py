"""pack(), merge_parts() and verify() from Python: the results say what is on disk, bad input is
one StokerError line, and a pack verifies."""

import json
from pathlib import Path

import pytest

from stoker.errors import CheckFailedError, InputsRejectedError, StokerError, UsageError
from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.common.synth import make_image_folder
from stoker.tools.pack import Images, PackResult, Ray, Shards, merge_parts, pack
from stoker.tools.verify.command import VerifyResult, verify

CLASSES = ("circles", "rings", "squares")
SMALL = {"shards": Shards(samples=4), "val_fraction": 0.25, "workers": 1}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """12 images in 3 classes plus the nasty files: 9 odd ones that pack, 4 broken ones, 2 not images."""
    root = make_image_folder(
        tmp_path_factory.mktemp("src") / "src", classes=CLASSES, per_class=4, min_side=32, max_side=80, nasty=True
    )
    (root / "circles" / "notes.txt").write_text("not an image")
    return root


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert text and "\n" not in text, text
    return text


def test_pack_result_matches_what_is_on_disk(src, tmp_path):
    out = tmp_path / "out"
    result = pack(src, out, **SMALL)
    assert isinstance(result, PackResult)
    assert result.out == str(out) and not result.up_to_date and (result.part, result.parts) == (0, 1)
    assert set(result.splits) == {"train", "val"} == set(result.run)
    for split, t in result.splits.items():
        m = Manifest.load(out / split)
        assert t["samples"] == m.num_samples == result.run[split]["packed"]
        assert t["shards"] == len(m.shards) == result.run[split]["shards"]
        assert t["bytes"] == sum(s.bytes for s in m.shards) == result.run[split]["bytes"]
        assert t["rejected"] == m.pack["rejected"] and t["skipped"] == m.pack["skipped"]
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert result.rejected == len(rejects) == 4
    assert result.packed == 12 + 9 and result.inputs == result.packed + result.rejected
    assert result.to_dict() == json.loads(json.dumps(result.to_dict()))  # the --json shape
    assert f"4 rejected inputs listed in {out}/rejects.jsonl" in result.summary()
    assert result.notes() == []


def test_rerun_is_up_to_date_with_the_same_totals(src, tmp_path):
    first = pack(src, tmp_path / "out", **SMALL)
    again = pack(src, tmp_path / "out", **SMALL)
    assert again.up_to_date and again.splits == first.splits
    assert all(r["packed"] == r["rejected"] == r["shards"] == 0 for r in again.run.values())
    assert again.summary() == f"{tmp_path / 'out'} is up to date ({first.inputs:,} inputs, nothing to do)"


def test_pack_then_verify_round_trips(src, tmp_path):
    packed = pack(src, tmp_path / "out", **SMALL)
    result = verify(tmp_path / "out", workers=1)
    assert isinstance(result, VerifyResult) and result.ok and result.problems == [] and result.failure() == ""
    assert len(result.shards) == sum(t["shards"] for t in packed.splits.values())
    assert sum(r.samples for r in result.shards) == sum(r.decoded for r in result.shards) == packed.packed
    assert all(r.sha_ok and r.idx_ok for r in result.shards)
    n = packed.packed
    assert result.summary() == f"ok: {len(result.shards)} shards, {n} samples, {n} images decoded"
    assert verify(tmp_path / "out" / "val", sample=1, workers=1).to_dict()["ok"] is True


def test_verify_reports_a_flipped_byte_without_raising(src, tmp_path):
    pack(src, tmp_path / "out", **SMALL)
    tar = tmp_path / "out" / "train" / "train-000001.tar"
    data = bytearray(tar.read_bytes())
    data[len(data) // 2] ^= 0x01
    tar.write_bytes(bytes(data))
    result = verify(tmp_path / "out", workers=1)
    assert not result.ok
    bad = [r for r in result.shards if r.problems]
    assert [(r.split, r.name, r.sha_ok) for r in bad] == [("train", "train-000001.tar", False)]
    assert result.failure().startswith(
        f"{len(result.problems)} problem(s) in 1 shard(s); first: train/train-000001.tar: sha256 differs"
    )


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"images": Images(quality=0)}, "quality must be in 1..100"),
        ({"workers": 0}, "workers must be >= 1, got 0"),
        ({"val_fraction": 1.0}, "val_fraction must be in [0, 1), got 1.0"),
        ({"shards": Shards(size=0)}, "Shards.size must be positive"),
        ({"shards": Shards(samples=-1)}, "Shards.samples must be >= 0"),
        ({"part": (2, 2)}, "part=(2, 2): should be (i, n) with 0 <= i < n"),
        ({"part": 2}, "part must be (i, n), two ints, or None, got 2"),
        ({"engine": "spark"}, "engine must be local or ray"),
        ({"engine": 3}, "engine must be local, ray or stoker.Ray(...), got int"),
        ({"engine": Ray}, "engine must be local, ray or stoker.Ray(...), got type"),
        ({"images": {"short_side": 1}}, "images must be stoker.Images(...) or None, got dict"),
        ({"shards": Images()}, "shards must be stoker.Shards(...) or None, got Images"),
        ({"reading": "coco"}, "reading must be stoker.Reading(...) or None, got str"),
        ({"masks": 3}, "masks must be a path, stoker.Masks(...) or None, got int"),
        ({"storage_options": {"anon": True}}, "staging and storage_options are for a URL out"),
    ],
)
def test_bad_setting_is_one_usage_error_line_and_writes_nothing(src, tmp_path, kw, words):
    with pytest.raises(UsageError) as e:
        pack(src, tmp_path / "out", **kw)
    assert words in one_line(e) and e.value.exit_code == 2
    assert not (tmp_path / "out").exists()


def test_bad_paths_are_one_usage_error_line(src, tmp_path):
    with pytest.raises(UsageError) as e:
        pack(tmp_path / "nope", tmp_path / "out")
    assert one_line(e) == f"SRC {tmp_path / 'nope'} does not exist"
    with pytest.raises(UsageError) as e:
        pack(src, src / "shards")
    assert one_line(e) == f"OUT {src / 'shards'} is inside SRC {src}; put it elsewhere"
    with pytest.raises(UsageError) as e:
        verify(tmp_path)
    assert "no stoker.json in" in one_line(e)
    with pytest.raises(UsageError) as e:
        verify(tmp_path, sample=-1)
    assert one_line(e) == "sample must be >= 0 and workers >= 1"


def test_strict_raises_after_the_pack_is_finished(src, tmp_path):
    with pytest.raises(InputsRejectedError) as e:
        pack(src, tmp_path / "out", strict=True, **SMALL)
    assert isinstance(e.value, CheckFailedError) and isinstance(e.value, StokerError) and e.value.exit_code == 1
    assert one_line(e) == "4 input(s) rejected (strict); see rejects.jsonl"
    assert e.value.result.rejected == 4 and Manifest.load(tmp_path / "out" / "train").num_samples > 0


def test_parts_then_merge_parts_equal_a_plain_pack(src, tmp_path):
    plain = pack(src, tmp_path / "plain", **SMALL)
    first = pack(src, tmp_path / "parts", part=(0, 2), **SMALL)
    assert first.splits == {} and (first.part, first.parts) == (0, 2) and first.run["train"]["packed"] > 0
    with pytest.raises(UsageError) as e:
        merge_parts(tmp_path / "parts")
    assert "parts not finished: 1/2" in one_line(e)
    pack(src, tmp_path / "parts", part=(1, 2), **SMALL)
    merged = merge_parts(tmp_path / "parts")
    assert merged.run == {} and merged.inputs == plain.inputs
    assert {s: (t["samples"], t["rejected"]) for s, t in merged.splits.items()} == {
        s: (t["samples"], t["rejected"]) for s, t in plain.splits.items()
    }
