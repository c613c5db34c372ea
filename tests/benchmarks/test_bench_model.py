import json

import pytest
import torch

from stoker.model import build_model, measure_model
from stoker.tools.cli import main as cli

TINY = [
    "bench-model",
    "--device",
    "cpu",
    "--models",
    "inception",
    "--batch-size",
    "2",
    "--image-size",
    "32",
    "--seconds",
    "0",
    "--steps-min",
    "1",
    "--warmup-steps",
    "1",
    "--no-progress",
]


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores: one intra-op thread is faster here
    yield
    torch.set_num_threads(n)


def test_measure_model_on_cpu_leaves_the_model_alone():
    net = build_model("inception", 10)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    r = measure_model(
        net,
        batch_size=2,
        image_size=24,
        device="cpu",
        amp="bf16",
        channels_last=True,
        compile=False,
        seconds=0.0,
        steps_min=1,
        warmup_steps=1,
    )
    assert r["images_per_s"] > 0 and r["steps"] >= 1 and r["amp"] == "bf16" and r["channels_last"]
    assert r["params"] > 0 and r["peak_mem_mb"] is None and r["loss"] == r["loss"]
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_table_on_cpu(capsys):
    assert cli(TINY + ["--amp", "fp32"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("inception")]
    assert len(lines) == 2  # fp32 x channels_last off/on (bf16 is covered by measure_model above)
    assert "images/s" in out and "vs fp32" in out and "1.00x" in lines[0]


def test_json_is_valid_and_complete(capsys):
    assert cli(TINY + ["--amp", "fp32", "--channels-last", "off", "--models", "inception,report", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)  # stdout holds the JSON and nothing else
    assert res["device"] == "cpu" and res["batch_size"] == 2 and res["image_size"] == 32
    assert [(r["model"], r["amp"], r["channels_last"], r["compile"]) for r in res["rows"]] == [
        ("inception", "fp32", False, False),
        ("report", "fp32", False, False),
    ]
    assert all(r["images_per_s"] > 0 and r["speedup"] == 1.0 for r in res["rows"])
    assert res["rows"][1]["params"] == 195_712 + 384 * 4 * 4 * 1000 + 1000  # ReportNet sized for 32 px, 1000 outputs


def test_bad_values_are_usage_errors(capsys):
    assert cli(TINY + ["--amp", "fp8"]) == 2
    assert "fp8" in capsys.readouterr().err
    assert cli(TINY + ["--models", "nope"]) == 2
    assert "unknown arch 'nope'" in capsys.readouterr().err


def test_a_device_this_machine_lacks_is_a_usage_error_before_anything_runs(capsys, monkeypatch):
    import stoker.model.throughput as throughput

    def never(*a, **k):
        raise AssertionError("nothing may run for a device that is not there")

    monkeypatch.setattr(throughput, "measure_model", never)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert cli(TINY[:1] + ["--device", "mps"] + TINY[3:]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"stoker bench-model: error: device='mps' is not available here (torch {torch.__version__} sees no mps "
        "device); try auto, cpu or cuda\n"
    )


def test_a_table_whose_every_row_failed_exits_1_with_one_line(capsys, monkeypatch):
    import stoker.model.throughput as throughput

    def no_kernel(*a, **k):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(throughput, "measure_model", no_kernel)
    assert cli(TINY + ["--amp", "fp32"]) == 1
    captured = capsys.readouterr()
    assert captured.out.count("failed: RuntimeError: no kernel image") == 2  # the table, then the verdict
    assert captured.err == (
        "stoker bench-model: every setting failed (2 of 2), nothing was measured; e.g. inception fp32: "
        "RuntimeError: no kernel image is available for execution on the device\n"
    )
