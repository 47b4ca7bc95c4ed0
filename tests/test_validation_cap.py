"""The cap on validation's total share of a budget (`TrainConfig.val_total_share`): every
validation of a run, all invocations and the pricing included, within that share of its
budget, with room for the final one. Every time comes from a clock the test controls (no
sleeping, no wall-clock assertions)."""

import pytest

from grassflow.training import TrainConfig, read_metrics, train
from grassflow.training import clock as clock_module
from grassflow.training import loop as loop_module
from grassflow.training.budget import BudgetClock
from grassflow.training.checkpoint import atomic_save, load_checkpoint
from grassflow.training.clock import Stopwatch
from grassflow.training.objectives import nll_objective
from grassflow.training.state import TrainState
from test_training import Watson, config, dataset

PROBE = loop_module.PROBE_POINTS


class PacedClock:
    """Every training step takes ``step`` seconds of both clocks, every validation
    ``per_point`` seconds a point, and nothing else any time; ``validations`` holds the
    points of each validation (the pricing probe included), in order."""

    def __init__(self, monkeypatch, step: float, per_point: float):
        self.t, self.step, self.per_point = 0.0, step, per_point
        self.validations: list[int] = []
        monkeypatch.setattr(clock_module, "_cpu", lambda: self.t)
        monkeypatch.setattr(clock_module, "_wall", lambda: self.t)
        evaluate = loop_module.distributed_mean_nll

        def timed(model, Y, *args, **kwargs):
            self.t += per_point * len(Y)
            self.validations.append(len(Y))
            return evaluate(model, Y, *args, **kwargs)

        monkeypatch.setattr(loop_module, "distributed_mean_nll", timed)

    def objective(self, model, batch):
        self.t += self.step
        return nll_objective(model, batch)

    def seconds(self, validations: list[int]) -> float:
        return self.per_point * sum(validations)


def budgeted(**changes) -> TrainConfig:
    """A run that trains until its charged total budget runs out, validating every
    ``val_every`` steps (few metrics lines and checkpoints: they cost no time, only speed)."""
    base = dict(iterations=None, charge_validation=True, log_every=1000,
                checkpoint_every=1000)  # fmt: skip
    return config(**{**base, **changes})


def validated(run_dir) -> list[int]:
    """The iterations whose metrics line has a validation NLL."""
    return [r["iteration"] for r in read_metrics(run_dir / "metrics.jsonl") if "val_nll" in r]


VAL = dataset(64, 1)  # 64 points: priced on the first 8 before the first validation


@pytest.mark.parametrize(
    ("per_point", "val_every", "intermediate"),
    [
        (0.1, 10, 8),  # 6.4 s a validation: 0.8 + 8 * 6.4 + 6.4 = 58.4 s of the 60 s cap
        (85 / 64, 100, 0),  # the report: 85 s a validation, 8 of them 680 s of 1,200
    ],
)
def test_validations_summed_over_a_run_overran_their_share(tmp_path, monkeypatch, per_point,
                                                           val_every, intermediate):  # fmt: skip
    # catches: a cap on each validation only, so that many validations together ate most
    # of a charged budget (8 took 680 of 1,200 CPU s), or a cap that leaves no room for the
    # final validation; and (power guard) a cap that never binds
    minutes = 10.0 if val_every == 10 else 20.0
    cap = 0.1 * 60.0 * minutes
    tick = PacedClock(monkeypatch, step=1.0, per_point=per_point)
    cfg = budgeted(total_budget_minutes=minutes, val_every=val_every)
    result = train(Watson(), dataset(50), cfg, tmp_path / "capped", val_data=VAL,
                   objective=tick.objective, progress=False)  # fmt: skip
    assert result.stopped == "budget" and result.val_points == len(VAL), result.message
    assert tick.validations == [PROBE] + [len(VAL)] * (intermediate + 1)
    assert result.val_cpu_seconds == pytest.approx(tick.seconds(tick.validations))
    assert result.val_cpu_seconds <= cap  # the final one included: the cap made room for it
    # the final validation still happens, at the last step, and within the budget
    assert validated(tmp_path / "capped")[-1] == result.iterations
    assert result.cpu_seconds + result.val_cpu_seconds <= 60.0 * minutes
    # the same run without the cap validates far more (the guard binds)
    tick.validations.clear()
    free = train(Watson(), dataset(50), cfg.replace(val_total_share=1.0), tmp_path / "free",
                 val_data=VAL, objective=tick.objective, progress=False)  # fmt: skip
    assert free.val_cpu_seconds > 2 * cap
    assert len(validated(tmp_path / "free")) > intermediate + 3


