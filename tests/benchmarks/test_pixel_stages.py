"""Where the pixel tier's time goes (python -m stoker.benchmarks.pixel_stages): the warm stages timed."""

from helpers import write_split
from stoker.benchmarks.pixel_stages import STAGES, main, pixel_stages


def test_each_warm_stage_is_timed_and_both_crop_paths_are_taken(tmp_path, capsys):
    split = tmp_path / "train"
    write_split(split, num_samples=24, samples_per_shard=8)
    r = pixel_stages(str(split), crop=32, batch_size=8, epochs=2)
    assert r["images"] == 48  # two warm epochs of three batches
    assert all(r[k] >= 0 for k in STAGES) and r["warp"] > 0 and r["antialias"] > 0
    assert abs(r["total"] - sum(r[k] for k in STAGES)) < 1e-6
    assert 0 < r["warped"] < 1  # upscaled boxes warped by OpenCV, larger ones antialiased by pillow
    assert r["warp_each"] * r["warped"] * r["images"] > 0 and r["antialias_each"] > 0
    assert main([str(split), "--crop", "32", "--batch-size", "8", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "pixel tier stages" in out and "OpenCV warped" in out and "total" in out
