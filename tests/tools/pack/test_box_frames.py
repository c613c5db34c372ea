"""Boxes land on their object in the stored pixels whatever the EXIF orientation (1-8) and
whichever frame the annotation was drawn in (the file's raw pixels, as torchvision's
``CocoDetection`` and pycocotools read it, or the upright image a labelling tool shows): the
annotation's own width and height say which. A size that fits neither frame is a reject with the
reason, never a silent rescale."""

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.pack import Reading, pack

UPRIGHT = (80, 48)  # width, height of the upright picture: not square, so a quarter turn shows in the size
OBJECT = (10, 6, 34, 20)  # x0 y0 x1 y1 of the red object in the upright picture
# the transpose that undoes each orientation's (what was applied to the upright picture to store it raw)
_INVERSE = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def _raw(im: Image.Image, orientation: int) -> Image.Image:
    t = _INVERSE[orientation]
    return im if t is None else im.transpose(t)


def _bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    ys, xs = np.nonzero(mask)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def write_photo(folder: Path, name: str, orientation: int, frame: str, size: tuple | None = None) -> dict:
    """A JPEG whose upright picture has a red object at OBJECT, stored raw with EXIF
    ``orientation``; returns its COCO image and annotation, in ``frame``'s pixels."""
    upright = Image.new("RGB", UPRIGHT, (128, 128, 128))
    upright.paste((220, 20, 20), OBJECT)
    raw = _raw(upright, orientation)
    exif = Image.Exif()
    exif[0x0112] = orientation
    raw.save(folder / name, quality=95, exif=exif)
    if frame == "upright":
        (w, h), (x0, y0, x1, y1) = UPRIGHT, OBJECT
    else:  # where the object is in the file's own pixels
        mask = Image.new("L", UPRIGHT, 0)
        mask.paste(255, OBJECT)
        (w, h), (x0, y0, x1, y1) = raw.size, _bbox(np.asarray(_raw(mask, orientation)) > 127)
    w, h = size or (w, h)
    return {"file_name": name, "width": w, "height": h, "bbox": [x0, y0, x1 - x0, y1 - y0]}


def write_coco(root: Path, photos: list[dict]) -> Path:
    images = [{"id": k + 1, "file_name": p["file_name"], "width": p["width"], "height": p["height"]} for k, p in
              enumerate(photos)]  # fmt: skip
    anns = [{"id": k + 1, "image_id": k + 1, "bbox": p["bbox"], "category_id": 1, "iscrowd": 0} for k, p in
            enumerate(photos)]  # fmt: skip
    doc = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "red"}]}
    (root / "annotations.json").write_text(json.dumps(doc))
    return root