def test_final_validation_dropped_once_the_cap_is_spent(tmp_path, monkeypatch):
    # catches: the total cap applied to the final validation too, so that a run whose
    # validations already spent the share ends on a stale best model. A small validation
    # set is not priced: the first one, of unknown cost, goes ahead (85 s, above the 60 s
    # cap), every later one but the final is refused, and the final one still runs
    tick = PacedClock(monkeypatch, step=1.0, per_point=85 / 20)
    cfg = budgeted(total_budget_minutes=20.0, val_every=100, val_total_share=0.05)
    result = train(Watson(), dataset(50), cfg, tmp_path / "run", val_data=dataset(20, 1),
                   objective=tick.objective, progress=False)  # fmt: skip
    assert tick.validations == [20, 20]  # at iteration 100, then only the final one
    assert validated(tmp_path / "run") == [100, result.iterations]
    assert result.val_cpu_seconds == pytest.approx(170.0)
    assert result.cpu_seconds + result.val_cpu_seconds <= 1200.0


def test_resumed_old_run_caps_against_the_whole_budget(tmp_path, monkeypatch):
    # catches: a config or checkpoint written before val_total_share that no longer loads
    # or resumes (the field made a trajectory field, or required); and, on resume, a cap
    # that forgets the earlier invocations' validations or that is a share of what is left
    # of the budget (it would allow no validation at all here)
    tick = PacedClock(monkeypatch, step=1.0, per_point=0.1)  # 6.4 s a validation
    old = budgeted(total_budget_minutes=5.0, val_every=10).to_dict()
    del old["val_total_share"]  # as written before the field existed
    cfg = TrainConfig.from_dict(old)
    assert cfg.val_total_share == 0.1
    run = tmp_path / "run"
    first = train(Watson(), dataset(50), cfg, run, val_data=VAL, objective=tick.objective,
                  progress=False)  # fmt: skip
    # 0.8 s of pricing and 3 validations of 6.4 s leave 10.4 of the 30 s cap: room for the
    # final one only
    assert tick.validations == [PROBE] + [len(VAL)] * 4
    assert first.val_cpu_seconds == pytest.approx(26.4)
    ckpt = load_checkpoint(run / "last.pt")
    del ckpt["config"]["val_total_share"]
    atomic_save(ckpt, run / "last.pt")
    tick.validations.clear()
    larger = TrainConfig.from_dict({**old, "total_budget_minutes": 10.0})
    more = train(Watson(), dataset(50), larger, run, val_data=VAL, objective=tick.objective,
                 resume=True, progress=False)  # fmt: skip
    assert more.iterations > first.iterations, more.message
    # a cap of 60 s for the whole run: 26.4 s spent and 0.8 s to price again (each
    # invocation does), so 4 more and the final one
    assert tick.validations == [PROBE] + [len(VAL)] * 5
    assert more.val_cpu_seconds == pytest.approx(59.2) and more.val_cpu_seconds <= 60.0
    assert validated(run)[-1] == more.iterations


def test_budget_clock_cap_counts_earlier_invocations_and_the_final_validation():
    # catches: the cap checked without the next validation's cost, without the final one's,
    # or against this invocation's validation only (the earlier ones come from last.pt)
    cfg = budgeted(total_budget_minutes=10.0, val_total_share=0.1)  # cap: 60 s of 600
    state = TrainState(train=Stopwatch(100.0, 100.0), val=Stopwatch(20.0, 20.0))
    clock = BudgetClock(cfg, state)
    assert clock.val_cap_s == pytest.approx(60.0) and clock.validated() == 20.0
    assert clock.affords_validation(20.0)  # 20 + 20 + 20 (final) = 60
    assert not clock.affords_validation(20.5)
    clock.add_validation(10.0)
    assert clock.validated() == 30.0 and not clock.affords_validation(15.5)
    assert clock.affords_final(100.0)  # the final one answers to the limit alone
    # a per-invocation budget: the share of the earlier charged seconds plus this limit
    per_run = BudgetClock(budgeted(budget_minutes=3.0, val_total_share=0.5), state)
    assert per_run.val_cap_s == pytest.approx(0.5 * (180.0 + 100.0 + 20.0))
    # not charged, or no budget: no cap
    assert BudgetClock(cfg.replace(charge_validation=False), state).affords_validation(500.0)
    assert BudgetClock(budgeted(iterations=10), state).affords_validation(500.0)


def test_val_total_share_rejects_what_is_not_a_share():
    # catches: a share of 0 (no validation at all), above 1 or not a number slipping through,
    # or the field made one that a resumed run must keep
    for bad in (0.0, -0.1, 1.5, float("nan"), True, "0.1", None):
        with pytest.raises(ValueError, match="val_total_share"):
            config(val_total_share=bad)
    assert config(val_total_share=1.0).val_total_share == 1.0
    assert not config().trajectory_diff(config(val_total_share=0.5))
