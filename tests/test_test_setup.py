"""The test processes' own set-up (tests/conftest.py)."""

import os

import torch


def test_one_torch_thread_with_a_passive_wait():
    # catches: tests/conftest.py importing torch (or grassflow) before it sets the OpenMP
    # environment, so that the tests spin two OpenMP threads on a busy machine
    import conftest

    assert not conftest.TORCH_LOADED_BEFORE_CONFTEST
    assert torch.get_num_threads() == 1
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
