import contextlib
import io
import json

import pytest

from command_server import routed
from helpers import write_split
from stoker.errors import UsageError
from stoker.pipeline.deps import HAS_DALI
from stoker.tools import cli
from stoker.tools.common.synth import make_image_folder

TINY = ["--seconds", "0.5", "--epochs", "1", "--warmup", "1", "--batch-size", "8", "--crop", "32", "--workers", "1"]


@pytest.fixture(scope="module")
def every_row(tmp_path_factory, command_server):
    """One `stoker bench --json` of every row this machine runs (the pixel tier's too), shared by
    the tests that read it: each row is a process of its own, seconds each."""
    tmp = tmp_path_factory.mktemp("bench")
    root = tmp / "data"
    write_split(root / "train", num_samples=48, samples_per_shard=16)
    src = make_image_folder(tmp / "src", per_class=8, min_side=40, max_side=80)
    plot, px = tmp / "bench.png", tmp / "px"
    argv = ["bench", str(root), "--images", str(src), "--json", "--plot", str(plot), "--pixel-cache", str(px)]
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        routed(command_server, mp)  # each row forks from the command server
        assert cli.main([*argv, *TINY]) == 0
    return json.loads(out.getvalue()), plot, px


@pytest.mark.slow
def test_bench_json_has_every_column(every_row):
    result, plot, px = every_row
    kinds = [r["pipeline"] for r in result["rows"]]
    expected = ["torchvision", "wds", "stoker-pil", "ceiling", "stoker-pixels-fill", "stoker-pixels"]
    if HAS_DALI:
        expected += ["dali-reader", "stoker-dali"]
    assert set(expected) <= set(kinds)
    assert result["baseline"] == "torchvision" and result["data"].endswith("train")
    for r in result["rows"]:
        assert "error" not in r, r
        assert r["img_s"] > 0 and r["images"] > 0 and r["peak_rss"] > 0
        assert r["cpu_pct"] > 0 or r["seconds"] < 0.05, r  # CPU time comes in 10 ms clock ticks
        assert r["cpu_s_per_1k"] == pytest.approx(10 * r["cpu_pct"] / r["img_s"])  # CPU seconds per 1,000 images
        if r["pipeline"] != "ceiling":
            assert r["ratio"] > 0
    by = {r["pipeline"]: r for r in result["rows"]}
    assert by["torchvision"]["bytes_per_batch"] == 8 * 3 * 32 * 32 * 4  # float32
    assert by["stoker-pil"]["bytes_per_batch"] == 8 * 3 * 32 * 32  # uint8
    assert {"vs_torchvision", "of_ceiling"} <= set(result["summary"])
    assert any("FFCV" in n for n in result["notes"]) or "ffcv" in kinds
    assert plot.stat().st_size > 1000
    # the pixel tier: its filling epoch and its warm one, each run's store removed
    assert by["stoker-pixels"]["bytes_per_batch"] == by["stoker-pixels-fill"]["bytes_per_batch"] == 8 * 3 * 32 * 32
    assert "fill_vs_jpeg" in result["summary"] and list(px.iterdir()) == []


def test_bench_table_of_the_same_run(every_row):
    from stoker.tools.bench.loader import BenchResult

    lines = BenchResult(**every_row[0]).format_table().splitlines()  # what `stoker bench` prints without --json
    assert "img/s" in lines[1] and "CPU %" in lines[1] and "peak RSS" in lines[1] and "bytes/batch" in lines[1]
    assert "CPU s/1k" in lines[1]
    assert any(line.startswith("(5) stoker Loader (pil)") for line in lines)
    assert any(line.startswith("decode-only ceiling") for line in lines)
    assert "24.0 KB" in "\n".join(lines)  # 8 x 3 x 32 x 32 uint8 per batch


