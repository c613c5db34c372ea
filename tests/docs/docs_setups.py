"""What the pages assume exists, generated small: one function per setup name.

A page names its setups in a marker (``<!-- docs-test: setup: ages, placeholders -->``); each
runs once, in the page's folder (the working directory; HOME is its ``home/``), before the page's
first block. A setup writes the files the page's commands read (under ``work.root``, or
``work.home`` for ``~/...``; absolute paths like ``/data/x`` are read as ``work.root / "data/x"``)
and may add names to the page's python namespace (``work.names``): the placeholders a snippet
leaves to the reader (``my_net``, ``epochs``). To add one: write a function taking the
:class:`~docs_runner.Workdir` and decorate it with ``@setup("name")``.

Data is tiny (tens to a few hundred images of at most 96 px): enough for the pages' batch sizes,
cheap to decode. The generators are the package's own (:mod:`stoker.tools.common.synth`) and the
tests' (``helpers.write_split``). Every setup is in this one module (a registry of short
functions, data first, then the reader's own things), so a page's names are found in one place.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from docs_runner import Workdir
from helpers import write_split
from stoker.pipeline.shards.table import write_split_table
from stoker.tools.common.synth import CLASSES, draw, encode, make_image_folder

#: setup name -> function; filled by @setup
SETUPS: dict[str, Callable[[Workdir], None]] = {}


def setup(name: str):
    def register(fn: Callable[[Workdir], None]) -> Callable[[Workdir], None]:
        SETUPS[name] = fn
        return fn

    return register


def _image_tree(root: Path, *, train: int, val: int, seed: int = 0) -> Path:
    """An ImageFolder tree with ``train/`` and ``val/`` (the 6 pattern classes, 32-64 px)."""
    make_image_folder(root / "train", per_class=train, min_side=32, max_side=64, seed=seed)
    make_image_folder(root / "val", per_class=val, min_side=32, max_side=64, seed=seed + 1)
    return root


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)


# ---- data -------------------------------------------------------------------------------------
@setup("imagenet")
def imagenet(work: Workdir) -> None:
    """``~/data/imagenet`` and ``/data/imagenet``: a train/+val/ ImageFolder tree, 264 + 36
    images of 6 classes (a batch of 256 fits its train split)."""
    tree = _image_tree(work.home / "data" / "imagenet", train=44, val=6)
    _link(work.root / "data" / "imagenet", tree)


@setup("photos")
def photos(work: Workdir) -> None:
    """``~/data/photos``: an ImageFolder (no val/), 300 images of 6 classes (its 90% fits a batch of 256)."""
    make_image_folder(work.home / "data" / "photos", per_class=50, min_side=32, max_side=64)


@setup("images")
def images(work: Workdir) -> None:
    """``images/``: an ImageFolder of 300 images, 6 classes (no val/)."""
    make_image_folder(work.root / "images", per_class=50, min_side=32, max_side=64)


def _imagenet_shaped(root: Path) -> None:
    """``root/train`` (264 samples) and ``root/val`` (36): shards as a pack of ImageNet writes
    them, 1,000 classes (the samples are of the first 6)."""
    names = list(CLASSES) + [f"n{i:08d}" for i in range(1000 - len(CLASSES))]
    for split, n, seed in (("train", 264, 0), ("val", 36, 1)):
        manifest = write_split(root / split, num_samples=n, samples_per_shard=100, seed=seed, min_side=32, max_side=64)
        manifest.classes = names
        manifest.save(root / split)
        write_split_table(root / split)  # with the images' sizes, as `stoker pack` writes it


@setup("data")
def data(work: Workdir) -> None:
    """``data/train`` and ``data/val``: ImageNet-shaped shards (1,000 classes, 264 + 36 samples)."""
    _imagenet_shaped(work.root / "data")


@setup("out")
def out(work: Workdir) -> None:
    """``out/train`` and ``out/val``: ImageNet-shaped shards (1,000 classes, 264 + 36 samples)."""
    _imagenet_shaped(work.root / "out")


@setup("api-src")
def api_src(work: Workdir) -> None:
    """``src/``: an ImageFolder of 48 images, 6 classes (the API page's SRC)."""
    make_image_folder(work.root / "src", per_class=8, min_side=32, max_side=64)


def _ages(root: Path) -> Path:
    """``root/targets.csv`` (``path,age``, 18 to 80) and ``root/images/``: 100 pictures whose colour
    temperature is the age; returns the CSV."""
    from stoker.tools.common.synth import make_regression_csv

    return make_regression_csv(root, n=100, low=18, high=80, column="age", min_side=40, max_side=96)


def _seg(root: Path) -> tuple[Path, Path]:
    """``root/images`` and ``root/masks``: 40 grayscale pictures of textured shapes, 4 classes."""
    from stoker.tools.common.synth import make_segmentation_tree

    return make_segmentation_tree(root, n=40, min_side=48, max_side=96)


@setup("ages")
def ages(work: Workdir) -> None:
    """``ages/targets.csv`` and ``ages/images/`` (the Regression page's CSV: ages 18 to 80)."""
    _ages(work.root / "ages")


@setup("seg")
def seg(work: Workdir) -> None:
    """``seg/images`` and ``seg/masks`` (the Segmentation page's pictures and masks, 4 classes)."""
    _seg(work.root / "seg")


@setup("shapes")
def shapes(work: Workdir) -> None:
    """``shapes/{coco,yolo,voc}``: 24 + 6 generated pictures of shapes with their exact boxes,
    written in COCO JSON, YOLO and Pascal VOC (the Detection page's)."""
    from stoker.tools.common.synth import make_detection_scenes

    make_detection_scenes(work.root / "shapes", n=24, val=6, min_side=48, max_side=80)


@setup("exports")
def exports(work: Workdir) -> None:
    """``exports/<layout>/``: 12 + 4 of the Detection page's shapes in each folder shape a
    labelling tool or dataset library exports (:mod:`stoker.tools.common.detection_exports`),
    beside ``exports/coco`` (the canonical COCO layout) and ``exports/yolo``."""
    from stoker.tools.common.detection_exports import EXPORTS, make_detection_export
    from stoker.tools.common.synth import make_detection_scenes

    scenes = make_detection_scenes(work.root / "exports", n=12, val=4, formats=("coco", "yolo"))  # coco/: canonical
    for layout in EXPORTS:
        make_detection_export(scenes, layout, work.root / "exports" / layout)


@setup("scans")
def scans(work: Workdir) -> None:
    """``scans/``: an ImageFolder of 60 one-channel images (6 classes)."""
    rng = random.Random(0)
    for cls in CLASSES:
        folder = work.root / "scans" / cls
        folder.mkdir(parents=True)
        for i in range(10):
            size = (rng.randint(32, 64), rng.randint(32, 64))
            (folder / f"{i:03d}.jpg").write_bytes(encode(draw(cls, size, rng).convert("L")))


@setup("packed-tasks")
def packed_tasks(work: Workdir) -> None:
    """``ages-packed/`` (float targets, 80 + 20) and ``seg-packed/`` (masks, 4 classes, 32 + 8):
    what the Regression and Segmentation pages pack."""
    from stoker.tools.pack import Masks, pack

    pack(_ages(work.root / ".sources" / "ages"), work.root / "ages-packed", val_fraction=0.2, workers=1)
    pictures, masks = _seg(work.root / ".sources" / "seg")
    pack(pictures, work.root / "seg-packed", masks=Masks(masks, num_classes=4), val_fraction=0.2, workers=1)


@setup("pack-sources")
def pack_sources(work: Workdir) -> None:
    """What the Packing page packs: ``photos/`` (an ImageFolder), ``labels.csv`` (``path,label``)
    and ``ages.csv`` (``path,age``, whole years) of the pictures in ``pictures/``, ``images/`` with
    their ``masks/``, ``pairs.csv`` (``image,mask`` rows, Cityscapes' names), ``beans/`` (a
    parquet repository as Hugging Face ``datasets`` writes it), ``VOC2012/`` (Pascal VOC's
    layout) and ``/path/to/imagenet-sample`` (a flat folder of ``<synset>_<n>.JPEG``)."""
    from stoker.tools.common.synth import make_segmentation_tree

    make_image_folder(work.root / "photos", per_class=10, min_side=32, max_side=64)
    rng = random.Random(1)
    (work.root / "pictures").mkdir()
    rows = []
    for i in range(20):
        name, label = f"pictures/{i:03d}.jpg", ("cat", "dog")[i % 2]
        (work.root / name).write_bytes(encode(draw(CLASSES[i % 2], (48, 40), rng)))
        rows.append((name, label))
    (work.root / "labels.csv").write_text("".join(f"{name},{label}\n" for name, label in rows))
    ages = "".join(f"{name},{20 + i}\n" for i, (name, _) in enumerate(rows))
    (work.root / "ages.csv").write_text("path,age\n" + ages)
    make_segmentation_tree(work.root, n=20, min_side=48, max_side=96)
    _mask_pairs(work.root, n=12)
    _parquet_repo(work.root / "beans")
    _voc(work.root / "VOC2012", n=16)
    _flat_sample(work.root / "path" / "to" / "imagenet-sample")


def _mask_pairs(root: Path, n: int) -> Path:
    """``root/pairs.csv``: ``image,mask`` rows of ``leftImg8bit/aachen/*_leftImg8bit.png`` pictures
    and their ``gtFine/aachen/*_gtFine_labelIds.png`` masks (4 classes), Cityscapes' names."""
    from PIL import Image

    from stoker.tools.common.synth import draw_segmentation

    rng = random.Random(5)
    images, masks = root / "leftImg8bit" / "aachen", root / "gtFine" / "aachen"
    images.mkdir(parents=True)
    masks.mkdir(parents=True)
    rows = ["image,mask"]
    for k in range(n):
        stem = f"aachen_000000_{k:06d}"
        picture, mask = draw_segmentation((48, 40), rng)
        Image.fromarray(picture, "L").save(images / f"{stem}_leftImg8bit.png")
        Image.fromarray(mask, "L").save(masks / f"{stem}_gtFine_labelIds.png")
        rows.append(f"leftImg8bit/aachen/{stem}_leftImg8bit.png,gtFine/aachen/{stem}_gtFine_labelIds.png")
    (root / "pairs.csv").write_text("\n".join(rows) + "\n")
    return root / "pairs.csv"


def _voc(root: Path, n: int) -> Path:
    """Pascal VOC's segmentation layout: ``root/JPEGImages/2007_<k>.jpg``, their palette masks in
    ``root/SegmentationClass`` (4 classes, 255 on the shapes' edges) for all but the last 4, and
    ``root/ImageSets/Segmentation/{train,val}.txt`` listing 8 and 4 stems (the others in no list)."""
    import numpy as np
    from PIL import Image

    from stoker.tools.common.synth import draw_segmentation

    rng = random.Random(7)
    images, masks, lists = root / "JPEGImages", root / "SegmentationClass", root / "ImageSets" / "Segmentation"
    for folder in (images, masks, lists):
        folder.mkdir(parents=True)
    stems = [f"2007_{k:06d}" for k in range(n)]
    for k, stem in enumerate(stems):
        picture, mask = draw_segmentation((56, 48), rng)
        Image.fromarray(picture, "L").convert("RGB").save(images / f"{stem}.jpg", quality=90)
        if k < n - 4:
            edges = np.zeros_like(mask, bool)
            edges[:, 1:] |= mask[:, 1:] != mask[:, :-1]
            m = Image.fromarray(np.where(edges, 255, mask).astype(np.uint8), "P")
            m.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0] + [224, 224, 192] * 252)
            m.save(masks / f"{stem}.png")
    (lists / "train.txt").write_text("".join(f"{s}\n" for s in stems[:8]))
    (lists / "val.txt").write_text("".join(f"{s}\n" for s in stems[8 : n - 4]))
    return root


