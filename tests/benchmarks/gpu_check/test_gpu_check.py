"""The GPU check script, on the CPU: its plumbing, time boxes and failure tolerance."""

import json
import re

import pytest

from stoker.benchmarks.gpu_check import command as gpu_check
from stoker.benchmarks.gpu_check import report as gpu_check_report
from stoker.benchmarks.gpu_check import steps as gpu_check_steps
from stoker.benchmarks.model import add_speedups
from stoker.errors import UsageError
from stoker.pipeline.deps import has_cuda

no_cuda = pytest.mark.skipif(has_cuda(), reason="on a GPU machine the check runs for real (minutes)")


def _result(**parts):
    env = {
        "status": "ok",
        "seconds": 2.0,
        "result": {
            "date": "2026-12-03 06:00 UTC",
            "gpu": "NVIDIA H200",
            "torch": "2.11.0",
            "torchvision": "0.26.0",
            "cuda_version": "12.8",
            "dali": False,
            "usable_cores": 16,
            "auto_backend": "nvjpeg",
            "auto_backend_why": "nvidia-dali is not installed; torchvision 0.26.0 decodes JPEGs on the GPU (nvJPEG)",
            "modules": {"numpy": "2.1", "pillow": "11.0", "tqdm": "4.67", "pytest": None, "webdataset": None},
            "decoders": {
                "nvimgcodec": [True, "nvimgcodec 0.9.0 decodes JPEGs on the GPU (nvImageCodec)"],
                "torchcodec": [False, "torchcodec is not installed"],
                "torchvision": [True, "torchvision 0.26.0 decodes JPEGs on the GPU (nvJPEG)"],
            },
            "auto_decoder": "nvimgcodec",
            "auto_decoder_why": "nvimgcodec 0.9.0 decodes JPEGs on the GPU (nvImageCodec)",
            "stream_priorities": [0, -5],
        },
    }
    result = {"settings": {"smoke": False}, "parts": {"environment": env, **parts}}
    result["targets"] = gpu_check_report.targets(result)
    return result


