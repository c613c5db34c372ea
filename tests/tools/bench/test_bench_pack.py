import json
import subprocess
import sys

from stoker.tools.bench.packing import BenchPackResult, bench_pack
from stoker.tools.bench.peers import plain_pack
from stoker.tools.cli import main as cli
from stoker.tools.common.synth import make_image_folder


def test_tiny_bench_report_structure(tmp_path):
    src = make_image_folder(tmp_path / "src", classes=("circles", "rings"), per_class=3, min_side=40, max_side=90)
    result = bench_pack(src, workers=[1, 2], short_side=32, quality=80, repeat=1, tmp=str(tmp_path))
    assert isinstance(result, BenchPackResult)
    report = result.to_dict()
    assert report["images"] == 6 and report["short_side"] == 32
    rows = report["rows"]
    assert [r["workers"] for r in rows] == [1, 2]
    for r in rows:
        assert r["stoker_img_s"] > 0 and r["plain_img_s"] > 0
        assert abs(r["ratio"] - r["stoker_img_s"] / r["plain_img_s"]) < 1e-9
        assert abs(r["stoker_img_s_per_worker"] * r["workers"] - r["stoker_img_s"]) < 1e-6
        assert r["stoker_img_per_cpu_s"] > 0 and r["plain_img_per_cpu_s"] > 0
    assert rows[0]["stoker_scaling"] == rows[0]["plain_scaling"] == 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["src"]  # temp shards removed


def test_flat_folder_cli_json(tmp_path, capsys):
    src = make_image_folder(tmp_path / "src", classes=("circles",), per_class=4, min_side=40, max_side=90)
    flat = src / "circles"  # a flat folder of images: taken as one class
    assert cli(["bench-pack", str(flat), "--workers", "1", "--limit", "3", "--repeat", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 3 and len(report["rows"]) == 1
    assert cli(["bench-pack", str(flat), "--workers", "0"]) == 2


def test_plain_python_runs_plain_loop_in_subprocess(tmp_path, capsys):
    # sys.executable stands in for a stock-Pillow venv: the same code path, no extra venv
    src = make_image_folder(tmp_path / "src", classes=("circles", "rings"), per_class=2, min_side=40, max_side=90)
    assert (
        cli(
            [
                "bench-pack",
                str(src),
                "--workers",
                "1",
                "--repeat",
                "1",
                "--short-side",
                "32",
                "--plain-python",
                sys.executable,
                "--tmp",
                str(tmp_path),
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 4 and report["plain_python"] == sys.executable
    assert report["plain_pillow"]["version"] == report["pillow"]["version"]
    assert report["plain_pillow"]["simd"] == report["pillow"]["simd"]
    assert report["plain_pillow"]["python"] == sys.executable
    assert all(r["plain_img_s"] > 0 and r["plain_img_per_cpu_s"] > 0 for r in report["rows"])
    assert [p.name for p in tmp_path.iterdir()] == ["src"]


def test_plain_loop_runs_by_path_without_stoker_or_torch(tmp_path):
    # what runs in --plain-python must work where only pillow + webdataset are installed: run by file path,
    # with stoker, torch and the rest made unimportable
    src = make_image_folder(tmp_path / "src", classes=("circles",), per_class=3, min_side=40, max_side=90)
    items = [(str(p), 0) for p in sorted((src / "circles").iterdir())]
    block = (
        "import runpy, sys\nfor m in ('torch', 'stoker', 'nvidia', 'torchvision'): sys.modules[m] = None\n"
        f"runpy.run_path({plain_pack.__file__!r}, run_name='__main__')\n"
    )
    cfg = {"items": items, "out": str(tmp_path / "out"), "workers": 2, "short_side": 32, "quality": 80}
    proc = subprocess.run(
        [sys.executable, "-c", block], input=json.dumps(cfg), capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert res["count"] == 3 and res["wall"] > 0
    import webdataset as wds

    samples = list(wds.WebDataset(str(tmp_path / "out" / "plain-000000.tar"), shardshuffle=False).decode("pil"))
    assert len(samples) == 3 and all(min(s["jpg"].size) == 32 for s in samples)


def test_bad_plain_python_is_a_usage_error(tmp_path, capsys):
    src = make_image_folder(tmp_path / "src", classes=("circles",), per_class=2, min_side=40, max_side=90)
    assert cli(["bench-pack", str(src), "--plain-python", str(tmp_path / "nope")]) == 2
    fake = tmp_path / "py"  # runs, but has no webdataset/pillow: the loop fails
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named webdataset' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert cli(["bench-pack", str(src), "--plain-python", str(fake), "--tmp", str(tmp_path)]) == 2
    assert "webdataset" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["py", "src"]