def stored(out: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """file name -> (stored pixels, stored boxes, the sample's json) read from the shards."""
    found = {}
    for shard in sorted((out / "train").glob("*.tar")):
        with tarfile.open(shard) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for name, raw in members.items():
            if name.endswith(".json"):
                key = name[: -len(".json")]
                pixels = np.asarray(Image.open(io.BytesIO(members[key + ".jpg"])).convert("RGB"))
                meta = json.loads(raw)
                found[Path(meta["path"]).name] = (pixels, np.load(io.BytesIO(members[key + ".boxes.npy"])), meta)
    return found


def iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def assert_on_object(pixels: np.ndarray, boxes: np.ndarray, what: str) -> None:
    red = (pixels[..., 0] > 150) & (pixels[..., 1] < 100) & (pixels[..., 2] < 100)
    assert pixels.shape[:2] == (UPRIGHT[1], UPRIGHT[0]), what  # stored upright
    assert len(boxes) == 1, what
    assert iou(boxes[0, :4], _bbox(red)) > 0.9, f"{what}: box {boxes[0, :4]} is off the object at {_bbox(red)}"


# the orientations whose raw and upright sizes are equal (no quarter turn): the size cannot tell
# the frames apart, and a raw-pixel annotation of them needs --box-frame raw
SAME_SIZE = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("frames")
    auto, raw = root / "auto", root / "raw"
    for folder in (auto, raw):
        (folder / "images").mkdir(parents=True)
    photos = {"auto": [], "raw": []}
    for orientation in range(1, 9):
        for frame in ("raw", "upright"):
            which = "raw" if frame == "raw" and orientation in SAME_SIZE[1:] else "auto"
            folder = auto if which == "auto" else raw
            photos[which].append(write_photo(folder / "images", f"o{orientation}-{frame}.jpg", orientation, frame))
    photos["auto"].append(write_photo(auto / "images", "wrong-size.jpg", 6, "raw", size=(100, 100)))
    photos["auto"].append(write_photo(auto / "images", "wrong-size-plain.jpg", 1, "raw", size=(96, 64)))
    out = {
        "auto": pack(write_coco(auto, photos["auto"]), root / "out-auto"),
        "raw": pack(write_coco(raw, photos["raw"]), root / "out-raw", reading=Reading(box_frame="raw")),
        "raw-as-auto": pack(raw, root / "out-raw-as-auto"),
    }
    return {name: (result, stored(root / f"out-{name}")) for name, result in out.items()}


@pytest.mark.parametrize("frame", ["raw", "upright"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_stored_box_lands_on_the_object(packed, orientation, frame):
    name = f"o{orientation}-{frame}.jpg"
    pack_name = "raw" if frame == "raw" and orientation in SAME_SIZE[1:] else "auto"
    pixels, boxes, _ = packed[pack_name][1][name]
    assert_on_object(pixels, boxes, f"orientation {orientation}, annotated in the {frame} frame")


def test_a_size_that_fits_neither_frame_is_a_reject_with_the_reason(packed, tmp_path):
    result, found = packed["auto"]
    assert "wrong-size.jpg" not in found and "wrong-size-plain.jpg" not in found
    assert result.splits["train"]["rejected"] == 2
    out = Path(result.out)
    reasons = {json.loads(line)["path"]: json.loads(line)["reason"] for line in (out / "rejects.jsonl").open()}
    assert reasons["images/wrong-size.jpg"] == (
        "the annotation's size 100x100 is neither the image's 48x80 pixels nor its 80x48 upright by EXIF orientation 6"
    )
    assert reasons["images/wrong-size-plain.jpg"] == "the annotation's size 96x64 is not the image's 80x48"


def test_a_size_both_frames_share_is_read_upright_unless_told(packed):
    """Orientations 2-4 keep the size: a raw-pixel annotation of them is read upright by default
    (as a labelling tool shows the photo) and lands right with ``box_frame="raw"``; the choice is
    recorded in the pack's settings."""
    for orientation in SAME_SIZE[1:]:
        pixels, boxes, _ = packed["raw-as-auto"][1][f"o{orientation}-raw.jpg"]
        red = (pixels[..., 0] > 150) & (pixels[..., 1] < 100) & (pixels[..., 2] < 100)
        assert iou(boxes[0, :4], _bbox(red)) < 0.5  # the other frame's box: why the option exists
    assert Manifest.load(Path(packed["raw"][0].out) / "train").pack["box_frame"] == "raw"


def test_a_stored_box_maps_back_to_the_annotated_pixels(packed, tmp_path):
    """What ``stoker eval --coco-results`` writes: a box in the stored (upright) pixels, mapped
    back into the frame and pixels its annotation was drawn in, is the annotation's box."""
    from stoker.model.train.coco_results import to_original

    checked = 0
    for name in ("auto", "raw"):
        doc = json.loads((Path(packed[name][0].out).parent / name / "annotations.json").read_text())
        wanted = {im["file_name"]: a["bbox"] for im, a in zip(doc["images"], doc["annotations"], strict=True)}
        for file_name, (pixels, boxes, meta) in packed[name][1].items():
            h, w = pixels.shape[:2]
            (x0, y0, x1, y1), (bx, by, bw, bh) = (
                to_original(boxes[:, :4], meta, np.array([0, 0, w, h]))[0],
                wanted[file_name],
            )
            assert np.allclose([x0, y0, x1 - x0, y1 - y0], [bx, by, bw, bh], atol=1e-3), (file_name, meta)
            checked += 1
    assert checked == 16
