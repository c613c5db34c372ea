"""What the hostile-input tests of ``stoker pack`` share (test_hostile_pack.py,
test_hostile_pack_output.py): a small class folder, the command run quietly in this process, what
a pack wrote (its samples, its rejects) and the one line of a failed command."""

import json
import re
from pathlib import Path

from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.cli import main as cli
from stoker.tools.common.synth import make_image_folder

CLASSES = ("circles", "rings", "squares")


def folder(root: Path, **kw) -> Path:
    """An ImageFolder of :data:`CLASSES`, 3 images each (``kw``: other ``make_image_folder`` settings)."""
    kw = {"classes": CLASSES, "per_class": 3, "min_side": 32, "max_side": 80, **kw}
    return make_image_folder(root, **kw)


def pack(*argv) -> int:
    """``stoker pack ARGV`` in this process, without a progress bar, one worker: the exit status."""
    return cli(["pack", *map(str, argv), "-q", "--workers", "1"])


def samples(out: Path, split: str = "train") -> dict[str, tuple[int, dict, bytes]]:
    """path -> (cls, meta, jpg) of every sample of a split, read with webdataset."""
    import webdataset as wds

    m = Manifest.load(out / split)
    got = {}
    for s in wds.WebDataset([str(out / split / x.name) for x in m.shards], shardshuffle=False, empty_check=False):
        meta = json.loads(s["json"])
        assert meta["path"] not in got, meta["path"]  # every input packed at most once
        got[meta["path"]] = (int(s["cls"]), meta, s["jpg"])
    return got


def rejects(out: Path) -> dict[str, str]:
    raw = (out / "rejects.jsonl").read_bytes()
    raw.decode("utf-8")  # strict: always valid UTF-8
    return {r["path"]: r["reason"] for r in map(json.loads, raw.decode().splitlines())}


def one_line_error(capsys) -> str:
    """The one stderr line of a failed command, without the CLI's ``stoker pack: error: `` prefix."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("stoker pack: "), err
    return re.sub(r"^stoker pack: (error: )?", "", err)
