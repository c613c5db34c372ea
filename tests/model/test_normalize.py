import pytest
import torch
from torchvision.transforms import Normalize as TVNormalize

from stoker.model import IMAGENET_MEAN, IMAGENET_STD, Normalize, with_normalize
from stoker.model.normalize import has_normalize


def _batch(n=2, side=17, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=g)


def test_matches_torchvision_normalize():
    x = _batch()
    ours = Normalize()(x)
    ref = TVNormalize(IMAGENET_MEAN, IMAGENET_STD)(x.float() / 255)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_custom_stats_and_buffers_follow_state_dict():
    n = Normalize(mean=(0.5, 0.25, 0.0), std=(0.5, 0.5, 1.0))
    x = _batch(side=5)
    torch.testing.assert_close(n(x), TVNormalize((0.5, 0.25, 0.0), (0.5, 0.5, 1.0))(x.float() / 255))
    sd = n.state_dict()
    assert set(sd) == {"mean", "std"}
    torch.testing.assert_close(sd["mean"].flatten(), torch.tensor([127.5, 63.75, 0.0]))


def test_keeps_channels_last():
    x = _batch(side=9).contiguous(memory_format=torch.channels_last)
    y = Normalize()(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert not y.is_contiguous()


def test_returns_autocast_dtype_under_autocast():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = Normalize()(_batch())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), Normalize()(_batch()), rtol=1e-2, atol=1e-2)


def test_with_normalize_takes_uint8():
    net = torch.nn.Conv2d(3, 4, 1)
    model = with_normalize(net)
    assert has_normalize(model) and not has_normalize(net)
    x = _batch()
    torch.testing.assert_close(
        model(x), net(TVNormalize(IMAGENET_MEAN, IMAGENET_STD)(x.float() / 255)), rtol=1e-5, atol=1e-5
    )
    assert "net.weight" in model.state_dict()


@pytest.mark.parametrize("kw", [dict(std=(0.2, 0.0, 0.2)), dict(mean=(0.5, 0.5), std=(0.2, 0.2, 0.2))])
def test_bad_stats_rejected(kw):
    with pytest.raises(ValueError, match="std"):
        Normalize(**kw)


def test_wrong_channels_rejected():
    with pytest.raises(ValueError, match="expects an N x 3"):
        Normalize()(torch.zeros(1, 4, 2, 2, dtype=torch.uint8))


def test_the_wrapper_keeps_timms_parameter_groups():
    timm = pytest.importorskip("timm")
    from timm.optim import create_optimizer_v2

    from stoker.model import load_bare_weights

    def vit():
        torch.manual_seed(0)
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=32, patch_size=8)

    bare, model = vit(), with_normalize(vit())
    assert bare.no_weight_decay() and model.no_weight_decay() == {f"net.{n}" for n in bare.no_weight_decay()}
    names = dict(model.named_parameters())
    assert "net.pos_embed" in names and "net.cls_token" in names
    # weight decay: pos_embed / cls_token in the no-decay group, exactly as for the bare model
    groups = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05).param_groups
    no_decay = {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]}
    assert id(names["net.pos_embed"]) in no_decay and id(names["net.cls_token"]) in no_decay
    # layer decay: one group per block depth (as for the bare model), not one group for all
    layered = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.75).param_groups
    bare_layered = create_optimizer_v2(bare, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.75).param_groups
    assert len(layered) == len(bare_layered) > 4
    assert sorted(g["lr_scale"] for g in layered) == sorted(g["lr_scale"] for g in bare_layered)
    # other attributes of the network answer through the wrapper; the checkpoint loads into a bare one
    assert model.num_classes == 3 and model.get_classifier() is model.net.head
    again = load_bare_weights(vit(), {"state_dict": model.state_dict()})
    assert all(
        torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.net.state_dict().values(), strict=True)
    )
    with pytest.raises(AttributeError):
        model.no_such_attribute  # noqa: B018


@pytest.mark.parametrize(
    "net",
    [
        torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()),
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4)),
        torch.nn.Sequential(torch.nn.BatchNorm2d(3), torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4)),
    ],
)
def test_a_network_without_normalize_given_uint8_is_one_line_naming_with_normalize(net):
    from stoker.errors import UsageError
    from stoker.model.train import evaluate, resolve_amp
    from stoker.model.train.step import TrainStep
    from stoker.model.train.tasks import resolve_task
    from stoker.pipeline.shards.targets import Target

    x, y = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8), torch.tensor([0, 1])
    off = resolve_amp("off", "cpu")

    def train_step(model):
        return TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.cross_entropy, amp=off)

    step = train_step(net)
    for run in (
        lambda: step(x, y),  # stoker train's and diagnose's step
        lambda: evaluate(  # stoker train's val pass and stoker eval's
            net,
            [(x, y)],
            device=torch.device("cpu"),
            amp=off,
            task=resolve_task("classify", Target(), ["a", "b", "c", "d"]),
        ),
    ):
        with pytest.raises(UsageError) as e:
            run()
        line = str(e.value)
        assert line.startswith("the network got a uint8 batch, the Loader's, with no Normalize in front (")
        assert line.endswith(
            "wrap it with stoker.model.with_normalize(net), which turns uint8 into normalized floats on the device"
        )
        assert "\n" not in line
    assert step(x.float(), y).isfinite()  # floats, or the same net wrapped: no complaint
    assert train_step(with_normalize(net))(x, y).isfinite()
