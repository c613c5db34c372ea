import json

from stoker.tools.bench_pack import run
from stoker.tools.cli import main as cli
from stoker.tools.synth import make_image_folder


def test_tiny_bench_report_structure(tmp_path):
    src = make_image_folder(tmp_path / "src", classes=("circles", "rings"), per_class=3, min_side=40, max_side=90)
    report = run(src, workers=[1, 2], short_side=32, quality=80, repeat=1, tmp=str(tmp_path))
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
