import json

import pytest
import torch
from torch import nn

from stoker.model.audit import audit_model


def report_net() -> nn.Module:
    """The original slow network: inception block + MaxPool + flatten + Linear(301056, 1)."""
    from stoker.model.nets import build_model

    return build_model("report", num_classes=1)


def test_report_network_linear_is_flagged_with_its_share():
    a = audit_model(report_net(), input_size=(3, 224, 224))
    assert a.total_params == 496_769
    assert a.dominant is not None
    assert a.dominant.kind == "Linear"
    assert a.dominant.params == 301_057
    assert f"{a.dominant.param_share:.0%}" == "61%"
    assert a.flatten_head
    assert a.layers[0] is a.dominant
    assert "holds most parameters" in a.format_table()
    # FLOPs: the convs do the work, the huge Linear almost none (2 * 301056 per image).
    assert a.dominant.flops == 2 * 301_056
    assert a.flops_per_image > 1e9
    assert a.heaviest(1)[0].kind == "Conv2d"
    # Its block runs at the full 224x224: nearly all the work, where a stem would cut 16x.
    assert a.full_res_flop_share > 0.99
    assert a.heaviest(1)[0].out_shape == [96, 224, 224]


def test_downsampled_network_has_no_full_resolution_work():
    from stoker.model.nets import build_model

    a = audit_model(build_model("inception", 10), input_size=(3, 64, 64))
    assert a.full_res_flop_share == 0.0


def test_params_add_up_and_shared_weights_count_once():
    lin = nn.Linear(10, 10)
    net = nn.Sequential(lin, nn.ReLU(), lin, nn.Linear(10, 2))
    a = audit_model(net, input_size=(10,))
    assert a.total_params == 110 + 22 == sum(p.numel() for p in net.parameters())
    assert sum(la.params for la in a.layers) == a.total_params
    assert a.dominant.name == "0" and a.dominant.params == 110
    assert not a.flatten_head  # a small Linear is not a flatten head
    # Both calls of the shared Linear and the head: 2 * (100 + 100 + 20).
    assert a.flops_per_image == 2 * (100 + 100 + 20)


def test_no_dominant_layer_in_a_balanced_model():
    import torchvision

    a = audit_model(torchvision.models.resnet18(), input_size=(3, 64, 64))
    assert a.dominant is None and not a.flatten_head
    assert a.flop_method == "meta"
    assert a.total_params == sum(p.numel() for p in torchvision.models.resnet18().parameters())


def test_model_left_untouched():
    net = report_net().train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    audit_model(net, input_size=(3, 224, 224))
    assert net.training
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(v.device.type == "cpu" for v in after.values())


class _NoMeta(nn.Module):
    """A model whose forward reads tensor data (``.item()``): impossible on meta."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x) * float(x.abs().sum().item() > -1)


def test_falls_back_to_a_real_forward_when_meta_fails():
    a = audit_model(_NoMeta(), input_size=(4,))
    assert a.flop_method == "real"
    assert a.flops_per_image == 2 * 4 * 3


def test_to_dict_is_json_and_top_limits_layers():
    a = audit_model(report_net(), input_size=(3, 224, 224))
    d = json.loads(json.dumps(a.to_dict(top=2)))
    assert len(d["layers"]) == 2
    assert d["dominant"]["params"] == 301_057
    assert d["total_params"] == 496_769


@pytest.mark.parametrize("kwargs", [dict(input_size=(3, 0, 4)), dict(dominant_share=0.0), dict(dominant_share=1.5)])
def test_bad_arguments_name_the_value(kwargs):
    with pytest.raises(ValueError):
        audit_model(nn.Linear(2, 2), **kwargs)


def test_not_a_module():
    with pytest.raises(ValueError, match="Module"):
        audit_model(lambda x: x)  # type: ignore[arg-type]
