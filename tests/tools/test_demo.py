import json

import pytest

from stoker.tools.cli import main


@pytest.mark.slow
def test_demo_runs_end_to_end_on_tiny_settings(tmp_path, capsys):
    assert main(["demo", "--tiny", "--cache", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{") :])
    # 6 classes x 12 images + the 9 odd-but-valid nasty files; the 4 broken ones rejected.
    assert result["packed"]["train"] == 6 * 12 + 9
    assert result["rejected"] == 4
    assert result["loader"]["stoker_images_per_s"] > 0 and result["loader"]["torchvision_images_per_s"] > 0
    assert result["train"]["steps"] >= 1
    # one tiny epoch need not learn; its val figure counts every val sample once, in whole hits
    n, top1 = result["train"]["val_samples"], result["train"]["val_top1"]
    assert n == result["packed"]["val"] == 6 * 4 and abs(top1 * n - round(top1 * n)) < 1e-9
    assert (tmp_path / "runs").is_dir() and any((tmp_path / "runs").glob("*/last.pt"))


def test_demo_bad_setting_is_one_line(tmp_path, capsys):
    assert main(["demo", "--per-class", "0", "--cache", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--per-class" in err


@pytest.mark.slow
def test_demo_regress_runs_on_tiny_settings(tmp_path, capsys):
    assert main(["demo", "--task", "regress", "--tiny", "--cache", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{") :])
    assert result["task"] == "regress" and result["chance"] == 0.0 and result["chance_top1"] is None
    assert set(result["train"]["val"]) >= {"mse", "mae", "r2"} and result["loader"]["torchvision_images_per_s"] > 0


@pytest.mark.slow
def test_demo_segment_learns_well_above_background_everywhere(tmp_path, capsys):
    # the README's claim: the segmentation demo shows learning on a CPU within a minute or two
    assert main(["demo", "--task", "segment", "--per-class", "120", "--cache", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{") :])
    val = result["train"]["val"]
    assert result["task"] == "segment" and 0 < result["chance"] < 0.25
    assert val["miou"] > 2 * result["chance"] and val["pixel_acc"] > 0.5


@pytest.mark.slow
def test_demo_detect_learns_the_shapes_boxes(tmp_path, capsys):
    # the detection demo at its defaults is clearly above guessing (about 0); its time on a CPU is
    # in docs/benchmarks.md ("The demos, from nothing"), not asserted here
    assert main(["demo", "--task", "detect", "--per-class", "200", "--cache", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{") :])
    assert result["task"] == "detect" and result["packed"] == {"train": 240, "val": 50}
    assert result["train"]["val"]["map50"] > 0.1


def test_demo_help_names_every_task_with_an_example(capsys):
    from stoker.tools.demo import DEMO_TASKS

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for task in DEMO_TASKS[1:]:  # classify is the default, the bare `stoker demo`
        assert f"--task {task}:" in out and f"stoker demo --task {task}" in out, task
    assert "mAP@50" in out