def test_markdown_reports_rows_failures_and_targets():
    loader = {
        "status": "ok",
        "seconds": 40.0,
        "result": {
            "batch_size": 256,
            "crop": 224,
            "device": "cuda",
            "nvjpeg_vs_pil": 3.5,
            "rows": {
                "nvjpeg": {
                    "img_s": 7000.0,
                    "cpu_pct": 120.0,
                    "gpu_fallbacks": 2,
                    "decoder": "nvimgcodec",
                    "decoder_why": "nvimgcodec 0.9.0 decodes JPEGs on the GPU (nvImageCodec)",
                    "stages": {"read_s": 2.0, "decode_s": 10.0, "crop_resize_s": 8.0, "wall_s": 12.5},
                    "overlap_ratio": 1.6,
                },
                "pil": {"img_s": 2000.0, "cpu_pct": 1550.0, "gpu_fallbacks": None},
            },
            "variants": [
                {
                    "label": "decoder torchvision",
                    "decoder": "torchvision",
                    "img_s": 3500.0,
                    "overlap_ratio": 1.41,
                    "gpu_fallbacks": 0,
                },
                {
                    "label": "overlap off",
                    "overlap": False,
                    "decoder": "nvimgcodec",
                    "img_s": 5000.0,
                    "overlap_ratio": 0.99,
                    "gpu_fallbacks": 0,
                },
                {"label": "hw share 1", "decoder": "nvimgcodec", "hw_decoder_load": 1.0, "error": "RuntimeError: x|y"},
                {
                    "label": "region decode off",
                    "decoder": "nvimgcodec",
                    "region": False,
                    "skipped": "not run: time box",
                },
            ],
            "nvjpeg_stages": {
                "batches": 8,
                "device": "cuda",
                "read_img_s": 90000.0,
                "decode_img_s": 9000.0,
                "crop_resize_img_s": 30000.0,
            },
        },
    }
    model = {
        "status": "timeout",
        "seconds": 200.0,
        "error": "ran past its 200 s time box (partial results kept)",
        "result": {
            "batch_size": 256,
            "image_size": 224,
            "rows": [
                {
                    "model": "resnet50",
                    "amp": "fp32",
                    "channels_last": False,
                    "compile": False,
                    "images_per_s": 1000.0,
                    "step_ms": 256.0,
                    "speedup": 1.0,
                },
                {
                    "model": "resnet50",
                    "amp": "fp16",
                    "channels_last": True,
                    "compile": False,
                    "error": "RuntimeError: no kernel",
                },
            ],
            "not_run": [{"model": "inception", "amp": "bf16", "channels_last": True, "compile": True}],
        },
    }
    train = {
        "status": "ok",
        "seconds": 90.0,
        "result": {
            "command": "stoker train x --arch resnet50",
            "steps": 45,
            "seconds": 60.0,
            "images_per_s": 2500.0,
            "data_wait": 0.125,
            "compiled": {
                "command": "stoker train x --arch resnet50 --compile",
                "steps": 45,
                "seconds": 80.0,
                "images_per_s": 3000.0,
                "data_wait": 0.02,
            },
        },
    }
    md = gpu_check_report.format_markdown(_result(loader=loader, **{"bench-model": model}, train=train))
    assert md.startswith("# stoker GPU check, 2026-12-03 06:00 UTC: NVIDIA H200\n")
    assert "Loader backend `auto` here: **nvjpeg** (nvidia-dali is not installed; torchvision" in md
    assert "\nnot installed here: pytest, webdataset\n" in md
    assert "| nvjpeg | 7,000 | 3.50x | 120 | 2 |  |" in md
    assert "| pil | 2,000 | 1.00x | 1,550 | - |  |" in md
    assert (
        "nvjpeg stages, one at a time, synchronized, one thread (8 batches on cuda): read 90,000 img/s, "
        "decode 9,000 img/s, crop + resize + flip 30,000 img/s"
    ) in md
    assert "| resnet50 | fp32 | no | no | 1,000 | 256.0 | 1.00x |" in md
    assert "| resnet50 | fp16 | yes | no | failed: RuntimeError: no kernel | | |" in md
    assert "not run (time box): 1 setting(s): inception bf16 cl compile" in md
    assert "| bench-model | timeout | 200 | ran past its 200 s time box (partial results kept) |" in md
    assert "45 steps in 60 s: 2,500 images/s, data wait 12.5% of step time" in md
    assert "`stoker train x --arch resnet50 --compile`\n\n45 steps in 80 s: 3,000 images/s, data wait 2.0%" in md
    assert "nvjpeg decoders here: nvimgcodec yes, torchcodec no, torchvision yes; `auto` picks **nvimgcodec**" in md
    assert "stream priorities (least, greatest): [0, -5]" in md
    assert (
        "nvjpeg row: decoder nvimgcodec (nvimgcodec 0.9.0 decodes JPEGs on the GPU (nvImageCodec)); stages read "
        "2.0 s, decode 10.0 s, crop + resize 8.0 s over 12.5 s wall (overlap 1.60)"
    ) in md
    assert "| decoder torchvision | torchvision | 3,500 | 0.50x | 1.41 | 0 |  |" in md
    assert "| overlap off | nvimgcodec | 5,000 | 0.71x | 0.99 | 0 |  |" in md
    assert "| hw share 1 | nvimgcodec | - | - | - | - | RuntimeError: x/y |" in md
    assert "| region decode off | nvimgcodec | - | - | - | - | not run: time box |" in md
    assert "- nvjpeg vs pil images/s: target >= 3x, measured 3.50x: met" in md
    assert "- nvjpeg loader alone: target >= 20,000 img/s, measured 7,000 img/s: NOT met" in md
    assert "- ResNet-50 bf16 data wait: target < 3%, measured 12.5%: NOT met" in md
    assert "- ResNet-50 bf16 compiled data wait: target < 3%, measured 2.0%: met" in md


def test_markdown_of_a_run_where_parts_were_skipped():
    md = gpu_check_report.format_markdown(
        _result(pytest={"status": "skipped", "seconds": 0.1, "why": "no CUDA device: every gpu test would skip"})
    )
    assert "| pytest | skipped | 0 | no CUDA device: every gpu test would skip |" in md
    assert "- nvjpeg vs pil images/s: target >= 3x, measured -: not measured" in md
    assert "- ResNet-50 bf16 compiled data wait: target < 3%, measured -: not measured" in md