def _parquet_repo(root: Path) -> Path:
    """``root/data/{train,validation,test}-00000-of-00001.parquet``: a dataset repository as
    Hugging Face ``datasets`` writes beans (an ``image`` of bytes and path, a ``labels``
    ClassLabel of 3 classes, an ``image_file_path``), 12 + 6 + 3 rows."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    names = ["angular_leaf_spot", "bean_rust", "healthy"]
    features = {
        "image_file_path": {"_type": "Value", "dtype": "string"},
        "image": {"_type": "Image"},
        "labels": {"_type": "ClassLabel", "names": names},
    }
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rng = random.Random(6)
    (root / "data").mkdir(parents=True)
    for split, n in (("train", 12), ("validation", 6), ("test", 3)):
        paths = [f"{split}/{names[k % 3]}/{split}.{k}.jpg" for k in range(n)]
        rows = [{"bytes": encode(draw(CLASSES[k % 3], (48, 40), rng)), "path": p} for k, p in enumerate(paths)]
        table = pa.table(
            {
                "image_file_path": pa.array(paths),
                "image": pa.array(rows, image),
                "labels": pa.array([k % 3 for k in range(n)], pa.int64()),
            }
        )
        pq.write_table(table.replace_schema_metadata(metadata), root / "data" / f"{split}-00000-of-00001.parquet")
    return root


def _flat_sample(folder: Path, n: int = 24) -> Path:
    """A flat folder of ``<synset>_<n>.JPEG`` photos, as the 1,000-photo ImageNet sample is."""
    rng = random.Random(2)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        cls = CLASSES[i % 3]
        size = (rng.randint(48, 96), rng.randint(48, 96))
        (folder / f"n0{i % 3}_{i:05d}.JPEG").write_bytes(encode(draw(cls, size, rng)))
    return folder


@setup("foreign-shards")
def foreign_shards(work: Workdir) -> None:
    """WebDataset tars another tool wrote: ``/data/laion/*.tar`` (``jpg`` + integer ``cls``),
    ``/data/shards`` (``jpg``, ``cls`` naming cat or dog, and a float ``npy``) and
    ``/data/seg-shards`` (``jpg`` + a ``seg.png`` mask of 4 classes)."""
    import io

    import numpy as np
    import webdataset as wds
    from PIL import Image

    from stoker.tools.common.synth import draw_segmentation

    rng = random.Random(3)

    def write(folder: Path, samples) -> None:
        folder.mkdir(parents=True)
        for shard in range(2):
            with wds.TarWriter(str(folder / f"{shard:05d}.tar")) as tar:
                for i in range(8):
                    tar.write({"__key__": f"{shard}-{i:04d}", **samples(i)})

    def jpg(i: int) -> bytes:
        return encode(draw(CLASSES[i % 2], (48, 40), rng))

    def npy(value: float) -> bytes:
        buf = io.BytesIO()
        np.save(buf, np.float32(value))
        return buf.getvalue()

    def seg(i: int) -> dict:
        picture, mask = draw_segmentation((48, 40), rng)
        return {"jpg": encode(Image.fromarray(picture, "L")), "seg.png": encode(Image.fromarray(mask), "PNG")}

    write(work.root / "data" / "laion", lambda i: {"jpg": jpg(i), "cls": str(i % 2).encode()})
    write(work.root / "data" / "shards", lambda i: {"jpg": jpg(i), "cls": (b"cat", b"dog")[i % 2], "npy": npy(i / 8)})
    write(work.root / "data" / "seg-shards", seg)


@setup("OUT")
def pack_out(work: Workdir) -> None:
    """``OUT/``: a pack with ``train/`` and ``val/`` (``stoker verify OUT``)."""
    from stoker.tools.pack.api import pack

    make_image_folder(work.root / ".sources" / "photos", per_class=6, min_side=32, max_side=64)
    pack(work.root / ".sources" / "photos", work.root / "OUT", val_fraction=0.3, workers=1)


@setup("bench-folders")
def bench_folders(work: Workdir) -> None:
    """The folders the measurement pages name: ``/tmp/inet-sym``, ``/tmp/diag-inet`` and
    ``/tmp/inet_folder`` (ImageFolders of 60 photos, 6 classes; ``/tmp/inet_packed`` is the
    last one packed), ``/tmp/diag-user/smallnet.py`` (``build()``: a small network) and
    ``~/data/imagenet-sample`` (a flat folder of photos)."""
    from stoker.tools.pack.api import pack

    tmp = work.root / "tmp"
    for name in ("inet-sym", "diag-inet", "inet_folder"):
        make_image_folder(tmp / name, per_class=10, min_side=48, max_side=96)
    pack(tmp / "inet_folder", tmp / "inet_packed", workers=1)
    (tmp / "diag-user").mkdir()
    (tmp / "diag-user" / "smallnet.py").write_text(USER_NET.replace("make_net", "build"))
    _flat_sample(work.home / "data" / "imagenet-sample")


#: the reader's own network in a file (``--model FILE.py:make_net``)
USER_NET = """from torch import nn


def make_net(num_classes=1000):
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=4, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes),
    )
"""


@setup("user-nets")
def user_nets(work: Workdir) -> None:
    """The reader's own networks: ``train.py`` (``make_net``) and the package ``my_project.nets``
    (``build``), each a small CNN."""
    (work.root / "train.py").write_text(USER_NET)
    (work.root / "my_project").mkdir()
    (work.root / "my_project" / "__init__.py").write_text("")
    (work.root / "my_project" / "nets.py").write_text(USER_NET.replace("make_net", "build"))


@setup("pictures")
def pictures(work: Workdir) -> None:
    """``cat.jpg``, ``dog.png`` and ``a.jpg``: pictures to predict on."""
    rng = random.Random(4)
    for name, fmt in (("cat.jpg", "JPEG"), ("dog.png", "PNG"), ("a.jpg", "JPEG")):
        (work.root / name).write_bytes(encode(draw("circles", (80, 60), rng), fmt))


def _long_tail(split: Path, sizes: list[int], seed: int) -> None:
    """A class split whose class ``c`` has ``sizes[c]`` samples, shuffled (one shard)."""
    from stoker.pipeline.shards.manifest import Manifest
    from stoker.pipeline.shards.writer import ShardWriter

    rng = random.Random(seed)
    labels = [c for c, n in enumerate(sizes) for _ in range(n)]
    rng.shuffle(labels)
    split.mkdir(parents=True, exist_ok=True)
    with ShardWriter(split / "shard-000000.tar") as w:
        for i, c in enumerate(labels):
            image = encode(draw(CLASSES[c], (rng.randint(32, 64), rng.randint(32, 64)), rng), quality=90)
            w.write(f"{i:09d}", {"jpg": image, "cls": str(c).encode()})
    Manifest(num_samples=len(labels), classes=list(CLASSES), shards=[w.info], pack={}).save(split)


@setup("mix")
def mix(work: Workdir) -> None:
    """``datasets/web`` (200 + 30 samples), ``datasets/curated`` (40 + 12) and ``datasets/longtail``
    (a 100:1 tail over the 6 classes, 150 train samples; val 8 a class): each train/ and val/."""
    root = work.root / "datasets"
    for name, (train, val, seed) in {"web": (200, 30, 0), "curated": (40, 12, 2)}.items():
        write_split(
            root / name / "train", num_samples=train, samples_per_shard=100, seed=seed, min_side=32, max_side=64
        )
        write_split(
            root / name / "val", num_samples=val, samples_per_shard=100, seed=seed + 1, min_side=32, max_side=64
        )
    _long_tail(root / "longtail" / "train", [100, 30, 10, 5, 3, 2], seed=4)
    _long_tail(root / "longtail" / "val", [8] * 6, seed=5)


# ---- the reader's own things ------------------------------------------------------------------
def tiny_net(num_classes: int = 1000, in_channels: int = 3):
    """A network of a few hundred parameters standing for the reader's own (any input size)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(in_channels, 8, 3, stride=4, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, num_classes),
    )


@setup("placeholders")
def placeholders(work: Workdir) -> None:
    """The names a snippet leaves to the reader: ``my_net``, ``net``, ``model`` (bare networks,
    1000 classes), ``criterion``, ``optimizer`` (of ``net``), ``epochs`` (1), ``start_epoch``,
    ``ckpt`` (a dict), ``mean`` and ``std`` (ImageNet's)."""
    import torch

    from stoker.model import IMAGENET_MEAN, IMAGENET_STD

    net = tiny_net()
    work.names.update(
        my_net=tiny_net(),
        net=net,
        model=tiny_net(),
        criterion=torch.nn.CrossEntropyLoss(),
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        epochs=1,
        start_epoch=0,
        ckpt={},
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    )


@setup("loader")
def loader(work: Workdir) -> None:
    """``loader``: a Loader of 64 train samples (6 classes, crop 224, batch 32) standing for the
    reader's own."""
    from stoker.pipeline import Loader

    split = work.root / ".loader" / "train"
    write_split(split, num_samples=64, samples_per_shard=64, min_side=32, max_side=64)
    work.names["loader"] = Loader(split, batch_size=32, crop=224, threads=1)
    work.cleanups.append(work.names["loader"].close)


@setup("process-group")
def process_group(work: Workdir) -> None:
    """A torch.distributed process group of one (gloo): what ``torchrun`` gives a script, so
    ``DistributedSampler(ds)`` works."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    work.cleanups.append(dist.destroy_process_group)


@setup("imagenet-script")
def imagenet_script(work: Workdir) -> None:
    """The names pytorch/examples' ``imagenet/main.py`` has where the Integrations page edits it:
    ``os``, ``args`` (its flags: ``data`` is ``data``, ``--batch-size 16``, ``--workers 2``),
    ``device`` (the CPU) and ``model`` (a torchvision ResNet-18, as ``--arch resnet18`` builds)."""
    import argparse
    import os

    import torch
    import torchvision

    work.names.update(
        os=os,
        args=argparse.Namespace(data="data", batch_size=16, workers=2),
        device=torch.device("cpu"),
        model=torchvision.models.resnet18(),
    )


@setup("timm-script")
def timm_script(work: Workdir) -> None:
    """The names timm's ``train.py`` has where the Integrations page edits it, for
    ``train.py data --model resnet18 --num-classes 6 --val-split val --mixup 0.8 --cutmix 1.0``:
    ``os``, ``args`` (its flags at their defaults otherwise), ``model`` (from ``create_model``),
    ``data_config`` (``resolve_data_config``), ``device`` (the CPU), ``mixup_args`` and
    ``mixup_active``."""
    import argparse
    import os

    import timm
    import timm.data
    import torch

    args = argparse.Namespace(
        data_dir="data",
        train_split="train",
        val_split="val",
        model="resnet18",
        num_classes=6,
        batch_size=16,
        validation_batch_size=None,
        workers=2,
        seed=42,
        scale=[0.08, 1.0],
        ratio=[3 / 4, 4 / 3],
        aa=None,
        color_jitter=0.4,
        reprob=0.0,
        remode="pixel",
        recount=1,
        mixup=0.8,
        cutmix=1.0,
        cutmix_minmax=None,
        mixup_prob=1.0,
        mixup_switch_prob=0.5,
        mixup_mode="batch",
        smoothing=0.1,
    )
    model = timm.create_model(args.model, num_classes=args.num_classes)
    mixup_args = dict(
        mixup_alpha=args.mixup,
        cutmix_alpha=args.cutmix,
        cutmix_minmax=args.cutmix_minmax,
        prob=args.mixup_prob,
        switch_prob=args.mixup_switch_prob,
        mode=args.mixup_mode,
        label_smoothing=args.smoothing,
        num_classes=args.num_classes,
    )
    work.names.update(
        os=os,
        args=args,
        model=model,
        data_config=timm.data.resolve_data_config(vars(args), model=model),
        device=torch.device("cpu"),
        mixup_args=mixup_args,
        mixup_active=True,
    )


@setup("lightning-module")
def lightning_module(work: Workdir) -> None:
    """``module``: a LightningModule training a small network (wrapped in ``with_normalize``) with
    cross-entropy and SGD."""
    import pytorch_lightning as pl
    import torch

    from stoker.model import with_normalize

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = with_normalize(tiny_net())

        def training_step(self, batch, _):
            images, labels = batch
            return torch.nn.functional.cross_entropy(self.model(images), labels)

        def validation_step(self, batch, _):
            images, labels = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self.model(images), labels))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    work.names["module"] = Module()


@setup("venv")
def venv(work: Workdir) -> None:
    """``.venv/bin/activate``: a stand-in for the virtualenv ``make`` builds (the blocks' PATH
    already has this checkout's ``stoker``)."""
    activate = work.root / ".venv" / "bin" / "activate"
    activate.parent.mkdir(parents=True)
    activate.write_text("# the docs tests' stand-in: stoker is already on PATH\n")
