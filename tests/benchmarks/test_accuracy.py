"""Time to accuracy (python -m stoker.benchmarks.accuracy): four runs timed to one val accuracy."""

import pytest

from helpers import write_split
from stoker.benchmarks.accuracy import VARIANTS, AccuracyResult, main, time_to_accuracy


@pytest.mark.slow
def test_every_run_is_timed_to_the_accuracy_all_of_them_reach(tmp_path, fast_python):
    data = tmp_path / "data"
    write_split(data / "train", num_samples=32, samples_per_shard=16)
    write_split(data / "val", num_samples=12, samples_per_shard=16, seed=1)
    both = (VARIANTS[1], VARIANTS[2])  # progressive on JPEG, a fixed crop on the pixel tier: each switch once
    assert {v[1] for v in both} == {v[2] for v in both} == {False, True}
    result = time_to_accuracy(
        data, cache=tmp_path / "cache", epochs=2, crop=32, progressive="16:32", batch_size=8, threads=1, variants=both
    )
    assert isinstance(result, AccuracyResult) and [r["name"] for r in result.rows] == [v[0] for v in both]
    assert result.target == min(r["best_top1"] for r in result.rows)  # every run reaches it
    for r in result.rows:
        assert r["seconds_to_target"] is not None and 0 < r["seconds_to_target"] <= r["seconds"]
        assert [e for e, _, _ in r["per_epoch"]] == [1, 2] and r["epoch_reached"] in (1, 2)
    assert not list((tmp_path / "cache").glob("pixels-*"))  # each run's store is removed
    assert "time to" in result.format_table().splitlines()[0]


def test_a_dataset_without_val_is_one_line(tmp_path, capsys):
    write_split(tmp_path / "data" / "train", num_samples=8, samples_per_shard=8)
    assert main([str(tmp_path / "data"), "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "must hold train/ and val/" in err
