import math

import numpy as np
import pytest

from grassflow.metrics import histogram, jsd


def test_jsd_is_zero_for_identical_and_matches_a_hand_computation():
    p = np.array([3.0, 1.0, 0.0, 4.0])
    assert jsd(p, 2 * p) == pytest.approx(0.0, abs=1e-12)
    # disjoint supports: JSD = log 2 (up to the 1e-10 smoothing)
    assert jsd(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(math.log(2), rel=1e-8)
    # p = (1/2, 1/2), q = (1, 0): m = (3/4, 1/4)
    hand = 0.5 * (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)) + 0.5 * math.log(
        1 / 0.75
    )
    assert jsd(np.array([1.0, 1.0]), np.array([1.0, 0.0])) == pytest.approx(hand, rel=1e-8)
    assert jsd(p, np.array([1.0, 2.0, 3.0, 4.0])) == jsd(np.array([1.0, 2.0, 3.0, 4.0]), p)


def test_jsd_rejects_bad_histograms():
    with pytest.raises(ValueError, match="equal length"):
        jsd(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="non-negative"):
        jsd(np.array([1.0, -1.0]), np.ones(2))


def test_histogram_binning_clips_like_enf():
    # E-NF: i = min(int(d / 13 * 100), 99); values past the range land in the last bin
    d = np.array([0.0, 0.129, 0.13, 12.99, 13.0, 20.0])
    h = histogram(d, 100, 0.0, 13.0)
    expected = np.zeros(100)
    for x in d:
        expected[min(int(x / 13 * 100), 99)] += 1
    assert np.array_equal(h, expected) and h.sum() == len(d)
