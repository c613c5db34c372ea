import os
import random

import numpy as np
import pytest
import torch

from stoker.errors import CheckpointError
from stoker.model import build_model, load_checkpoint, save_checkpoint, with_normalize
from stoker.model.checkpoint import load_model_state, rng_state, set_rng_state


def _state(arch="inception", num_outputs=6):
    torch.manual_seed(0)
    model = with_normalize(build_model(arch, num_outputs, image_size=32))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)).sum().backward()
    opt.step()
    return model, {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": rng_state(),
        "config": {"arch": arch, "num_outputs": num_outputs},
        "epoch": 1,
        "step": 7,
        "loader": {"epoch": 1, "position": 3},
    }


def _one_line_error(path, **kw):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, **kw)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_round_trip_and_plain_torch_load(tmp_path):
    model, state = _state()
    p = save_checkpoint(tmp_path / "c.pt", state)
    assert not list(tmp_path.glob("*.tmp"))
    back = load_checkpoint(p, arch="inception", num_outputs=6)
    assert back["step"] == 7 and back["loader"] == {"epoch": 1, "position": 3}
    for k, v in model.state_dict().items():
        assert torch.equal(back["model"][k], v)
    # a plain torch.load(weights_only=True) reads it too: no stoker classes inside
    raw = torch.load(p, weights_only=True)
    assert raw["format"] == "stoker-checkpoint" and len(raw["digest"]) == 64


def test_flipped_byte_in_a_tensor_is_refused(tmp_path):
    model, state = _state()
    p = save_checkpoint(tmp_path / "c.pt", state)
    w = state["model"]["net.fc.weight"]
    data = bytearray(p.read_bytes())
    at = data.find(w.reshape(-1)[10:14].numpy().tobytes())
    assert at > 0
    data[at] ^= 0x01
    p.write_bytes(bytes(data))
    # torch itself does not notice (no CRC check on load) ...
    assert not torch.equal(torch.load(p, weights_only=True)["model"]["net.fc.weight"], w)
    # ... the digest does
    assert "digest mismatch" in _one_line_error(p)


def test_edited_value_is_refused(tmp_path):
    _, state = _state()
    p = save_checkpoint(tmp_path / "c.pt", state)
    obj = torch.load(p, weights_only=True)
    obj["step"] = 8  # tampered with, digest left stale
    torch.save(obj, p)
    assert "digest mismatch" in _one_line_error(p)


def test_truncated_and_garbage_files_are_refused(tmp_path):
    _, state = _state()
    p = save_checkpoint(tmp_path / "c.pt", state)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    assert "not a readable checkpoint" in _one_line_error(p)
    g = tmp_path / "g.pt"
    g.write_bytes(b"hello")
    assert "not a readable checkpoint" in _one_line_error(g)
    assert "no such checkpoint" in _one_line_error(tmp_path / "missing.pt")
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    assert "not a stoker checkpoint" in _one_line_error(other)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_pickled_code_is_not_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "evil.pt"
    torch.save({"format": "stoker-checkpoint", "model": _Evil()}, p)
    assert "refused" in _one_line_error(p)
    assert not (tmp_path / "pwned").exists()


def test_other_arch_is_refused(tmp_path):
    _, state = _state("inception", 6)
    p = save_checkpoint(tmp_path / "c.pt", state)
    assert "arch 'inception'" in _one_line_error(p, arch="resnet18")
    assert "6 outputs" in _one_line_error(p, arch="inception", num_outputs=10)
    # and the state_dict itself does not fit another network: one line too
    other = with_normalize(build_model("resnet18", 6))
    with pytest.raises(CheckpointError) as e:
        load_model_state(other, load_checkpoint(p)["model"], source=str(p))
    assert "different architecture" in str(e.value) and "\n" not in str(e.value)


def test_atomic_save_keeps_old_file_on_failure(tmp_path):
    _, state = _state()
    p = save_checkpoint(tmp_path / "c.pt", state)
    before = p.read_bytes()
    with pytest.raises(TypeError):
        save_checkpoint(p, {**state, "bad": object()})  # not plain data: refused before writing
    assert p.read_bytes() == before and not list(tmp_path.glob("*.tmp"))


def test_rng_state_round_trip(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    s = rng_state()
    p = save_checkpoint(tmp_path / "r.pt", {"rng": s, "config": {}})
    expect = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(load_checkpoint(p)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect
