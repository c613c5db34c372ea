"""TrainStep, the one training step (train, bench-model, diagnose), against a hand-written step."""

import copy

import pytest
import torch
import torch.nn.functional as F

from stoker.model import build_model, measure_model, with_normalize
from stoker.model.train import TrainStep, resolve_amp
from stoker.model.train.runtime import make_scaler
from stoker.model.train.step import loss_fn, make_optimizer, make_scheduler


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same reduction order in both copies
    yield
    torch.set_num_threads(n)


def _setup(model):
    opt = make_optimizer(model, "sgd", lr=0.05, momentum=0.9, weight_decay=5e-4)
    return opt, make_scheduler(opt, warmup_steps=2, total_steps=10)


def _batch():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8, generator=g), torch.tensor([0, 1, 2, 1])


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_one_step_changes_the_weights_exactly_like_a_hand_written_step(amp):
    torch.manual_seed(0)
    mine = with_normalize(build_model("inception", 3))
    hand = copy.deepcopy(mine)
    before = {k: v.clone() for k, v in mine.state_dict().items()}
    spec = resolve_amp(amp, torch.device("cpu"))
    images, labels = _batch()

    opt, sched = _setup(mine)
    step = TrainStep(
        mine, opt, loss_fn("classify", label_smoothing=0.1), amp=spec, scaler=make_scaler(spec), scheduler=sched
    )
    loss = step(images, labels)

    h_opt, h_sched = _setup(hand)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
        h_loss = F.cross_entropy(hand(images), labels, label_smoothing=0.1)
    h_opt.zero_grad(set_to_none=True)
    h_loss.backward()
    h_opt.step()
    h_sched.step()

    assert not loss.requires_grad and torch.equal(loss, h_loss.detach())
    after, h_after = mine.state_dict(), hand.state_dict()
    assert not torch.equal(after["net.fc.weight"], before["net.fc.weight"])  # it trained
    assert all(torch.equal(after[k], h_after[k]) for k in after)  # bit for bit
    assert sched.get_last_lr() == h_sched.get_last_lr() == [0.05, 0.05]  # warm-up step 2 of 2
    assert all(p.grad is not None for p in mine.parameters())


def test_fp16_step_goes_through_the_grad_scaler():
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 3)
    spec = resolve_amp("fp16", torch.device("cpu"))
    scaler = make_scaler(spec)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    w = net.weight.detach().clone()
    TrainStep(net, opt, loss_fn("classify"), amp=spec, scaler=scaler)(torch.randn(5, 8), torch.tensor([0, 1, 2, 0, 1]))
    assert scaler.is_enabled() and scaler.get_scale() == 65536.0  # finite grads: the scale is kept
    assert not torch.equal(net.weight, w)


def test_regress_loss_is_the_case_studys_mse():
    out, y = torch.tensor([[0.5], [2.0]]), torch.tensor([1, 2])
    assert loss_fn("regress")(out, y).item() == pytest.approx(0.125)


def test_measure_model_runs_the_train_step():
    """bench-model's figure comes from TrainStep: its loss is the step's, finite, on the same batch."""
    r = measure_model(
        build_model("inception", 4), batch_size=2, image_size=16, device="cpu", seconds=0.0, steps_min=1, warmup_steps=1
    )
    assert r["steps"] == 1 and r["loss"] > 0 and r["amp"] == "off"
