"""Shared fixtures. One torch thread per test process, set before torch loads.

OpenMP reads ``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY`` once, when torch first loads it, and
this file is imported before any test imports grassflow (whose ``__init__`` would set the wait
policy): spinning threads that wait for each other stall a busy machine (issue 33: 277 s
against 101 s for ``tests/test_flows.py`` at load 3.8). Tests that set threads themselves
(``--threads``) restore the count they found.
"""

import os
import sys

TORCH_LOADED_BEFORE_CONFTEST = "torch" in sys.modules
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_and_dtype():
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.fixture(autouse=True)
def _fresh_cpu_clock(monkeypatch):
    """Each test starts the CPU clock at zero, as a fresh command would. ``train`` charges the
    process's CPU seconds so far to ``--minutes`` (its start-up), and a test process that has
    already run other tests for minutes would otherwise start a budgeted run out of budget
    (CI: ``--minutes 5`` trained no step in a worker past 5 CPU minutes)."""
    from grassflow.training import clock

    cpu = clock._cpu
    origin = cpu()
    monkeypatch.setattr(clock, "_cpu", lambda: cpu() - origin)


def random_orthogonal(k: int, reflect: bool = True) -> torch.Tensor:
    """A random Q in O(k); with ``reflect`` its determinant is -1."""
    Q = torch.linalg.qr(torch.randn(k, k))[0]
    if reflect and torch.det(Q) > 0 or not reflect and torch.det(Q) < 0:
        Q = Q.clone()
        Q[:, 0] = -Q[:, 0]
    return Q


def mc_tolerance(samples: torch.Tensor, n_sigma: float = 4.0) -> float:
    """Tolerance of a Monte Carlo mean: ``n_sigma`` standard errors."""
    return n_sigma * samples.std().item() / samples.numel() ** 0.5


@pytest.fixture
def fixed_pace(monkeypatch):
    """``fixed_pace(step, validation=0.0, threads=1.0)``: every optimizer step takes ``step``
    wall seconds, every validation ``validation`` wall seconds, and nothing else takes any
    time; CPU seconds pass ``threads`` times as fast as wall seconds. A budget of either clock
    then buys the same number of steps however busy the machine is, and a run that stopped for
    its budget stops short of it (the case a rerun must not mistake for time left). The
    steps are those of the training objectives (`OBJECTIVES`) and of the shape model's flow
    matching (`grassflow.training.shape_fit`)."""
    from grassflow.training import clock, loop, objectives
    from grassflow.training import shape_fit as fit

    def install(step: float, validation: float = 0.0, threads: float = 1.0) -> None:
        t = [0.0]
        monkeypatch.setattr(clock, "_wall", lambda: t[0])
        monkeypatch.setattr(clock, "_cpu", lambda: threads * t[0])
        for name, fn in list(objectives.OBJECTIVES.items()):

            def ticking(model, batch, fn=fn):
                t[0] += step
                return fn(model, batch)

            monkeypatch.setitem(objectives.OBJECTIVES, name, ticking)

        def ticking_cfm(*args, fn=fit.cfm_objective, **kwargs):
            t[0] += step
            return fn(*args, **kwargs)

        monkeypatch.setattr(fit, "cfm_objective", ticking_cfm)
        evaluate = loop.distributed_mean_nll

        def ticking_validation(*args, **kwargs):
            t[0] += validation
            return evaluate(*args, **kwargs)

        monkeypatch.setattr(loop, "distributed_mean_nll", ticking_validation)

    return install