def test_bench_prints_its_table_and_refuses_usage_errors(tiny_shards, tmp_path, capsys):
    root = tiny_shards(n=32, per_shard=16)
    assert cli.main(["bench", str(root / "train"), "--only", "ceiling", *TINY]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "img/s" in lines[1] and any(line.startswith("decode-only ceiling") for line in lines)
    assert cli.main(["bench", str(tmp_path), *TINY]) == 2
    assert cli.main(["bench", str(root), "--only", "nope", *TINY]) == 2
    assert "unknown pipeline" in capsys.readouterr().err


def test_bench_nvjpeg_column_is_skipped_without_cuda(tiny_shards, capsys, monkeypatch):
    from stoker.pipeline import deps

    monkeypatch.setattr(deps, "has_cuda", lambda: False)
    root = tiny_shards(n=32, per_shard=16)
    assert cli.main(["bench", str(root), "--only", "stoker-nvjpeg,ceiling", "--json", *TINY]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [r["pipeline"] for r in result["rows"]] == ["ceiling"]
    assert result["notes"] == ["(5) stoker Loader (nvjpeg, GPU): skipped (torch sees no CUDA device)"]


@pytest.mark.gpu
def test_bench_nvjpeg_column_on_a_gpu(tiny_shards, capsys):
    root = tiny_shards(n=48, per_shard=16)
    assert cli.main(["bench", str(root), "--only", "stoker-nvjpeg,stoker-pil", "--json", *TINY]) == 0
    result = json.loads(capsys.readouterr().out)
    by = {r["pipeline"]: r for r in result["rows"]}
    assert "error" not in by["stoker-nvjpeg"], by["stoker-nvjpeg"]
    assert by["stoker-nvjpeg"]["img_s"] > 0 and by["stoker-nvjpeg"]["bytes_per_batch"] == 8 * 3 * 32 * 32


def test_bench_python_api_returns_a_result(tiny_shards):
    from stoker.tools.bench.loader import BenchResult, bench

    root = tiny_shards(n=32, per_shard=16)
    result = bench(root, only=["ceiling"], batch_size=8, crop=32, epochs=1, seconds=2, warmup=1, workers=1)
    assert isinstance(result, BenchResult) and result.data == str(root / "train")
    assert [r["pipeline"] for r in result.rows] == ["ceiling"] and result.rows[0]["images"] >= 32
    assert result.baseline is None and result.to_dict()["rows"] == result.rows
    assert result.format_table().splitlines()[2].startswith("decode-only ceiling")
    with pytest.raises(UsageError, match="^crop must be at least 1"):  # the Python argument
        bench(root, crop=0)


def test_ffcv_peer_runs_by_file_path():
    # the FFCV column runs tools/peers/ffcv_bench.py by path (its python need not have stoker): without ffcv
    # here it gets as far as importing ffcv, and the failure comes back as a one-line error row
    from stoker.tools.bench.loader import _measure

    res = _measure(
        "ffcv",
        {
            "images": "x",
            "beton": "x.beton",
            "R": 64,
            "crop": 32,
            "batch_size": 8,
            "workers": 1,
            "epochs": 1,
            "warmup": 1,
            "seconds": 1,
        },
    )
    assert res == {"error": "ModuleNotFoundError: No module named 'ffcv'"}


def _row(pipeline, img_s):
    from stoker.tools.bench.loader import LABELS

    return {
        "pipeline": pipeline,
        "label": LABELS[pipeline],
        "img_s": img_s,
        "images": 640,
        "seconds": 640 / img_s,
        "cpu_pct": 190.0,
        "peak_rss": 2**28,
        "bytes_per_batch": 8 * 3 * 32 * 32,
        "ratio": img_s / 100.0,
    }


def _result(rows):
    from stoker.tools.bench.loader import BenchResult, summarize

    return BenchResult(
        data="out/train",
        images="src",
        batch_size=8,
        crop=32,
        workers=2,
        epochs=1,
        seconds_limit=2.0,
        baseline="torchvision",
        rows=rows,
        summary=summarize(rows),
        notes=[],
    )


def test_summary_splits_the_gain_into_pack_time_resize_and_the_loader():
    # As in the run that found it: the shards through webdataset+PIL are already 2x torchvision on the originals.
    rows = [
        _row("torchvision", 100.0),
        _row("wds", 200.0),
        _row("stoker-pil", 300.0),
        _row("stoker-dali", 500.0),
        _row("ceiling", 1000.0),
    ]
    result = _result(rows)
    s = result.to_dict()["summary"]
    assert s["vs_torchvision"] == pytest.approx(5.0)
    assert s["from_pack_resize"] == pytest.approx(2.0) and s["from_loader"] == pytest.approx(2.5)
    assert s["from_pack_resize"] * s["from_loader"] == pytest.approx(s["vs_torchvision"])
    table = result.format_table()
    assert "best stoker Loader: 5.00x torchvision" in table
    assert "pack-time resize: 2.00x ((2) webdataset on the shards / (1) torchvision on the originals)" in table
    assert "Loader: 2.50x (best stoker / (2) webdataset on the same shards)" in table


@pytest.mark.parametrize("missing", ["torchvision", "wds"])
def test_summary_split_only_when_both_rows_ran(missing):
    rows = [_row("torchvision", 100.0), _row("wds", 200.0), _row("stoker-pil", 300.0)]
    rows = [r for r in rows if r["pipeline"] != missing]
    rows.append({"pipeline": missing, "label": missing, "error": "boom"})  # it ran and failed
    result = _result(rows)
    assert "from_pack_resize" not in result.summary and "from_loader" not in result.summary
    assert "pack-time resize" not in result.format_table()


def test_summary_puts_the_pixel_tier_against_both_ffcv_storages():
    rows = [
        _row("ffcv", 400.0),
        _row("ffcv-raw", 800.0),
        _row("stoker-dali", 500.0),
        _row("stoker-pixels-fill", 450.0),
        _row("stoker-pixels", 1000.0),
    ]
    result = _result(rows)
    s = result.summary
    assert s["pixels_vs_ffcv_raw"] == pytest.approx(1.25) and s["pixels_vs_ffcv"] == pytest.approx(2.5)
    assert s["fill_vs_jpeg"] == pytest.approx(0.9) and s["vs_ffcv"] == pytest.approx(1.25)  # best JPEG row: 500
    table = result.format_table()
    assert "pixel tier, warm: 1.25x FFCV (raw), 2.50x FFCV (JPEG)" in table
    assert "pixel tier, filling epoch: 0.90x the best stoker Loader (JPEG)" in table


def test_bench_pixel_tier_rows_need_a_folder(tiny_shards, capsys):
    root = tiny_shards(n=32, per_shard=16)
    assert cli.main(["bench", str(root), "--only", "stoker-pixels", "--json", *TINY]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rows"] == [] and result["notes"] == [
        "(6) stoker pixel tier, warm: skipped (give --pixel-cache DIR, where its store may go)"
    ]  # the rows it measures with one: test_bench_json_has_every_column
