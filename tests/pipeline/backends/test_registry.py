"""The backend registry: each backend describes itself; the Loader, the CLI choices and the
benchmark rows all ask it; a backend from outside the package runs through the Loader and train."""

import contextlib
import io
import json

import pytest
import torch

from helpers import write_split
from stoker.pipeline import Loader
from stoker.pipeline.backends import Backend, backend_names, backends, get_backend, register_backend, registry


class CountingRunner:
    """A backend's runner from outside the package: pillow's runner, counting the batches it made."""

    made = 0

    def __init__(self, settings, *, scale_by=1):
        from stoker.pipeline.backends.pil import PilRunner

        self.inner, self.scale_by = PilRunner(settings), scale_by

    def iterate(self, batches, epoch, seed):
        for batch in self.inner.iterate(batches, epoch, seed):
            CountingRunner.made += 1
            yield batch._replace(images=batch.images // self.scale_by)

    def close(self):
        self.inner.close()


class CountingBackend(Backend):
    name, where, priority = "counting", ("cpu",), 90
    summary = "pillow, counted (a test's backend)"
    option_names = ("scale_by",)

    def runner_class(self):
        return CountingRunner


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY.copy())  # undone after the test
    register_backend(CountingBackend)
    CountingRunner.made = 0
    return CountingBackend


def test_the_builtin_backends_describe_themselves():
    names = [b.name for b in backends()]
    assert names == ["dali", "nvjpeg", "pil"] and backend_names() == ("auto", *names)
    where = {b.name: b.where for b in backends()}
    assert where == {"dali": ("cpu", "gpu"), "nvjpeg": ("gpu",), "pil": ("cpu",)}
    assert get_backend("pil").available("cpu") == (True, "")
    assert get_backend("nvjpeg").available("cpu") == (False, "the device is the CPU")
    with pytest.raises(ValueError, match="backend 'nvjpeg' has no option 'overlapp'"):
        get_backend("nvjpeg", overlapp=False)
    assert get_backend("nvjpeg", overlap=False).with_options(region=False).options == {
        "overlap": False,
        "region": False,
    }
    with pytest.raises(ValueError, match="already registered"):
        register_backend(type("Other", (Backend,), {"name": "pil"}))
    with pytest.raises(ValueError, match="not a Backend subclass"):
        register_backend(type("Nameless", (Backend,), {}))


def test_a_backend_from_outside_runs_through_the_loader_and_train(registered, tmp_path):
    root = tmp_path / "data"
    write_split(root / "train", num_samples=32, samples_per_shard=16)
    write_split(root / "val", num_samples=8, samples_per_shard=8, seed=1)
    assert "counting" in backend_names()
    with Loader(root / "train", batch_size=8, crop=32, backend="counting", threads=1) as mine:
        with Loader(root / "train", batch_size=8, crop=32, backend="pil", threads=1) as pil:
            assert mine.backend == "counting" and mine.backend_reason == "requested"
            for (a, ya), (b, yb) in zip(mine, pil, strict=True):
                assert torch.equal(a, b) and torch.equal(ya, yb)
    assert CountingRunner.made == 4
    # configured: its options reach its runner
    with Loader(root / "train", batch_size=8, crop=32, backend=get_backend("counting", scale_by=2), threads=1) as half:
        assert int(next(iter(half))[0].max()) <= 127
    # the CLI's --backend choices come from the registry
    from stoker.tools.cli import main as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = cli(
            ["train", str(root), "--out", str(tmp_path / "run"), "--backend", "counting", "--epochs", "1"]
            + ["--batch-size", "8", "--crop", "32", "--no-progress", "--json", "--threads", "1"]
        )
    assert rc == 0 and json.loads(out.getvalue())["steps"] == 4
    assert CountingRunner.made > 5  # train and val batches came through it


def test_auto_never_picks_a_backend_that_cannot_run_and_says_why(registered, monkeypatch):
    from stoker.pipeline import deps

    monkeypatch.setattr(deps, "HAS_DALI", False)
    chosen, why = registry.resolve_backend("auto", "cpu")
    assert chosen.name == "pil" and why == "nvidia-dali is not installed; the device is the CPU"
    with pytest.raises(ValueError, match=r"must be one of \('auto', 'dali', 'nvjpeg', 'pil', 'counting'\)"):
        registry.resolve_backend("nope", "cpu")
