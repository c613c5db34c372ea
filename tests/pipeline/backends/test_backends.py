"""The one backend interface (pipeline/backends/): each runner, made from its Loader's settings, turns
batches of sample positions into named ``Batch``es; the Loader still hands users 2-tuples."""

import numpy as np
import pytest
import torch

from helpers import write_split
from stoker.pipeline import Loader
from stoker.pipeline.backends import runner_class
from stoker.pipeline.backends.base import Batch
from stoker.pipeline.deps import HAS_DALI
from stoker.tools.common.synth import CLASSES

# torchvision 0.29 deprecates its image decoders in favour of TorchCodec (the nvjpeg backend's note)
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")

BACKENDS = ["pil", "nvjpeg"] + (["dali"] if HAS_DALI else [])


@pytest.fixture
def split(tmp_path):
    """20 samples in 3 shards; label = global position."""
    path = tmp_path / "train"
    write_split(path, num_samples=20, samples_per_shard=8, classes=list(CLASSES) * 10)
    return path


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_runner_yields_named_batches_of_the_planned_samples(split, backend, train):
    # nvjpeg decodes on the GPU in a Loader; its runner runs here with torchvision's CPU decode
    loader = Loader(
        split, batch_size=8, crop=32, train=train, threads=1, backend="pil" if backend == "nvjpeg" else backend
    )
    runner = runner_class(backend)(loader.decode_settings())
    batches = [np.array([3, 0, 17], np.int64), np.array([12, 5], np.int64)]
    out = list(runner.iterate(batches, 0, loader.seed))
    runner.close()
    assert [type(b) for b in out] == [Batch, Batch]
    assert [(b.consumed, b.skipped) for b in out] == [(3, 0), (2, 0)]
    assert [b.targets.tolist() for b in out] == [[3, 0, 17], [12, 5]]
    assert [tuple(b.images.shape) for b in out] == [(3, 3, 32, 32), (2, 3, 32, 32)]
    assert all(b.images.dtype == torch.uint8 and b.targets.dtype == torch.int64 for b in out)
    loader.close()


def test_the_loader_still_yields_images_labels_tuples(split):
    with Loader(split, batch_size=8, crop=32, train=False, backend="pil", threads=0) as loader:
        first = next(iter(loader))
        assert type(first) is tuple and len(first) == 2
        assert first[1].tolist() == list(range(8))


def test_runner_class_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend='auto' must be one of 'dali', 'nvjpeg', 'pil'"):
        runner_class("auto")


def test_the_exit_hook_stops_a_pil_loaders_workers_left_mid_epoch(split):
    # stoker's exit hook runs before torch's, which (pinned memory, some torch versions) waits 5 s
    # per worker: 80 s at exit with 16 workers on an H200 (torch 2.11)
    import multiprocessing

    from stoker.pipeline.backends import producer

    before = set(multiprocessing.active_children())
    loader = Loader(split, batch_size=4, crop=32, backend="pil", threads=2)
    it = iter(loader)
    next(it)  # left mid-epoch, still referenced
    workers = set(multiprocessing.active_children()) - before
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    producer._shutdown_runners()  # what the interpreter's exit runs
    assert not any(w.is_alive() for w in workers)
    loader.close()


def test_the_pil_path_raises_a_bug_instead_of_skipping_every_sample(tmp_path, monkeypatch):
    # A pillow API change once made every sample "undecodable" on stock Pillow 13 (skipped and
    # counted, an empty epoch): only what a damaged image raises may drop a sample.
    from stoker.pipeline.backends import pil

    write_split(tmp_path / "train", num_samples=8, samples_per_shard=8)
    with Loader(tmp_path / "train", batch_size=4, crop=32, backend="pil", threads=0) as loader:
        assert sum(len(y) for _, y in loader) == 8 and loader.skipped == 0

        def broken(*args, **kwargs):
            raise TypeError("function takes exactly 2 arguments (1 given)")

        monkeypatch.setattr(pil, "resize_into", broken)
        with pytest.raises(TypeError, match="exactly 2 arguments"):
            next(iter(loader))
    from stoker.pipeline.imagedecode import DAMAGED_INPUT

    assert OSError in DAMAGED_INPUT and TypeError not in DAMAGED_INPUT
