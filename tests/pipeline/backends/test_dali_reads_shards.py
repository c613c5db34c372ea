"""The shard contract from the read side: DALI's own webdataset reader, given our
.idx files, yields exactly the bytes and labels webdataset reads, and DALI decodes
every image the packer wrote (including the re-encoded odd inputs)."""

import json

import numpy as np
import pytest

from stoker.pipeline.deps import HAS_DALI
from stoker.pipeline.shards.manifest import Manifest, idx_path
from stoker.tools.cli import main as cli
from stoker.tools.common.synth import make_image_folder

pytestmark = pytest.mark.skipif(not HAS_DALI, reason="needs nvidia-dali")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dali")
    src = make_image_folder(
        tmp / "src", classes=("circles", "rings", "squares"), per_class=4, min_side=32, max_side=96, nasty=True
    )
    assert (
        cli(
            [
                "pack",
                str(src),
                str(tmp / "out"),
                "-q",
                "--workers",
                "1",
                "--samples-per-shard",
                "6",
                "--short-side",
                "64",
            ]
        )
        == 0
    )
    return tmp / "out" / "train"


def dali_samples(split_dir, decode: bool):
    from nvidia.dali import fn, pipeline_def, types

    m = Manifest.load(split_dir)
    tars = [str(split_dir / s.name) for s in m.shards]

    @pipeline_def(batch_size=m.num_samples, num_threads=1, device_id=None)
    def pipe():
        jpg, cls, meta = fn.readers.webdataset(
            paths=tars,
            index_paths=[str(idx_path(t)) for t in tars],
            ext=["jpg", "cls", "json"],
            missing_component_behavior="error",
            random_shuffle=False,
            name="reader",
        )
        if decode:
            jpg = fn.decoders.image(jpg, device="cpu", output_type=types.RGB)
        return jpg, cls, meta

    p = pipe()
    p.build()
    jpg, cls, meta = p.run()
    return (
        [np.array(jpg[i]) for i in range(m.num_samples)],
        [bytes(np.array(cls[i])) for i in range(len(cls))],
        [json.loads(bytes(np.array(meta[i]))) for i in range(len(meta))],
    )


def test_dali_reader_with_our_idx_gives_webdataset_bytes_and_labels(packed):
    import webdataset as wds

    m = Manifest.load(packed)
    ref = list(wds.WebDataset([str(packed / s.name) for s in m.shards], shardshuffle=False, empty_check=False))
    jpgs, labels, metas = dali_samples(packed, decode=False)
    assert len(jpgs) == len(ref) == m.num_samples == 21
    for a, b, c, r in zip(jpgs, labels, metas, ref, strict=True):
        assert a.tobytes() == r["jpg"]
        assert b == r["cls"]
        assert c == json.loads(r["json"])


def test_dali_decodes_every_packed_image_with_the_json_size(packed):
    images, labels, metas = dali_samples(packed, decode=True)
    for im, lab, meta in zip(images, labels, metas, strict=True):
        assert im.ndim == 3 and im.shape[2] == 3 and im.dtype == np.uint8
        h, w = im.shape[:2]
        assert min(h, w) == min(64, meta["width"], meta["height"])  # resized down to the short side, never up
        assert (w >= h) == (meta["width"] >= meta["height"])  # EXIF-rotated input came out upright
        assert int(lab) < 3
