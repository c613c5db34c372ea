"""The pipelines `stoker bench` measures, one per subprocess (the child side).

``python -m stoker.tools.bench.runners CONFIG_JSON`` runs the pipeline ``CONFIG_JSON["kind"]``
names and prints ``RESULT {json}`` (see :func:`stoker.tools.bench.peers.timing.timed`). Each runs
in a fresh process so peak RSS and CPU time are its own. FFCV runs elsewhere
(:mod:`stoker.tools.bench.peers.ffcv_bench`), under the python that has it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .peers.timing import epochs, row, timed, tree_cpu, tree_peak_rss


def _shards(data: str) -> list[str]:
    from stoker.pipeline.shards.manifest import Manifest

    m = Manifest.load(data)
    return [str(Path(data) / s.name) for s in m.shards]


def torchvision_loader(root, *, batch_size: int, crop: int, workers: int, pin_memory: bool = False):
    """The usual torchvision pipeline, column (1) and ``stoker diagnose``'s ImageFolder case:
    ImageFolder + RandomResizedCrop/flip/ToTensor/Normalize + DataLoader, float32 batches.
    Returns ``(loader, dataset)``."""
    import torch
    from torchvision import datasets, transforms

    from stoker.model.normalize import IMAGENET_MEAN, IMAGENET_STD

    tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(crop),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    ds = datasets.ImageFolder(str(root), transform=tf)
    return torch.utils.data.DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        drop_last=True,
        pin_memory=pin_memory,
        persistent_workers=workers > 0,
    ), ds


def _run_torchvision(cfg):
    dl, _ = torchvision_loader(cfg["images"], batch_size=cfg["batch_size"], crop=cfg["crop"], workers=cfg["workers"])
    return timed(epochs(lambda e: iter(dl), cfg["epochs"] + 1), cfg)


class SegmentationFolder:
    """The usual segmentation ``Dataset``: ``(PIL image, PIL mask)`` pairs from an image folder and
    its parallel mask folder (same relative path and stem), the same random resized crop and flip
    applied to both with torchvision's v2 transforms (the mask with nearest neighbour), uint8
    tensors out: the peer of stoker's mask Loader."""

    def __init__(self, images, masks, *, crop: int, channels: int = 3, train: bool = True):
        from torchvision.transforms import v2

        exts = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp"}
        found = {
            p.relative_to(masks).with_suffix("").as_posix(): p
            for p in Path(masks).rglob("*")
            if p.suffix.lower() in exts
        }
        self.pairs = [
            (p, found[k])
            for p in sorted(Path(images).rglob("*"))
            if p.suffix.lower() in exts and (k := p.relative_to(images).with_suffix("").as_posix()) in found
        ]
        self.mode = "RGB" if channels == 3 else "L"
        ops = (
            [v2.RandomResizedCrop(crop, antialias=True), v2.RandomHorizontalFlip()]
            if train
            else [v2.Resize(round(crop / 0.875), antialias=True), v2.CenterCrop(crop)]
        )
        self.transform = v2.Compose([*ops, v2.PILToTensor()])

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i):
        import torch
        from PIL import Image
        from torchvision import tv_tensors

        image_path, mask_path = self.pairs[i]
        image = Image.open(image_path).convert(self.mode)
        mask = tv_tensors.Mask(torch.from_numpy(__import__("numpy").asarray(Image.open(mask_path))))
        image, mask = self.transform(image, mask)
        return image, mask


