"""`stoker diagnose` names the buckets where a square crop shows little of images of many shapes."""

import re

from helpers import write_split
from stoker.pipeline.shards.table import write_split_table
from stoker.tools.diagnose.inputs import bucket_hint


def test_wide_and_tall_images_get_the_buckets_named_square_ones_nothing(tmp_path):
    mixed, square = tmp_path / "mixed", tmp_path / "square"
    write_split(mixed, num_samples=40, samples_per_shard=20, min_side=24, max_side=96)
    write_split(square, num_samples=10, samples_per_shard=10, min_side=64, max_side=64)
    for split in (mixed, square):
        write_split_table(split)
    line = bucket_hint(mixed, 32)
    shown = [int(p) for p in re.findall(r"(\d+)%", line)]
    assert "--buckets auto (" in line and len(shown) == 2 and shown[1] > shown[0]
    assert bucket_hint(square, 32) is None
    write_split_table(mixed, sizes=False)  # an older table: no sizes, no line (never a guess)
    assert bucket_hint(mixed, 32) is None
