import pytest
import torch

from stoker.model import InceptionNet, build_model, count_parameters
from stoker.model.case_study import ReportNet


def test_inception_net_is_small_and_takes_any_size():
    torch.manual_seed(0)
    net = InceptionNet(num_classes=1000).eval()
    assert count_parameters(net) < 1_000_000
    with torch.no_grad():
        for side in (32, 57, 224):
            assert net(torch.randn(1, 3, side, side)).shape == (1, 1000)
        assert net(torch.randn(2, 3, 5, 9)).shape == (2, 1000)  # even tiny, non-square inputs


def test_inception_net_without_stem_is_the_report_block():
    net = InceptionNet(num_classes=1, stem=False)
    report = ReportNet()
    assert count_parameters(net.block) == count_parameters(report.block) == 496_769 - 301_057
    assert net.block.branch_3x3dbl[2][0].out_channels == 96


def test_report_net_parameter_count():
    net = ReportNet()
    assert count_parameters(net) == 496_769
    assert count_parameters(net.fc) == 301_057
    assert net.fc.in_features == 384 * 28 * 28 == 301_056
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(c.bias is None for c in convs)


def test_report_net_shapes():
    net = ReportNet(image_size=32).eval()
    with torch.no_grad():
        feats = net.pool(net.block(torch.randn(1, 3, 32, 32)))
        assert feats.shape == (1, 384, 4, 4)
        assert net(torch.randn(1, 3, 32, 32)).shape == (1, 1)
    with pytest.raises(ValueError, match="needs 32x32"):
        net(torch.randn(1, 3, 40, 40))


def test_build_model_names():
    assert isinstance(build_model("inception", 10), InceptionNet)
    assert count_parameters(build_model("report", 1)) == 496_769
    r18 = build_model("resnet18", 7)
    assert r18.fc.out_features == 7
    assert count_parameters(build_model("resnet18", 7)) == count_parameters(r18)


def test_build_model_random_init_differs_per_seed():
    torch.manual_seed(1)
    a = build_model("resnet18", 3).conv1.weight.clone()
    torch.manual_seed(2)
    b = build_model("resnet18", 3).conv1.weight
    assert not torch.equal(a, b)


def test_build_model_unknown_lists_choices():
    with pytest.raises(ValueError) as e:
        build_model("resnet5O", 3)
    msg = str(e.value)
    assert "'resnet5O'" in msg and "did you mean resnet50" in msg and "\n" not in msg
    with pytest.raises(ValueError) as e:  # nothing close: a few of the names, and where the rest are
        build_model("qqqqqq", 3)
    msg = str(e.value)
    assert "'qqqqqq'" in msg and "inception" in msg and "\n" not in msg
