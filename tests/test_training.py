"""Tests of the training loop on a toy Watson density over lines in R^3, Gr(1, 3).

Set ``GRASSFLOW_TEST_DEVICE=cuda`` to run them on a GPU.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
from torch import nn

from grassflow.tasks.texture_runs import PAPER_TEXTURES
from grassflow.training import (
    CheckpointError,
    TrainConfig,
    TrainingDiverged,
    load_checkpoint,
    nll_objective,
    read_metrics,
    train,
)
from grassflow.training import clock as clock_module
from grassflow.training import loop as loop_module
from grassflow.training.progress import Progress

DEVICE = os.environ.get("GRASSFLOW_TEST_DEVICE", "cpu")


class Watson(nn.Module):
    """``log p(y) = kappa (mu^T y)^2 - log Z(kappa)`` for lines ``Y = y: (B, 3, 1)``.

    Density w.r.t. the volume of Gr(1, 3) (total 2 pi): ``Z = 2 pi int_0^1 exp(kappa t^2) dt``,
    by 64-point Gauss-Legendre quadrature. ``noise`` adds zero-mean noise from the global RNG
    (like a Hutchinson estimator) so resume tests also check the RNG state; ``nan_after`` /
    ``nan_grad_after`` make the loss / only its gradient NaN after that many calls.
    """

    def __init__(self, kappa=0.5, noise=0.01, nan_after=None, nan_grad_after=None):
        super().__init__()
        self.kappa = nn.Parameter(torch.tensor(kappa, dtype=torch.float64))
        self.mu_raw = nn.Parameter(torch.tensor([1.0, 0.5, 0.2], dtype=torch.float64))
        t, w = np.polynomial.legendre.leggauss(64)
        self.register_buffer("t", torch.from_numpy((t + 1) / 2))
        self.register_buffer("logw", torch.from_numpy(np.log(w / 2)))
        self.noise, self.nan_after, self.nan_grad_after = noise, nan_after, nan_grad_after
        self.calls, self.last_stats = 0, {}

    def log_norm(self):
        return math.log(2 * math.pi) + torch.logsumexp(self.kappa * self.t**2 + self.logw, 0)

    def log_prob(self, Y):
        self.calls += 1
        mu = self.mu_raw / self.mu_raw.norm()
        quad = (Y[..., 0] @ mu) ** 2
        if self.noise:  # zero-mean and multiplicative, so that it changes the gradients
            quad = quad * (1 + self.noise * torch.randn_like(quad))
        lp = self.kappa * quad - self.log_norm()
        if self.nan_after is not None and self.calls > self.nan_after:
            lp = lp * float("nan")
        if self.nan_grad_after is not None and self.calls > self.nan_grad_after:
            lp = lp + 0 * torch.sqrt(self.kappa - self.kappa)  # value 0, gradient NaN
        self.last_stats = {"nfe": 6 + self.calls % 3}
        return lp


def sampler(n, generator):
    """Lines clustered around the z axis, ``(n, 3, 1)``."""
    y = torch.tensor([0.0, 0.0, 1.0]) + 0.4 * torch.randn(n, 3, generator=generator)
    return (y / y.norm(dim=-1, keepdim=True)).unsqueeze(-1)


def dataset(n, seed=0):
    return sampler(n, torch.Generator().manual_seed(seed)).double()


def config(**changes):
    base = dict(lr=0.05, batch_size=16, iterations=30, log_every=1, val_every=None,
                checkpoint_every=10, seed=3, device=DEVICE, dtype="float64")  # fmt: skip
    return TrainConfig(**{**base, **changes})


def params(model):
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def assert_identical(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


# ------------------------------------------------------------------------ config
def test_config_json_round_trip():
    for cfg in (config(lr_step=7, grad_clip=1.5, budget_minutes=2.5), PAPER_TEXTURES):
        again = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
        assert again == cfg
    assert PAPER_TEXTURES.batch_size == 500 and PAPER_TEXTURES.lr_step == 20000


@pytest.mark.parametrize(
    "changes",
    [
        {"lr": 0.0}, {"lr": -1e-3}, {"lr": float("nan")}, {"batch_size": 0},
        {"batch_size": 2.5}, {"iterations": True}, {"betas": (1.0, 0.9)}, {"betas": (0.9,)},
        {"weight_decay": -1.0}, {"lr_step": 0}, {"lr_gamma": 0.0}, {"grad_clip": 0.0},
        {"seed": -1}, {"log_every": 0}, {"val_every": 0}, {"budget_minutes": 0.0},
        {"val_every_minutes": -1.0}, {"val_doubling_from": 0},
        {"dtype": "float16"}, {"device": "gpu"},
    ],
)  # fmt: skip
def test_config_rejects_bad_values(changes):
    with pytest.raises(ValueError, match=next(iter(changes))):
        config(**changes)


def test_config_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="lrr"):
        TrainConfig.from_dict({**config().to_dict(), "lrr": 1.0})


# ---------------------------------------------------------------------- training
def test_loss_decreases_and_best_val_is_kept(tmp_path):
    model = Watson()
    val = dataset(100, seed=1)
    cfg = config(iterations=120, batch_size=64, val_every=20)
    result = train(model, dataset(400), cfg, tmp_path, val_data=val, progress=False)
    assert result.stopped == "done" and result.iterations == 120
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["iteration"] for r in records] == list(range(1, 121))
    losses = [r["loss"] for r in records]
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.3
    assert all(r["nfe"] in (6, 7, 8) for r in records)
    vals = {r["iteration"]: r["val_nll"] for r in records if "val_nll" in r}
    assert sorted(vals) == [20, 40, 60, 80, 100, 120]
    # the validation solve's NFE is logged with it (a key lost or taken from training breaks)
    # (Watson's NFE counts its calls: the two validation chunks follow the training step)
    val_records = [r for r in records if "val_nll" in r]
    assert val_records[-1]["val_nfe"] == model.last_stats["nfe"]
    assert all(r["val_nfe"] == 6 + (r["nfe"] - 6 + 2) % 3 for r in val_records)
    best = load_checkpoint(tmp_path / "best.pt")
    assert result.best_val == min(vals.values()) == best["val_nll"]
    assert vals[best["iteration"]] == best["val_nll"] == result.best_val
    assert json.loads((tmp_path / "config.json").read_text())["device"] == DEVICE


def test_time_based_validation(tmp_path, fixed_pace):
    from grassflow.training import objectives

    fixed_pace(10.0)  # steps of 10 s, validation free: due after every step
    cfg = config(iterations=12, val_every_minutes=10 / 60)
    kw = {"val_data": dataset(20, 1), "progress": False, "objective": objectives.OBJECTIVES["mle"]}
    train(Watson(), dataset(50), cfg, tmp_path / "a", **kw)
    records = read_metrics(tmp_path / "a" / "metrics.jsonl")
    assert all("val_nll" in r for r in records)
    # a validation dearer than the period (50 s > 30 s) is followed by as much training: one
    # counted from its start would validate after every step (validation eating the budget)
    fixed_pace(10.0, validation=50.0)
    cfg = config(iterations=15, val_every_minutes=0.5)
    kw["objective"] = objectives.OBJECTIVES["mle"]
    train(Watson(), dataset(50), cfg, tmp_path / "d", **kw)
    records = read_metrics(tmp_path / "d" / "metrics.jsonl")
    assert [r["iteration"] for r in records if "val_nll" in r] == [3, 8, 13, 15]
    # validation is not charged to the budget (catches: a budget that validation eats): steps
    # of 10 s, validations of 50 s, budget 147 s buy 14 steps (a 15th would reach 150 s),
    # validated at 3, 6, 9, 12 and at the end; charged, they would leave 4 steps
    cfg = config(iterations=100, val_every=3, budget_minutes=2.45)
    result = train(Watson(), dataset(50), cfg, tmp_path / "e", **kw)
    records = read_metrics(tmp_path / "e" / "metrics.jsonl")
    assert [r["iteration"] for r in records if "val_nll" in r] == [3, 6, 9, 12, 14]
    assert result.iterations == 14 and result.elapsed == pytest.approx(140.0)
    assert result.val_wall_seconds == pytest.approx(5 * 50.0)
    assert records[-1]["wall_s"] == pytest.approx(140.0)
    cfg = config(iterations=12, val_every_minutes=60.0)  # never due: only the final one
    train(Watson(), dataset(50), cfg, tmp_path / "b", val_data=dataset(20, 1), progress=False)
    records = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["iteration"] for r in records if "val_nll" in r] == [12]
    cfg = config(iterations=30, val_doubling_from=3)
    train(Watson(), dataset(50), cfg, tmp_path / "c", val_data=dataset(20, 1), progress=False)
    records = read_metrics(tmp_path / "c" / "metrics.jsonl")
    assert [r["iteration"] for r in records if "val_nll" in r] == [3, 6, 12, 24, 30]


@pytest.mark.parametrize("source", ["tensor", "sampler"])
def test_resume_is_bit_identical(tmp_path, source):
    data = dataset(50) if source == "tensor" else sampler  # 4 batches/epoch, the last short
    cfg = config(lr_step=12)
    # the uninterrupted run also validates: validation must not perturb training randomness
    ref = Watson()
    train(ref, data, cfg.replace(val_every=5), tmp_path / "ref", val_data=dataset(20, 1),
          progress=False)  # fmt: skip

    first = train(Watson(), data, cfg.replace(iterations=13), tmp_path / "run", progress=False)
    assert first.stopped == "done" and first.iterations == 13
    torch.manual_seed(12345)  # scramble the global RNG: resume must restore it
    model = Watson(kappa=9.0)  # different init: resume must load everything
    result = train(model, data, cfg, tmp_path / "run", resume=True, progress=False)
    assert result.iterations == 30 and result.stopped == "done"
    assert_identical(params(model), params(ref))
    # metrics: first invocation's lines kept, new ones appended
    iterations = [r["iteration"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert iterations == list(range(1, 31))


def test_crash_resume_drops_stale_metrics(tmp_path):
    data = dataset(50)
    ref = Watson()
    train(ref, data, config(), tmp_path / "ref", progress=False)

    def crash(iteration, model, record):
        torch.rand(5)  # e.g. pictures: callbacks must not perturb the training RNG
        if iteration == 17:
            raise RuntimeError("the machine went away")  # (Ctrl-C saves: test_loop_parts)

    with pytest.raises(RuntimeError):
        train(Watson(), data, config(checkpoint_every=5), tmp_path / "run", progress=False,
              callback=crash)  # fmt: skip
    path = tmp_path / "run" / "metrics.jsonl"
    before = read_metrics(path)
    assert before[-1]["iteration"] == 17
    assert load_checkpoint(tmp_path / "run" / "last.pt")["iteration"] == 15
    model = Watson()
    train(model, data, config(checkpoint_every=5), tmp_path / "run", resume=True, progress=False)
    after = read_metrics(path)
    assert after[:15] == before[:15]  # appended, not overwritten
    assert [r["iteration"] for r in after] == list(range(1, 31))
    assert_identical(params(model), params(ref))


@pytest.mark.parametrize("kind", ["nan_after", "nan_grad_after"])
def test_divergence_stops_and_keeps_last_good_checkpoint(tmp_path, kind):
    snapshots = {}

    def keep(iteration, model, record):
        snapshots[iteration] = params(model)

    model = Watson(**{kind: 12})
    with pytest.raises(TrainingDiverged, match="diverged at iteration 13") as info:
        train(model, dataset(50), config(checkpoint_every=5), tmp_path, progress=False,
              callback=keep)  # fmt: skip
    assert ("loss" if kind == "nan_after" else "gradient") in str(info.value)
    assert str(tmp_path / "last.pt") in str(info.value)
    assert info.value.result.stopped == "diverged" and info.value.result.iterations == 12
    ckpt = load_checkpoint(tmp_path / "last.pt")
    assert ckpt["iteration"] == 10
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert_identical(ckpt["model"], snapshots[10])
    assert all(torch.isfinite(v).all() for v in params(model).values())  # not stepped


def test_budget_stop_checkpoints_and_resumes(tmp_path, monkeypatch):
    data = dataset(50)
    ref = Watson()
    train(ref, data, config(iterations=60), tmp_path / "ref", progress=False)

    clock = iter(range(10**6))  # every reading of the clock advances it by one second
    use_clock(monkeypatch, lambda: float(next(clock)))
    model = Watson()
    cfg = config(iterations=60, budget_minutes=0.25)
    result = train(model, data, cfg, tmp_path / "run", progress=False)
    assert result.stopped == "budget" and "budget" in result.message
    assert 1 <= result.iterations < 60
    assert load_checkpoint(tmp_path / "run" / "last.pt")["iteration"] == result.iterations

    model = Watson()
    cfg = cfg.replace(budget_minutes=None)
    result = train(model, data, cfg, tmp_path / "run", resume=True, progress=False)
    assert result.stopped == "done" and result.iterations == 60
    assert_identical(params(model), params(ref))


def use_clock(monkeypatch, clock, cpu_per_wall: float = 1.0) -> None:
    """The training loop's CPU and wall clocks read ``clock``; the CPU clock runs
    ``cpu_per_wall`` times as fast (threads > 1), or slower (a process sharing its core)."""
    monkeypatch.setattr(clock_module, "_wall", clock)
    monkeypatch.setattr(clock_module, "_cpu", lambda: cpu_per_wall * clock())


class Clock:
    """A clock under the test's control: ``tick`` advances it by ``step`` seconds.

    ``objective`` ticks once per training step, so every step takes ``step`` seconds.
    """

    def __init__(self, step=1.3):
        self.t, self.step = 0.0, step

    def __call__(self):
        return self.t

    def objective(self, model, batch):
        self.t += self.step
        return nll_objective(model, batch)


def test_total_budget_is_spent_once_whatever_the_pace(tmp_path, monkeypatch):
    # catches: a rerun with the same total budget training again, i.e. a resume that depends
    # on how fast the machine happens to be (the run stops a little before its budget)
    data, run = dataset(50), tmp_path / "run"

    def go(budget, step):
        clock = Clock(step)
        use_clock(monkeypatch, clock)
        model = Watson()
        cfg = config(iterations=1000, total_budget_minutes=budget)
        result = train(model, data, cfg, run, resume=run.exists(), objective=clock.objective,
                       progress=False)  # fmt: skip
        return result, model

    first, _ = go(0.5, 1.3)  # 1.3 s a step: stops at step 23, 29.9 s, just under 30 s
    assert first.stopped == "budget" and "total budget of 0.5" in first.message
    assert first.iterations == 23 and first.elapsed < 30.0
    saved = load_checkpoint(run / "last.pt")
    assert saved["iteration"] == 23 and saved["spent_total_budget"] == 0.5

    # a much faster machine, the same total: no step, and last.pt is left as it was
    again, model = go(0.5, 1e-3)
    assert again.stopped == "budget" and again.iterations == 23 and "already spent" in again.message
    assert_identical(params(model), saved["model"])
    assert load_checkpoint(run / "last.pt")["iteration"] == 23
    assert go(0.1, 1e-3)[0].iterations == 23  # nor with a smaller total

    # a larger total continues from where the run stopped
    more, _ = go(1.0, 1.3)
    assert more.stopped == "budget" and more.iterations == 46  # 23 + 23 steps: 59.8 s


def test_budget_only_run_needs_no_iteration_count(tmp_path, monkeypatch):
    # catches: iterations=None stopping at once (None read as 0) or never (no budget check),
    # a rerun with a larger total refused because None compared as smaller than a number,
    # and a run with neither a count nor a budget accepted (it would never end)
    data, run = dataset(50), tmp_path / "run"
    with pytest.raises(ValueError, match="iterations=None"):
        train(Watson(), data, config(iterations=None), run, progress=False)
    for budget, steps in ((0.5, 23), (1.0, 46)):
        clock = Clock(1.3)
        use_clock(monkeypatch, clock)
        result = train(Watson(), data, config(iterations=None, total_budget_minutes=budget),
                       run, resume=run.exists(), objective=clock.objective, progress=False)
        assert result.stopped == "budget" and result.iterations == steps
        assert f"iteration {steps} (" in result.message  # no "/None" in the message


def test_total_and_invocation_budgets_together(tmp_path, monkeypatch):
    # catches: the per-invocation budget being taken for the run's total, or vice versa
    data, run = dataset(50), tmp_path / "run"
    cfg = config(iterations=1000, budget_minutes=0.2, total_budget_minutes=0.5)
    done = []
    for _ in range(4):
        clock = Clock(1.0)
        use_clock(monkeypatch, clock)
        result = train(Watson(), data, cfg, run, resume=run.exists(), objective=clock.objective,
                       progress=False)  # fmt: skip
        done.append((result.iterations, result.message))
    # 12 steps of 1 s fill 12 s; then 12 more; then the 30 s total leaves 6; then none
    assert [n for n, _ in done] == [12, 24, 30, 30]
    assert "budget of 0.2 cpu min" in done[0][1] and "total budget of 0.5" in done[2][1]


def test_cpu_budget_does_not_depend_on_the_load(tmp_path, monkeypatch):
    # catches: a budget that counts wall-clock time by default (on a busy machine, where the
    # process gets half a core, a step takes twice the wall time and the budget would buy
    # half the steps), or the CPU time of a second thread not being charged
    data, steps = dataset(50), {}
    # (wall seconds a step, CPU seconds per wall second, clock of the budget)
    for name, wall, cpu_per_wall, kind in (("idle", 1.0, 1.0, "cpu"), ("busy", 2.0, 0.5, "cpu"),
                                           ("two-threads", 0.5, 4.0, "cpu"),
                                           ("busy-wall", 2.0, 0.5, "wall")):  # fmt: skip
        clock = Clock(wall)
        use_clock(monkeypatch, clock, cpu_per_wall)
        cfg = config(iterations=1000, budget_minutes=0.2, clock=kind)
        result = train(Watson(), data, cfg, tmp_path / name, objective=clock.objective,
                       progress=False)  # fmt: skip
        steps[name] = result.iterations
        assert result.cpu_seconds == pytest.approx(cpu_per_wall * result.wall_seconds)
        assert load_checkpoint(tmp_path / name / "last.pt")["clock"] == kind
    # 12 CPU s buy 12 steps of 1 CPU s, idle or busy; two threads spend 2 CPU s a step; a
    # 12 s wall budget on the busy machine buys 6 steps of 2 s
    assert steps == {"idle": 12, "busy": 12, "two-threads": 6, "busy-wall": 6}
    with pytest.raises(ValueError, match="clock must be one of"):
        config(clock="gpu")


def test_progress_bar_counts_the_budget(tmp_path, monkeypatch, capsys):
    # catches: a budgeted run showing iterations out of an unreachable total (ETA of days),
    # and one whose iterations end first showing the budget's ETA
    clock = Clock(1.0)
    use_clock(monkeypatch, clock)
    cfg = config(iterations=100_000, budget_minutes=0.25, log_every=1000)
    train(Watson(), dataset(50), cfg, tmp_path / "a", objective=clock.objective, progress=True)
    err = capsys.readouterr().err
    assert "of 0.25 cpu min or the iterations" in err and "it=15/100000" in err
    assert "100%" in err  # the budget's end is the bar's end
    assert "left=~0.00 cpu min" in err  # the time left counts down on the budget's clock
    display = Progress("x")
    loop_module._start_display(display, cfg, 7, None)
    assert display.bar.total == 100_000 and display.bar.n == 7
    display.close()
    # 10 iterations of 1 s against a budget of 15 s: the bar ends full (the budget's share
    # would be 67 %)
    clock = Clock(1.0)
    use_clock(monkeypatch, clock)
    train(Watson(), dataset(50), cfg.replace(iterations=10), tmp_path / "b",
          objective=clock.objective, progress=True)  # fmt: skip
    err = capsys.readouterr().err
    assert "100%|██████████| of 0.25 cpu min" in err and "it=10/10" in err


class InfOnVal(Watson):
    """Finite in training mode, -inf log-density in eval mode (validation)."""

    def log_prob(self, Y):
        lp = super().log_prob(Y)
        return lp if self.training else lp - float("inf")


def test_non_finite_validation_is_divergence(tmp_path):
    # catches: a NaN/inf validation NLL being skipped (written as null) while training goes on
    with pytest.raises(TrainingDiverged, match="non-finite validation NLL") as info:
        train(InfOnVal(), dataset(50), config(val_every=5, checkpoint_every=5), tmp_path,
              val_data=dataset(20, 1), progress=False)  # fmt: skip
    assert info.value.result.stopped == "diverged"
    assert not (tmp_path / "best.pt").exists()


def test_grad_clip_limits_the_norm(tmp_path):
    def loud_nll(model, batch):  # also exercises a custom objective
        loss, stats = nll_objective(model, batch)
        return 1e3 * loss, {**stats, "scale": 1e3}

    seen = []

    def check(iteration, model, record):
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        seen.append((record["grad_norm"], norm.item()))

    train(Watson(), dataset(50), config(iterations=5, grad_clip=0.5), tmp_path, progress=False,
          objective=loud_nll, callback=check)  # fmt: skip
    assert len(seen) == 5
    for before, after in seen:
        assert before > 0.5 and after == pytest.approx(0.5, rel=1e-6)
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["scale"] == 1e3


def test_checkpoint_errors_are_clear(tmp_path):
    data = dataset(50)
    train(Watson(), data, config(iterations=5), tmp_path, progress=False)
    with pytest.raises(FileExistsError, match="last.pt"):
        train(Watson(), data, config(iterations=5), tmp_path, progress=False)
    with pytest.raises(ValueError, match="lr"):
        train(Watson(), data, config(lr=0.01), tmp_path, resume=True, progress=False)
    with pytest.raises(CheckpointError, match="does not fit"):
        train(Watson(), dataset(40), config(), tmp_path, resume=True, progress=False)
    (tmp_path / "last.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=str(tmp_path / "last.pt")):
        train(Watson(), data, config(), tmp_path, resume=True, progress=False)


def test_bad_data_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"\(N, D, k\)"):
        train(Watson(), torch.randn(10, 3), config(), tmp_path, progress=False)
    with pytest.raises(ValueError, match="sampler"):
        train(Watson(), lambda n, g: torch.randn(n + 1, 3, 1, generator=g), config(), tmp_path,
              progress=False)  # fmt: skip


def test_float32_with_progress_bar(tmp_path, capsys):
    model = Watson()
    cfg = config(iterations=12, dtype="float32", log_every=4)
    result = train(model, sampler, cfg, tmp_path, val_data=dataset(20), progress=True)
    assert result.stopped == "done" and math.isfinite(result.final_loss)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    captured = capsys.readouterr()
    assert "done: 12/12" in captured.out and "nfe=" in captured.err
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [4, 8, 12]


def test_non_finite_parameters_are_never_checkpointed(tmp_path):
    def corrupt(iteration, model, record):  # stands in for an overflowing update
        if iteration == 4:
            with torch.no_grad():
                model.kappa.fill_(float("inf"))

    with pytest.raises(TrainingDiverged, match="non-finite parameters"):
        train(Watson(), dataset(50), config(checkpoint_every=2), tmp_path, progress=False,
              callback=corrupt)  # fmt: skip
    assert load_checkpoint(tmp_path / "last.pt")["iteration"] == 2


# ------------------------------------------------------------------------ EMA
def test_ema_matches_its_closed_form():
    # catches a wrong warm-up or lerp direction (the shadow would follow the wrong weights)
    from grassflow.training.ema import ParameterEMA

    p = torch.zeros(3, dtype=torch.float64)
    ema = ParameterEMA([p], decay=0.9)
    with torch.no_grad():
        p.fill_(1.0)  # the shadow starts at 0, the parameter stays at 1
    for t in range(1, 21):
        ema.update(t)
    kept = math.prod(min(0.9, (1 + t) / (10 + t)) for t in range(1, 21))
    assert torch.allclose(ema.shadow[0], torch.full((3,), 1.0 - kept, dtype=torch.float64))
    with ema.applied():
        assert torch.equal(p, ema.shadow[0])
    assert torch.equal(p, torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="decay must lie in"):
        ParameterEMA([p], decay=1.0)
    with pytest.raises(ValueError, match="ema_decay must lie in"):
        config(ema_decay=0.0)


def test_ema_is_validated_saved_as_best_and_resumed_bit_exactly(tmp_path):
    # catches best.pt holding the raw weights, an EMA that perturbs training, and a shadow
    # lost (or restarted) on resume
    data, val = dataset(50), dataset(20, 1)
    plain = Watson()
    train(plain, data, config(), tmp_path / "plain", progress=False)
    ref = Watson()
    train(ref, data, config(ema_decay=0.8), tmp_path / "ref", val_data=val, progress=False)
    assert_identical(params(ref), params(plain))  # the trajectory is unchanged
    last = load_checkpoint(tmp_path / "ref" / "last.pt")
    best = load_checkpoint(tmp_path / "ref" / "best.pt")
    shadow = dict(zip(("kappa", "mu_raw"), last["ema"]["shadow"]))
    for key in shadow:
        assert torch.equal(best["model"][key], shadow[key])
        assert not torch.equal(best["model"][key], last["model"][key])
    # validated with the average: the NLL logged is the shadow's
    average = Watson(noise=0)
    average.load_state_dict(best["model"])
    assert best["val_nll"] == pytest.approx(-average.log_prob(val).mean().item(), rel=1e-2)

    train(Watson(), data, config(ema_decay=0.8, iterations=13), tmp_path / "run",
          val_data=val, progress=False)  # fmt: skip
    train(Watson(), data, config(ema_decay=0.8), tmp_path / "run", val_data=val, resume=True,
          progress=False)  # fmt: skip
    again = load_checkpoint(tmp_path / "run" / "last.pt")["ema"]["shadow"]
    for a, b in zip(again, last["ema"]["shadow"]):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="ema_decay"):
        train(Watson(), data, config(ema_decay=0.9, iterations=40), tmp_path / "run",
              resume=True, progress=False)  # fmt: skip
