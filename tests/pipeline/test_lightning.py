"""PyTorch Lightning over stoker Loaders: exact epochs (issue 13), the sanity check, DDP."""

import importlib.util
import json
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn

from helpers import run_in_group, write_split
from stoker.model import with_normalize
from stoker.pipeline.deps import HAS_DALI
from stoker.tools.common.synth import CLASSES

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pytorch_lightning") is None, reason="needs stoker[lightning] (pytorch-lightning)"
)
pl = StokerDataModule = Counting = None  # imported as the first test runs: _lightning, below


@pytest.fixture(scope="module", autouse=True)
def _lightning():
    """pytorch_lightning (with torchmetrics, 4 s) imported when this module's first test runs,
    not in every test process that collects it."""
    global pl, StokerDataModule, Counting
    import pytorch_lightning as pl

    from stoker.pipeline.lightning import StokerDataModule

    Counting = _counting_module(pl)


BACKENDS = ["pil"] + (["dali"] if HAS_DALI else [])
UNIQUE = list(CLASSES) * 20  # 120 classes: sample i has label i, so labels name samples
CROP = 24
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def make_root(tmp_path, train=43, val=21):
    root = tmp_path / "data"
    write_split(root / "train", num_samples=train, samples_per_shard=16, classes=UNIQUE)
    write_split(root / "val", num_samples=val, samples_per_shard=16, classes=UNIQUE, seed=1)
    return root


def _counting_module(pl):
    class Counting(pl.LightningModule):
        """Records the labels (= sample positions) every step sees, per epoch."""

        def __init__(self):
            super().__init__()
            self.net = with_normalize(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, len(UNIQUE))))
            self.train_seen: dict = {}
            self.val_seen: dict = {}
            self.sanity_seen: list = []

        def training_step(self, batch, _):
            x, y = batch
            assert x.dtype == torch.uint8 and x.shape[1:] == (3, CROP, CROP)
            self.train_seen.setdefault(self.current_epoch, []).append(y.tolist())
            return nn.functional.cross_entropy(self.net(x), y)

        def validation_step(self, batch, _):
            x, y = batch
            if self.trainer.sanity_checking:
                self.sanity_seen.append(y.tolist())
            else:
                self.val_seen.setdefault(self.current_epoch, []).extend(y.tolist())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Counting


@pytest.mark.parametrize("backend", BACKENDS)
def test_fit_three_epochs_exact(tmp_path, backend):
    root = make_root(tmp_path)
    dm = StokerDataModule(root, batch_size=8, crop=CROP, backend=backend, threads=0 if backend == "pil" else 1)
    module = Counting()
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", devices=1, num_sanity_val_steps=2, **QUIET)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=dm)
    about_loading = [
        str(w.message)
        for w in caught
        if any(k in str(w.message) for k in ("sampler", "Sampler", "shuffl", "num_workers"))
    ]
    assert about_loading == []  # no sampler injection, no DataLoader advice for a Loader

    assert [len(b) for b in module.sanity_seen] == [8, 8]  # the sanity check: 2 batches, abandoned
    orders = []
    for epoch in range(3):
        batches = module.train_seen[epoch]
        assert len(batches) == 5 and all(len(b) == 8 for b in batches)  # len(loader) steps of 8 (drop_last)
        flat = [s for b in batches for s in b]
        assert len(set(flat)) == 40 and set(flat) <= set(range(43))
        orders.append(flat)
        assert sorted(module.val_seen[epoch]) == list(range(21))  # every val sample, every epoch
    assert orders[0] != orders[1] != orders[2] != orders[0]  # reshuffled without set_epoch by the user
    assert trainer.global_step == 15
    assert dm._loaders == {}  # closed by teardown


def test_limit_train_batches_next_epoch_starts_fresh(tmp_path):
    """An epoch cut short by limit_train_batches: the next one is that epoch's first batches
    (Lightning sets the next epoch), not the rest of the cut one."""
    root = make_root(tmp_path)
    dm = StokerDataModule(root, batch_size=8, crop=CROP, backend="pil", threads=0)
    module = Counting()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, limit_train_batches=2, **QUIET)
    trainer.fit(module, datamodule=dm)
    loader = dm._loader("train", train=True, batch_size=8)  # a fresh one: same seed, same orders
    for epoch in (0, 1):
        assert module.train_seen[epoch] == [loader.indices(epoch)[s : s + 8].tolist() for s in (0, 8)]
        assert sorted(module.val_seen[epoch]) == list(range(21))


def test_datamodule_surface(tmp_path):
    root = make_root(tmp_path)
    dm = StokerDataModule(root, batch_size=8, crop=CROP, backend="pil", threads=0)
    assert dm.num_classes == len(UNIQUE) and dm.classes[:2] == list(CLASSES[:2])
    train = dm.train_dataloader()
    assert train is dm.train_dataloader()  # one Loader per split for the whole fit
    assert (train.rank, train.world_size, train.train, len(train)) == (0, 1, True, 5)
    val = dm.val_dataloader()
    assert (val.train, len(val), len(val.dataset)) == (False, 3, 21)
    assert StokerDataModule(root, batch_size=8, val_split=None).val_dataloader() == []
    with pytest.raises(ValueError, match="sets rank= itself"):
        StokerDataModule(root, batch_size=8, rank=1)
    dm.teardown("fit")
    assert train._closed and val._closed