def test_variant_plan_rows_follow_what_works_here():
    from stoker.benchmarks.gpu_check.loader_part import variant_plan

    works = {"nvimgcodec": True, "torchcodec": False, "torchvision": True}
    labels = [v["label"] for v in variant_plan(True, works, "nvimgcodec")]
    assert labels == [
        "decoder torchvision",
        "overlap off",
        "hw share 0",
        "hw share 1",
        "region decode off",
        "stages synchronized",
    ]
    cpu = variant_plan(False, works, "torchvision")  # no hardware decoder on a CPU
    assert [v["label"] for v in cpu] == ["decoder nvimgcodec", "overlap off", "region decode off"]
    assert cpu[2] == {"label": "region decode off", "decoder": "nvimgcodec", "region": False}
    only = variant_plan(True, {"nvimgcodec": False, "torchcodec": False, "torchvision": True}, "torchvision")
    assert only == [{"label": "overlap off", "overlap": False}, {"label": "stages synchronized", "stage_sync": True}]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--parts", "loader,nope"], "--parts: unknown part(s) ['nope']"),
        (["--limit", "loader"], "--limit 'loader': expected PART=SECONDS"),
        (["--limit", "loader=soon"], "'soon' is not a number of seconds"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--data", "/no/such/dir"], "--data /no/such/dir is not a folder"),
        (["--limit", "train=0"], "--limit train=0: must be > 0 seconds"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(tmp_path, capsys, argv, needle):
    assert gpu_check.main_argv(["--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_check: error: ") and needle in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@no_cuda
def test_the_api_returns_what_it_writes(tmp_path):
    result = gpu_check.gpu_check(None, tmp_path / "out", parts=["pytest"], limits={"environment": 120})
    assert isinstance(result, gpu_check.GpuCheckResult) and result.ok
    assert {k: v["status"] for k, v in result.parts.items()} == {"environment": "ok", "pytest": "skipped"}
    assert result.parts["pytest"]["why"] == "no CUDA device: every gpu test would skip"
    assert result.settings["data"] is None and result.settings["smoke"] is False
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text()) == result.to_dict()
    assert (tmp_path / "out" / "gpu_check.md").read_text() == result.format_markdown()
    with pytest.raises(UsageError, match=r"^--limit nope=5: expected PART=SECONDS"):
        gpu_check.gpu_check(None, tmp_path / "out2", limits={"nope": 5})
    assert not (tmp_path / "out2").exists()


def test_speedups_are_against_the_same_models_plain_fp32_row():
    rows = [
        {"model": m, "amp": a, "channels_last": cl, "compile": False, **r}
        for m, a, cl, r in (
            ("a", "fp32", False, {"images_per_s": 100.0}),
            ("a", "bf16", True, {"images_per_s": 250.0}),
            ("a", "fp16", False, {"error": "RuntimeError: no kernel"}),
            ("b", "bf16", False, {"images_per_s": 9.0}),
        )
    ]
    add_speedups(rows)
    assert [r["speedup"] for r in rows] == [1.0, 2.5, None, None]  # b has no plain fp32 row


def test_data_part_generates_and_packs_repeated_images(tmp_path):
    ctx = {"out": str(tmp_path), "data": None, "synthetic": 12, "repeat": 3}
    r = gpu_check_steps.part_data(ctx, lambda result: None)
    assert (r["samples"], r["images"], r["repeat"], r["packed_here"]) == (36, 12, 3, True)  # 12 images, 3 times
    assert r["split"] == str(tmp_path / "packed" / "train") and r["root"] == str(tmp_path / "packed")
    assert r["pack"]["short_side"] == 256  # the default pack settings
    assert gpu_check_steps.part_data(ctx, lambda result: None) == r  # a rerun reuses the packed data


@no_cuda
@pytest.mark.slow
def test_cpu_smoke_runs_every_part_and_writes_json_and_markdown(tiny_shards, tmp_path, capsys, fast_python):
    root = tiny_shards(n=12, per_shard=8)  # a small packed dataset: unpacked, packed twice
    out = tmp_path / "out"
    rc = gpu_check.main_argv(
        ["--out", str(out), "--data", str(root), "--cpu-smoke", "--repeat", "2", "--budget", "300"]
    )
    assert rc == 0, capsys.readouterr()
    result = json.loads((out / "gpu_check.json").read_text())
    status = {k: v["status"] for k, v in result["parts"].items()}
    assert status == {
        "environment": "ok",
        "pytest": "skipped",
        "data": "ok",
        "loader": "ok",
        "bench-model": "ok",
        "train": "ok",
    }
    parts = {k: v.get("result") for k, v in result["parts"].items()}
    assert parts["data"]["samples"] == 24 and parts["data"]["images"] == 12  # 12 images packed twice
    assert sorted(p.name for p in (out / "unpacked").iterdir()) == [f"{k:05d}" for k in range(6)]  # by label
    assert parts["loader"]["rows"]["nvjpeg"] == {"skipped": "no CUDA device (nvjpeg decodes on the GPU)"}
    assert parts["loader"]["rows"]["pil"]["img_s"] > 0 and parts["loader"]["rows"]["pil"]["backend"] == "pil"
    for fmt in ("rgb", "yuv420"):  # the pixel tier: its filling epoch and the warm ones, the store removed after
        px = parts["loader"]["rows"][f"pixels-{fmt}"]
        # every sample decoded into the store; under load the filling process and the JPEG path may
        # both decode one the store did not hold yet (seen: 25, 26 and 27 of 24), never one twice each
        assert px["img_s"] > 0 and px["fill_img_s"] > 0 and 24 <= px["decoded"] <= 48 and px["from_store"] > 0, px
    assert (
        parts["loader"]["rows"]["pixels-yuv420"]["store_bytes"] < parts["loader"]["rows"]["pixels-rgb"]["store_bytes"]
    )
    assert not list(out.glob("stoker-pixels-*"))
    stages = parts["loader"]["nvjpeg_stages"]  # the nvjpeg code path, timed on the CPU here
    assert (
        stages["batches"] == 5
        and stages["device"] == "cpu"
        and stages["decoder"] == "torchvision"
        and min(stages[k] for k in ("read_img_s", "decode_img_s", "crop_resize_img_s")) > 0
    )
    variants = {v["label"]: v for v in parts["loader"]["variants"]}  # the nvjpeg runner on the CPU
    assert variants["overlap off"]["img_s"] > 0 and variants["overlap off"]["decoder"] == "torchvision"
    assert 0 < variants["overlap off"]["overlap_ratio"] <= 1.05 and variants["overlap off"]["gpu_fallbacks"] == 0
    assert set(variants["overlap off"]["stages"]) == {"read_s", "decode_s", "crop_resize_s", "wall_s"}
    env = parts["environment"]
    assert env["auto_decoder"] == "torchvision" and set(env["decoders"]) == {"nvimgcodec", "torchcodec", "torchvision"}
    if env["decoders"]["nvimgcodec"][0]:  # its CPU backend: a row, and region decode off, but no hardware share
        assert variants["decoder nvimgcodec"]["img_s"] > 0 and variants["region decode off"]["img_s"] > 0
        assert not [v for v in variants if v.startswith("hw share")]
    assert [(r["model"], r["channels_last"]) for r in parts["bench-model"]["rows"]] == [
        ("resnet18", False),
        ("resnet18", True),
    ]
    assert parts["train"]["steps"] == 6 and 0 <= parts["train"]["data_wait"] < 1  # 24 samples, batch 4
    assert parts["train"]["compiled"] == {"skipped": "torch.compile: CUDA only in this check"}
    md = (out / "gpu_check.md").read_text()
    assert "CPU smoke run" in md and "| pytest | skipped |" in md and md == capsys.readouterr().out.rstrip("\n") + "\n"
    assert result["targets"]["train_data_wait"]["met"] is None  # a smoke run judges nothing


@no_cuda
@pytest.mark.slow
def test_a_failing_and_a_timed_out_part_are_recorded_and_the_rest_runs(tiny_shards, tmp_path, fast_python):
    root = tiny_shards(n=24, per_shard=8)
    shard = root / "train" / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:-1024])  # truncated: the Loader names it before any batch
    out = tmp_path / "out"
    rc = gpu_check.main_argv(
        [
            "--out",
            str(out),
            "--data",
            str(root),
            "--repeat",
            "1",
            "--cpu-smoke",
            "--parts",
            "loader,bench-model,train",
            "--limit",
            "train=1",
        ]
    )
    assert rc == 1
    parts = json.loads((out / "gpu_check.json").read_text())["parts"]
    assert {k: v["status"] for k, v in parts.items()} == {
        "environment": "ok",
        "data": "ok",
        "loader": "failed",
        "bench-model": "ok",
        "train": "timeout",
    }
    assert parts["loader"]["error"].startswith("RuntimeError: pil: ManifestError: shard ")
    assert "shard-000001.tar has" in parts["loader"]["error"]
    assert parts["loader"]["result"]["rows"]["pil"]["error"].startswith("ManifestError")  # kept, with the reason
    assert len(parts["bench-model"]["result"]["rows"]) == 2  # ran after the failure
    # the parent's box closed, or the part's own did (what was left after starting python): named either way
    # (the command's own limit is what was left of the box: under load, a fraction of a second)
    assert re.search(
        r"(ran past its 1 s time box \(partial results kept\)|no time left in its 1 s time box|ran past [\d.]+ s)$",
        parts["train"]["error"],
    )
    md = (out / "gpu_check.md").read_text()
    assert "| loader | failed |" in md and "| train | timeout |" in md and (out / "logs" / "loader.log").exists()
