"""benchmarks/mix_balance: its simulated samplers count what they claim (small sizes)."""

import numpy as np
import pytest

from stoker.benchmarks.mix_balance import long_tail, stoker_counts, torchdata_counts, weighted_sampler_counts


def test_stoker_balance_is_exact_and_the_weighted_samplers_are_not():
    sizes = long_tail(10, 100, 100.0)
    assert sizes.tolist()[0] == 100 and sizes.tolist()[-1] == 1
    exact = stoker_counts(sizes, 400, epochs=3, world=4)
    assert exact.tolist() == [[40] * 10] * 3
    drawn = weighted_sampler_counts(sizes, 400, epochs=3, world=4)
    assert drawn.sum(1).tolist() == [400] * 3 and np.abs(drawn - 40).max() > 0
    pytest.importorskip("torchdata")
    mixed = torchdata_counts(sizes, 400, epochs=3, world=4)
    assert mixed.sum(1).tolist() == [400] * 3 and np.abs(mixed - 40).max() > 0