def test_missing_lightning_is_one_line(tmp_path):
    code = textwrap.dedent("""
        import sys
        sys.modules["pytorch_lightning"] = None; sys.modules["lightning"] = None
        sys.modules["lightning.pytorch"] = None
        from stoker.errors import StokerError
        try:
            import stoker.pipeline.lightning
        except ImportError as e:
            print(type(e).__name__, isinstance(e, StokerError), e)
    """)
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.stdout.strip() == (
        "MissingExtraError True stoker.pipeline.lightning needs PyTorch Lightning: "
        "pip install stoker[lightning] (or pip install pytorch-lightning)"
    )


def test_lightning_recipe_runs(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "lightning_recipe.py"
    spec = importlib.util.spec_from_file_location("stoker_example_lightning_recipe", path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    root = make_root(tmp_path, train=30, val=13)
    summary = recipe.main(
        [str(root), "--accelerator", "cpu", "--devices", "1", "--epochs", "2", "--crop", "32", "--batch-size", "8"]
    )
    assert summary["global_step"] == 6  # 2 epochs x len(train) = 30 // 8
    assert 0.0 <= summary["val_acc"] <= 1.0


DDP_SCRIPT = textwrap.dedent("""
    import json, sys
    import pytorch_lightning as pl
    import torch
    from torch import nn
    from stoker.model import with_normalize
    from stoker.pipeline.lightning import StokerDataModule

    root, out = sys.argv[1], sys.argv[2]

    class Counting(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = with_normalize(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 4)))
            self.seen = {"train": {}, "val": {}, "sanity": []}

        def training_step(self, batch, _):
            x, y = batch
            self.seen["train"].setdefault(self.current_epoch, []).append(y.tolist())
            return nn.functional.cross_entropy(self.net(x), y % 4)

        def validation_step(self, batch, _):
            if self.trainer.sanity_checking:
                self.seen["sanity"].append(batch[1].tolist())
            else:
                self.seen["val"].setdefault(self.current_epoch, []).extend(batch[1].tolist())
            # a real run logs an epoch metric synced over ranks (one collective per epoch)
            self.log("val_n", float(len(batch[1])), reduce_fx="sum", sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    dm = StokerDataModule(root, batch_size=4, crop=24, backend="pil", threads=0)
    module = Counting()
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", devices=2, strategy="ddp", num_sanity_val_steps=2,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    loader = dm._loader("train", train=True, batch_size=4)
    module.seen.update(rank=trainer.global_rank, world=loader.world_size, len=len(loader),
                       steps=trainer.global_step, val_n=float(trainer.callback_metrics["val_n"]))
    with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
        json.dump(module.seen, f)
""")


@pytest.mark.slow
def test_ddp_two_processes_exact_epochs(tmp_path, fast_launchers):
    """strategy="ddp" (gloo, 2 CPU processes): train shares disjoint and reshuffled every epoch,
    val summed over ranks = the split, every epoch, after the sanity check. 17 val samples:
    rank 0 evaluates 3 batches, rank 1 2 (which the sanity check's 2 batches use up)."""
    root = make_root(tmp_path, train=43, val=17)
    script = tmp_path / "fit_ddp.py"
    script.write_text(DDP_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    res = run_in_group([sys.executable, str(script), str(root), str(out)], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    assert [r["len"] for r in ranks] == [5, 5]  # 43 samples: 21 per rank, 5 batches of 4
    assert [r["steps"] for r in ranks] == [15, 15]
    assert [r["val_n"] for r in ranks] == [17.0, 17.0]  # the synced epoch metric counts the split once
    previous = None
    for epoch in map(str, range(3)):
        per_rank = [r["train"][epoch] for r in ranks]
        assert [[len(b) for b in batches] for batches in per_rank] == [[4] * 5] * 2
        shares = [{s for b in batches for s in b} for batches in per_rank]
        assert len(shares[0]) == len(shares[1]) == 20 and not shares[0] & shares[1]  # disjoint
        assert previous is None or shares != previous  # a fresh split every epoch
        previous = shares
        val = [r["val"][epoch] for r in ranks]
        assert sorted(val[0] + val[1]) == list(range(17))  # every val sample exactly once
    assert sorted(len(r["val"]["0"]) for r in ranks) == [8, 9]
    assert all(len(r["sanity"]) == 2 for r in ranks)


def test_the_datamodule_serves_a_mask_split_with_its_target(tmp_path):
    from stoker.tools.common.synth import make_segmentation_tree
    from stoker.tools.pack import Masks, pack

    images, masks = make_segmentation_tree(tmp_path / "src", n=10, seed=2, min_side=40, max_side=60)
    pack(images, tmp_path / "data", masks=Masks(masks, num_classes=4), val_fraction=0.2, workers=1)
    dm = StokerDataModule(tmp_path / "data", batch_size=4, crop=32, backend="pil", threads=0, augment="ta_wide")
    assert dm.target.kind == "mask" and dm.num_classes == 4
    x, m = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.uint8 and m.shape == (4, 32, 32) and m.dtype == torch.uint8
    vx, vm = next(iter(dm.val_dataloader()))
    assert vm.shape[1:] == (32, 32)