class CsvTargets:
    """The usual regression ``Dataset``: a CSV of ``path,value[,value...]``, PIL + torchvision's
    RandomResizedCrop/flip/ToTensor/Normalize, float targets: the peer of stoker's float Loader."""

    def __init__(self, csv, *, crop: int):
        import csv as _csv

        from torchvision import transforms

        from stoker.model.normalize import IMAGENET_MEAN, IMAGENET_STD

        rows = list(_csv.reader(Path(csv).read_text().splitlines()))
        if rows and not rows[0][-1].replace(".", "", 1).replace("-", "", 1).isdigit():
            rows = rows[1:]  # a header
        self.rows = [(Path(csv).parent / r[0], [float(v) for v in r[1:]]) for r in rows if r]
        self.transform = transforms.Compose(
            [
                transforms.RandomResizedCrop(crop),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        path, values = self.rows[i]
        return self.transform(Image.open(path).convert("RGB")), torch.tensor(values, dtype=torch.float32)


def _dataloader(ds, cfg):
    import torch

    return torch.utils.data.DataLoader(
        ds,
        batch_size=cfg["batch_size"],
        shuffle=True,
        num_workers=cfg["workers"],
        drop_last=True,
        persistent_workers=cfg["workers"] > 0,
    )


def _run_torchvision_seg(cfg):
    ds = SegmentationFolder(cfg["images"], cfg["masks"], crop=cfg["crop"], channels=cfg.get("channels", 3))
    dl = _dataloader(ds, cfg)
    return timed(epochs(lambda e: iter(dl), cfg["epochs"] + 1), cfg)


def _run_torchvision_csv(cfg):
    dl = _dataloader(CsvTargets(cfg["images"], crop=cfg["crop"]), cfg)
    return timed(epochs(lambda e: iter(dl), cfg["epochs"] + 1), cfg)


def _wds_decode(sample):
    import io

    from PIL import Image

    img, cls = sample
    return Image.open(io.BytesIO(img)).convert("RGB"), int(cls)


def _run_wds(cfg):
    import torch
    import webdataset as wds
    from torchvision import transforms

    tf = transforms.Compose(
        [transforms.RandomResizedCrop(cfg["crop"]), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
    )
    # explicit decoding of the declared keys only (no webdataset auto/pickle decoders)
    tars = _shards(cfg["data"])
    ds = (
        wds.WebDataset(tars, shardshuffle=len(tars), empty_check=False, workersplitter=wds.split_by_worker)
        .shuffle(1000)
        .to_tuple("jpg;jpeg;png", "cls")
        .map(_wds_decode)
        .map_tuple(tf, lambda c: c)
        .batched(cfg["batch_size"], partial=False)
    )
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=cfg["workers"], persistent_workers=True)
    return timed(epochs(lambda e: iter(dl), cfg["epochs"] + 1), cfg)


def reader_pipeline(
    paths: list,
    index_paths: list,
    *,
    batch_size: int,
    crop,
    threads: int = 2,
    seed: int = 0,
    decode: str = "cpu",
    device_id: int | None = None,
    shuffle_buffer: int = 1024,
    train: bool = True,
):
    """DALI's own ``fn.readers.webdataset`` graph over the same shards, column ``dali-reader``:
    buffer shuffle, shard order kept, DALI's random crop. A reference, not used by the Loader."""
    from nvidia.dali import fn, pipeline_def, types

    from stoker.pipeline.augment.crops import RATIO, SCALE, VAL_CROP_FRACTION

    hw = [crop, crop] if isinstance(crop, int) else list(crop)  # a side or (height, width)

    @pipeline_def
    def reader_graph():
        jpegs, labels = fn.readers.webdataset(
            paths=paths,
            index_paths=index_paths,
            ext=["jpg;jpeg;png", "cls"],
            missing_component_behavior="skip",
            random_shuffle=train,
            initial_fill=shuffle_buffer,
            name="reader",
            seed=seed,
            dtypes=[types.UINT8, types.UINT8],
        )
        if train:
            images = fn.decoders.image_random_crop(
                jpegs, device=decode, output_type=types.RGB, random_area=list(SCALE), random_aspect_ratio=list(RATIO)
            )
            images = fn.resize(images, size=hw)
            mirror = fn.random.coin_flip()
        else:
            images = fn.decoders.image(jpegs, device=decode, output_type=types.RGB)
            images = fn.resize(images, resize_shorter=round(min(hw) / VAL_CROP_FRACTION))
            mirror = 0
        images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW", crop=hw, mirror=mirror)
        return images, labels

    return reader_graph(batch_size=batch_size, num_threads=threads, device_id=device_id, seed=seed)


def _run_dali_reader(cfg):
    import torch

    from stoker.pipeline.shards.manifest import idx_path

    tars = _shards(cfg["data"])
    pipe = reader_pipeline(
        tars, [str(idx_path(t)) for t in tars], batch_size=cfg["batch_size"], crop=cfg["crop"], threads=cfg["workers"]
    )
    pipe.build()
    per_epoch = max(1, pipe.epoch_size("reader") // cfg["batch_size"])

    def batches():
        for _ in range((cfg["epochs"] + 1) * per_epoch):
            images, labels = pipe.run()
            yield torch.from_dlpack(images.as_tensor()), labels

    return timed(batches(), cfg)


def _dali_resize():
    from stoker.pipeline.options import Dali

    return Dali(cpu_resize="dali")  # DALI's CPU graph resizing with fn.resize


def _run_stoker(cfg, backend, device="cpu", **kw):
    from stoker.pipeline import Loader

    loader = Loader(
        cfg["data"],
        batch_size=cfg["batch_size"],
        crop=cfg["crop"],
        backend=backend,
        threads=cfg["workers"],
        device=device,
        channels=cfg.get("channels", 3),
        **kw,
    )

    def epoch(e):
        loader.set_epoch(e)
        return iter(loader)

    return timed(epochs(epoch, cfg["epochs"] + 1), cfg)


def _run_pixels(cfg, *, fill: bool):
    """The pixel tier (``Loader(pixel_cache=cfg["pixel_cache"])``, a fresh folder): ``fill``, its
    first epoch alone, the JPEG path while a background process fills the store (the default);
    else the epochs after the untimed ones that filled the store inline (epoch 0 and, for the
    samples drop_last left out, the next until the store is complete and sealed), which crop from
    decoded pixels."""
    import collections
    import shutil
    import tempfile

    from stoker.pipeline import Loader
    from stoker.pipeline.pixels import PixelCache

    root = tempfile.mkdtemp(prefix="stoker-bench-pixels-", dir=cfg["pixel_cache"])
    try:
        loader = Loader(
            cfg["data"],
            batch_size=cfg["batch_size"],
            crop=cfg["crop"],
            threads=cfg["workers"],
            channels=cfg.get("channels", 3),
            pixel_cache=PixelCache(root, fill="background" if fill else "inline"),
        )
        untimed = 0
        while not fill and untimed < 4:
            # Epoch 0 fills the store (no batch of it is kept: a kept one holds a lent slot). It
            # leaves the samples drop_last skipped to the next epochs, and the epoch that completes
            # the store flushes it once (the seal): warm epochs are timed on a complete, sealed store.
            collections.deque(loader, maxlen=0)
            untimed += 1
            store = loader.pixel_store
            if store.stats()["filled"] >= store.cacheable:
                store.join_seal()
                break

        def epoch(e):
            loader.set_epoch(e + untimed)
            return iter(loader)

        result = timed(epochs(epoch, 1 if fill else cfg["epochs"] + 1), cfg)
        loader.close()
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _decode_all(job):
    import io

    from PIL import Image

    from stoker.pipeline.shards.samples import SampleIndex

    data, lo, hi = job
    idx = SampleIndex(data)
    t = time.perf_counter()
    for i in range(lo, hi):
        Image.open(io.BytesIO(idx.image(i))).load()
    return time.perf_counter() - t


def _run_ceiling(cfg):
    """Every image decoded once per epoch by `workers` processes, nothing else."""
    from stoker.pipeline.shards.samples import SampleIndex
    from stoker.pipeline.workers import Workers

    n = len(SampleIndex(cfg["data"]))
    w = cfg["workers"]
    parts = [(cfg["data"], n * k // w, n * (k + 1) // w) for k in range(w)]
    with Workers(w, doing="decoding", resume="rerun the benchmark") as pool:
        list(pool.map(_decode_all, [(cfg["data"], lo, min(hi, lo + 20)) for _, lo, hi in parts]))  # warm-up
        t0, cpu0, done = time.perf_counter(), tree_cpu(), 0
        for e in range(10**6):
            list(pool.map(_decode_all, parts))
            done += n
            elapsed = time.perf_counter() - t0
            # at least `epochs` epochs and 1 s (tiny data), at most `seconds`
            if elapsed > cfg["seconds"] or (e + 1 >= cfg["epochs"] and elapsed > min(1.0, cfg["seconds"])):
                break
        wall, cpu, rss = time.perf_counter() - t0, tree_cpu() - cpu0, tree_peak_rss()
    return row(done, wall, cpu, rss, bytes_per_batch=0)


RUNNERS = {
    "torchvision": _run_torchvision,
    "torchvision-seg": _run_torchvision_seg,
    "torchvision-csv": _run_torchvision_csv,
    "wds": _run_wds,
    "dali-reader": _run_dali_reader,
    "stoker-dali-dali-resize": lambda c: _run_stoker(c, _dali_resize()),
    "stoker-pixels": lambda c: _run_pixels(c, fill=False),
    "stoker-pixels-fill": lambda c: _run_pixels(c, fill=True),
    "ceiling": _run_ceiling,
}


def _runner(kind: str):
    """The measurement of ``kind``: a row above, or ``stoker-<backend>`` for any registered backend
    (on the GPU when it decodes only there)."""
    if kind in RUNNERS or not kind.startswith("stoker-"):
        return RUNNERS[kind]
    from stoker.pipeline.backends import get_backend

    backend = get_backend(kind.removeprefix("stoker-"))
    return lambda c: _run_stoker(c, backend.name, device="cpu" if "cpu" in backend.where else "cuda")


def main(argv: list[str]) -> int:
    """Entry point of one measurement subprocess: prints ``RESULT {json}``."""
    cfg = json.loads(argv[0])
    print("RESULT " + json.dumps(_runner(cfg["kind"])(cfg)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
