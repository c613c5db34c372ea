"""``stoker verify``'s image check (tools/verify/imagecheck.py): a damaged image is a finding, a
bug in the check (or an API change under it) raises with its traceback, for pillow and for DALI."""

import random

import pytest
from PIL import ImageFile

from stoker.tools.common.synth import draw, encode, make_image_folder
from stoker.tools.pack import Shards, pack
from stoker.tools.verify.command import verify
from stoker.tools.verify.imagecheck import ImageChecker, decode_check


def _bug(*args, **kwargs):
    raise TypeError("a bug, not a damaged image")


def test_pillow_damage_is_a_finding_and_a_bug_raises_through_verify(tmp_path, monkeypatch):
    good = encode(draw("circles", (64, 48), random.Random(0)))
    assert decode_check(good) is None
    assert decode_check(good[: len(good) // 2]).startswith("does not decode with pillow: ")
    src = make_image_folder(tmp_path / "src", classes=("circles", "rings"), per_class=2, min_side=32, max_side=48)
    pack(src, tmp_path / "out", workers=1, shards=Shards(samples=2))
    assert verify(tmp_path / "out", workers=1).to_dict()["ok"] is True

    monkeypatch.setattr(ImageFile.ImageFile, "load", _bug)
    with pytest.raises(TypeError, match="a bug"):
        decode_check(good)
    with pytest.raises(TypeError, match="a bug"):  # not "does not decode" for every image
        verify(tmp_path / "out", workers=1)


def test_dali_damage_is_a_finding_and_a_bug_raises(monkeypatch):
    checker = ImageChecker(dali=True)
    runs = []

    def run(datas):  # DALI's pipeline: a RuntimeError for a batch holding a bad image
        runs.append(len(datas))
        if b"bad" in datas:
            raise RuntimeError("Critical error in pipeline:\nError in thread 0: bad JPEG\n")

    monkeypatch.setattr(checker, "_run", run)
    assert checker._dali_check([b"ok", b"bad", b"ok"]) == [
        None,
        "does not decode with DALI: Error in thread 0: bad JPEG",
        None,
    ]
    assert runs == [3, 1, 1, 1]  # the batch, then one by one
    monkeypatch.setattr(checker, "_run", _bug)
    with pytest.raises(TypeError, match="a bug"):
        checker._dali_check([b"ok"])

    def unfinished(datas):
        raise NotImplementedError("a RuntimeError by class, a bug by meaning")

    monkeypatch.setattr(checker, "_run", unfinished)
    with pytest.raises(NotImplementedError):
        checker._dali_check([b"ok"])


def test_a_failed_dali_run_drops_its_pipeline():
    class Pipe:
        def run(self):
            raise RuntimeError("Critical error in pipeline")

    checker = ImageChecker(dali=True)
    checker._pipe = Pipe()
    with pytest.raises(RuntimeError, match="Critical error"):
        checker._run([b"\xff\xd8\xff"])
    assert checker._pipe is None  # unusable after an error: rebuilt on the next run
