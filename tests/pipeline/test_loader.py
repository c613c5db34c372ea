import io
import random
import warnings

import numpy as np
import pytest
import torch

from helpers import run_epoch, write_split
from stoker.errors import ManifestError, TargetError
from stoker.pipeline import Loader
from stoker.pipeline.deps import HAS_DALI
from stoker.pipeline.options import Auto, Dali
from stoker.pipeline.shards.manifest import Manifest
from stoker.pipeline.shards.writer import ShardWriter
from stoker.tools.common.synth import CLASSES, draw, encode

BACKENDS = ["pil"] + (["dali"] if HAS_DALI else [])
needs_dali = pytest.mark.skipif(not HAS_DALI, reason="nvidia-dali not installed")
CROP = 32


@pytest.fixture
def split(tmp_path):
    """50 samples in 4 shards whose labels are their global positions (unique)."""
    path = tmp_path / "train"
    write_split(path, num_samples=50, samples_per_shard=16, classes=list(CLASSES) * 10)
    return path


run = run_epoch


def flat(labels):
    return torch.cat(labels).tolist()


def make(split, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("crop", CROP)
    kw.setdefault("threads", 0 if kw.get("backend") == "pil" else 1)  # pil: in-process
    return Loader(split, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_epoch_is_a_fresh_permutation(split, backend):
    loader = make(split, backend=backend, drop_last=False)
    images, labels = run(loader, 0)
    assert len(images) == len(loader) == 7
    got = flat(labels)
    assert sorted(got) == list(range(50))
    assert got == loader.indices().tolist()  # labels are positions here
    _, labels1 = run(loader, 1)
    assert sorted(flat(labels1)) == list(range(50)) and flat(labels1) != got
    x = images[0]
    assert x.shape == (8, 3, CROP, CROP) and x.dtype == torch.uint8 and x.device.type == "cpu"
    assert x.is_contiguous() and labels[0].dtype == torch.int64
    assert images[-1].shape[0] == 2  # drop_last=False keeps the partial batch


@pytest.mark.parametrize("backend", BACKENDS)
def test_drop_last_default_train_true_val_false(split, backend):
    train = make(split, backend=backend)
    assert train.drop_last and len(train) == 6
    assert [len(y) for y in run(train)[1]] == [8] * 6
    val = make(split, backend=backend, train=False)
    assert not val.drop_last and len(val) == 7
    assert flat(run(val)[1]) == list(range(50))  # val: stored order, every sample once


def test_ranks_disjoint_and_covering(split):
    for world in (2, 3):
        train = [make(split, backend="pil", rank=r, world_size=world, seed=5, drop_last=False) for r in range(world)]
        seen = [flat(run(ld, 2)[1]) for ld in train]
        assert len({len(s) for s in seen}) == 1 and len({len(ld) for ld in train}) == 1
        union = [i for s in seen for i in s]
        assert len(union) == len(set(union)) == 50 // world * world
        val = [make(split, backend="pil", train=False, rank=r, world_size=world) for r in range(world)]
        vseen = [i for ld in val for i in flat(run(ld)[1])]
        assert sorted(vseen) == list(range(50))


def test_train_defaults_to_what_the_manifest_says_the_split_is(split, tmp_path):
    val_dir = tmp_path / "val"
    m = write_split(val_dir, num_samples=20, samples_per_shard=8, classes=list(CLASSES) * 10)
    m.pack["split"] = "val"  # what stoker pack records for OUT/val
    m.save(val_dir)
    val = make(val_dir, backend="pil")
    assert not val.train and not val.drop_last and len(val) == 3
    images, labels = run(val)
    assert flat(labels) == list(range(20))  # stored order, every sample once
    reference, _ = run(make(val_dir, backend="pil", train=False))
    assert all(torch.equal(a, b) for a, b in zip(images, reference, strict=True))  # the val transform
    forced = make(val_dir, backend="pil", train=True)  # an explicit train= wins
    assert forced.train and forced.drop_last and len(forced) == 2
    assert make(split, backend="pil").train  # a split whose manifest names none (foreign tars) is trained on
    m.pack["split"] = "train"
    m.save(val_dir)
    assert make(val_dir, backend="pil").train


@needs_dali
def test_dali_and_pil_give_same_order_and_similar_pixels(split):
    for train in (True, False):
        d_images, d_labels = run(make(split, backend="dali", train=train, seed=7), 3)
        p_images, p_labels = run(make(split, backend="pil", train=train, seed=7), 3)
        assert flat(d_labels) == flat(p_labels)
        diff = (torch.cat(d_images).float() - torch.cat(p_images).float()).abs().mean()
        assert diff < 6, diff  # same crop boxes and flips; decoders differ in rounding only


@needs_dali
def test_dali_and_pil_give_the_same_pixels_where_pil_decodes_at_full_scale(split):
    # crop 50: no box (images of 40..96 px) reaches twice it, so pil decodes at full scale, as dali
    # does; both crop, then resize (torchvision's order): the same pixels, edges included
    for train in (True, False):
        d_images, _ = run(make(split, backend="dali", train=train, seed=7, crop=50), 3)
        p_images, _ = run(make(split, backend="pil", train=train, seed=7, crop=50), 3)
        assert max(int((a.int() - b.int()).abs().max()) for a, b in zip(d_images, p_images, strict=True)) <= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_mid_epoch_equals_uninterrupted(split, backend):
    whole_images, whole_labels = run(make(split, backend=backend, seed=1), 4)
    first = make(split, backend=backend, seed=1, threads=1)  # pil: a worker process
    first.set_epoch(4)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    assert state == {
        "seed": 1,
        "epoch": 4,
        "position": 16,
        "world_size": 1,
        "num_samples": 50,
        "batch_size": 8,
        "permutation": 2,  # the global train sequence's version (a state of the older one resumes at epoch starts)
    }
    second = make(split, backend=backend, seed=999)
    second.load_state_dict(state)
    second.set_epoch(4)  # a training loop calls this on resume: it must not restart the epoch
    rest_images, rest_labels = run(second)
    assert flat(rest_labels) == flat(whole_labels[2:])
    for a, b in zip(rest_images, whole_images[2:], strict=True):
        assert torch.equal(a, b)  # same crops: the augmentation is a function of (seed, epoch, sample)
    assert second.position == 48
    assert second.state_dict() == {**state, "epoch": 5, "position": 0}  # the next epoch starts afresh


@needs_dali
def test_abandoned_iteration_then_a_full_epoch_and_the_next(split):
    loader = make(split, backend="dali")
    _, whole = run(make(split, backend="dali"), 0)
    it = iter(loader)
    first = [next(it)[1] for _ in range(3)]
    assert flat(first) == flat(whole[:3])
    again = run(loader)[1]  # a new iteration starts the epoch over (the DALI queue was drained)
    assert flat(again) == flat(whole)
    _, after = run(loader)  # finished epoch, no set_epoch: the next epoch
    assert loader.epoch == 1 and flat(after) == flat(run(make(split, backend="dali"), 1)[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_channels_last_same_values(split, backend):
    a = run(make(split, backend=backend, channels_last=True), 0)[0][0]
    b = run(make(split, backend=backend), 0)[0][0]
    assert a.shape == (8, 3, CROP, CROP) and a.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_val_matches_reference_center_crop(split, backend):
    from PIL import Image

    from stoker.pipeline.shards.samples import SampleIndex

    images, labels = run(make(split, backend=backend, train=False, batch_size=50), 0)
    idx = SampleIndex(split)
    worst = 0.0
    for k in range(0, 50, 7):
        im = Image.open(io.BytesIO(idx.image(k).tobytes())).convert("RGB")
        short = round(CROP / 0.875)
        w, h = im.size
        im = im.resize((round(w * short / min(w, h)), round(h * short / min(w, h))), Image.BILINEAR)
        left, top = (im.size[0] - CROP) // 2, (im.size[1] - CROP) // 2
        ref = torch.from_numpy(np.array(im.crop((left, top, left + CROP, top + CROP)))).permute(2, 0, 1)
        # compare 8x8 means: sub-pixel placement differences of sharp synthetic edges vanish,
        # a wrong region, scale or flip does not
        pool = lambda t: torch.nn.functional.avg_pool2d(t.float()[None], 8)  # noqa: E731
        worst = max(worst, (pool(images[0][k]) - pool(ref)).abs().mean().item())
        off = torch.roll(ref, shifts=CROP // 4, dims=2)
        assert (pool(images[0][k]) - pool(ref)).abs().mean() < (pool(images[0][k]) - pool(off)).abs().mean()
    assert worst < 8, worst


def _shard_of(path, n, spoil=lambda i, data: data):
    """One shard of ``n`` small JPEGs, keys ``s0..``, label = index; ``spoil(i, bytes)`` may damage one."""
    path.mkdir()
    rng = random.Random(0)
    with ShardWriter(path / "a.tar") as w:
        for i in range(n):
            data = encode(draw(CLASSES[i % 6], (48, 40), rng), quality=90)
            w.write(f"s{i}", {"jpg": spoil(i, data), "cls": str(i).encode()})
    Manifest(num_samples=n, classes=[str(i) for i in range(n)], shards=[w.info]).save(path)


def _shards_with_bad_samples(path):
    def spoil(i, data):
        if i == 3:
            return data[: len(data) // 2]  # truncated
        if i == 7:
            return b"<html>not found</html>" * 4  # foreign bytes
        return data

    _shard_of(path, 12, spoil)


@pytest.mark.parametrize("backend", BACKENDS)
def test_undecodable_samples_are_skipped_and_counted(tmp_path, backend):
    _shards_with_bad_samples(tmp_path / "bad")
    loader = make(tmp_path / "bad", backend=backend, batch_size=4, drop_last=False)
    with pytest.warns(RuntimeWarning, match="skipped 2 undecodable"):
        _, labels = run(loader, 0)
    assert sorted(flat(labels)) == [0, 1, 2, 4, 5, 6, 8, 9, 10, 11]
    assert loader.skipped == 2 and loader.position == 12


def test_manifest_problems_are_named_before_the_first_batch(split):
    shard = split / "shard-000002.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[:-512])
    with pytest.raises(ManifestError, match="shard-000002.tar"):
        make(split)
    shard.write_bytes(data[:1000] + bytes([data[1000] ^ 1]) + data[1001:])  # same size, one bit
    make(split)  # size check passes
    with pytest.raises(ManifestError, match="shard-000002.tar.*sha256"):
        make(split, sha256=True)
    shard.unlink()
    with pytest.raises(ManifestError, match="shard-000002.tar is missing"):
        make(split)


def test_bad_arguments_are_named(split):
    for kw, word in [
        ({"batch_size": 0}, "batch_size=0"),
        ({"backend": "tf"}, "backend='tf'"),
        ({"backend": "dali", "decode": "gpu"}, "moved: pass backend=Dali"),
        ({"device": "tpu"}, "device='tpu'"),
        ({"rank": 2, "world_size": 2}, "rank=2"),
        ({"crop": -1}, "crop=-1"),
    ]:
        with pytest.raises(ValueError, match=word.replace("(", r"\(")):
            Loader(split, **{"batch_size": 8, **kw})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="mixed"):
            Loader(split, batch_size=8, backend=Auto(decode="mixed"))
        with pytest.raises(ValueError, match="CUDA"):
            Loader(split, batch_size=8, device="cuda")
    loader = make(split)
    with pytest.raises(ValueError, match=r"state\['world_size'\]=0 must be a positive integer"):
        loader.load_state_dict({"seed": 0, "epoch": 0, "position": 0, "world_size": 0, "num_samples": 50})
    with pytest.raises(ValueError, match="offset"):
        loader.load_state_dict({"seed": 0, "epoch": 0, "position": 0, "offset": 51, "num_samples": 50})


@needs_dali
def test_memory_flat_over_epochs(split):
    import resource

    loader = make(split, backend="dali", batch_size=16)
    for e in range(3):
        run(loader, e)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for e in range(3, 12):
        run(loader, e)
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 64 * 1024, grown_kb


@pytest.mark.gpu
def test_mixed_decode_on_gpu(split):
    pytest.importorskip("nvidia.dali", reason="DALI's mixed decode needs DALI")
    loader = make(split, backend=Dali(decode="mixed"), device="cuda")
    images, labels = run(loader, 0)
    assert images[0].device.type == "cuda" and labels[0].device.type == "cuda"
    assert images[0].shape == (8, 3, CROP, CROP) and images[0].dtype == torch.uint8
    cpu_images, cpu_labels = run(make(split, backend=Dali(decode="cpu")), 0)
    assert flat(labels) == flat(cpu_labels)
    diff = (images[0].cpu().float() - cpu_images[0].float()).abs().mean()
    assert diff < 8


EXIT_SCRIPT = """
import gc, sys, threading
from stoker.pipeline import Loader

split, mode = sys.argv[1], sys.argv[2]
loader = Loader(split, batch_size=4, crop=16, backend="dali", threads=1, prefetch=3)
if mode == "break":  # abandoned mid-epoch, still referenced when the interpreter exits
    for i, (x, y) in enumerate(loader):
        if i == 1:
            break
elif mode == "drop":  # the iterator is dropped: its producer thread must stop at once
    it = iter(loader)
    next(it)
    del it
    print(sum(t.name == "stoker-loader" for t in threading.enumerate()))
elif mode == "torn":  # DALI's pipelines torn down first (its atexit hook), the iterator dropped after
    from nvidia.dali import pipeline

    it = iter(loader)
    next(it)
    pipeline._shutdown_pipelines()
    del it
    gc.collect()
    print(sum(t.name == "stoker-loader" for t in threading.enumerate()))
"""


@needs_dali
@pytest.mark.parametrize("mode", ["break", "drop", "torn"])
def test_abandoned_dali_iteration_exits_without_tracebacks(split, tmp_path, mode):
    import subprocess
    import sys

    script = tmp_path / "exit_check.py"
    script.write_text(EXIT_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(split), mode], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr[-3000:]
    if mode != "break":
        assert proc.stdout.split() == ["0"], proc.stdout  # no producer thread left running


def _garble(split, positions):
    """Overwrite the image bytes of ``positions`` with garbage of the same size: the manifest's
    size check passes, the header guard fails."""
    from stoker.pipeline.shards.samples import SampleIndex

    idx = SampleIndex(split)
    for i in positions:
        path, off, size = idx.shard_path(int(i)), int(idx.img_off[i]), int(idx.img_size[i])
        idx.close()
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(bytes(range(256)) * (size // 256) + bytes(size % 256))


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_with_no_loadable_sample_keeps_len_exact(split, backend):
    val = make(split, backend=backend, train=False)
    train = [make(split, backend=backend, rank=r, world_size=2, seed=3) for r in range(2)]
    train[0].set_epoch(2)
    garbled = list(range(8, 16)) + train[0].indices()[8:16].tolist()  # val batch 1, rank 0's train batch 1
    _garble(split, garbled)
    with pytest.warns(RuntimeWarning, match="skipped"):
        _, labels = run(val)
    assert len(labels) == len(val) == 7 and len(labels[1]) == 0  # an empty batch in its place
    assert flat(labels) == [i for i in range(50) if i not in garbled]  # the rest exactly once
    assert val.position == 50
    steps = []
    for ld in train:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _, labels = run(ld, 2)
        steps.append(len(labels))
        assert all(len(y) > 0 for y in labels)  # train: never an empty batch
        if ld is train[0]:
            assert len(labels[1]) == 8  # the garbled batch: stand-ins from the rank's order
        assert not set(flat(labels)) & set(garbled)
    assert steps == [len(train[0]), len(train[1])] == [3, 3]  # both ranks take the same steps
    assert train[0].skipped >= 8


@needs_dali
def test_dali_decode_failure_is_one_line_naming_shard_and_keys(tmp_path):
    def spoil(i, data):
        if i == 5:  # headers intact (passes the guard), the scan names a component that does not exist
            data = bytearray(data)
            data[data.find(b"\xff\xda") + 5] = 0x77
        return bytes(data)

    path = tmp_path / "scan"
    _shard_of(path, 8, spoil)
    loader = make(path, backend="dali", train=False, batch_size=4)
    with pytest.raises(RuntimeError) as info:
        run(loader)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert "a.tar" in msg and "keys s4, s5, s6, s7" in msg and "key s5 does not decode" in msg, msg
    assert "stoker verify" in msg and "stoker index" in msg, msg


@pytest.mark.parametrize("backend, threads", [("pil", 0), ("pil", 1)] + ([("dali", 1)] if HAS_DALI else []))
def test_a_label_outside_the_classes_is_one_line_naming_shard_and_key(tmp_path, backend, threads):
    _shard_of(tmp_path / "lbl", 6)
    Manifest(
        num_samples=6,
        classes=["a", "b", "c", "d", "e"],  # sample s5's cls 5 is outside
        shards=Manifest.load(tmp_path / "lbl").shards,
    ).save(tmp_path / "lbl")
    loader = make(tmp_path / "lbl", backend=backend, threads=threads, batch_size=6, train=False)
    with pytest.raises(TargetError) as err:
        run(loader)
    message = str(err.value)
    assert "\n" not in message and "a.tar" in message and "s5" in message


def test_backend_choice_is_explained_and_nvjpeg_needs_a_gpu(split):
    loader = make(split, backend="auto")
    assert loader.backend == ("dali" if HAS_DALI else "pil") and loader.backend_reason
    assert make(split, backend="pil").backend_reason == "requested"
    with pytest.raises(ValueError, match="backend='nvjpeg' decodes on the GPU but the device is the CPU"):
        make(split, backend="nvjpeg")


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_shuffle_windows_ranks_and_resume(split, backend):
    """shuffle='block' on a local split: the same order functions as from a URL."""
    seen = []
    for rank in range(2):
        loader = make(split, backend=backend, shuffle="block", block_shards=2, rank=rank, world_size=2, seed=3)
        _, labels = run(loader, 2)
        got = flat(labels)
        assert len(labels) == len(loader) == 3 and got == loader.indices().tolist()[:24]  # drop_last
        seen.append(got)
    assert not set(seen[0]) & set(seen[1]) and len(seen[0]) == len(seen[1]) == 24
    # one shard per window: the epoch is the shards in a permuted order, each one permuted inside
    first = make(split, backend=backend, shuffle="block", block_shards=1, seed=3, drop_last=False)
    _, labels = run(first, 1)
    got = flat(labels)
    shards = [v // 16 for v in got]
    runs = [s for k, s in enumerate(shards) if k == 0 or s != shards[k - 1]]
    assert runs == [3, 1, 2, 0] and sorted(got) == list(range(50))  # the shard order of (seed 3, epoch 1)
    assert got != sorted(got)
    part = make(split, backend=backend, shuffle="block", block_shards=1, seed=3, drop_last=False)
    part.set_epoch(1)
    it = iter(part)
    head = flat([next(it)[1] for _ in range(3)])
    resumed = make(split, backend=backend, shuffle="block", block_shards=1, seed=3, drop_last=False)
    resumed.load_state_dict(part.state_dict())
    assert head + flat(run(resumed)[1]) == got
    val = [
        flat(run(make(split, backend=backend, train=False, shuffle="block", rank=r, world_size=3))[1]) for r in range(3)
    ]
    assert sum(val, []) == list(range(50))  # stored order, contiguous pieces, each sample once
