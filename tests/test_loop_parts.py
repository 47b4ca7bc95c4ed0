"""The parts of the training loop, each on its own (budget clock, validation schedule,
checkpointer, progress line), and what they do together: budgets that charge validation,
validation priced before it is afforded, and Ctrl-C. Every time comes from a clock the test
controls (no sleeping, no wall-clock assertions)."""

import pytest
import torch

from grassflow.training import TrainConfig, TrainingInterrupted, read_metrics, train
from grassflow.training import clock as clock_module
from grassflow.training.budget import BudgetClock, invocation_limit
from grassflow.training.checkpoint import load_checkpoint
from grassflow.training.clock import Stopwatch
from grassflow.training.progress import Progress, minutes
from grassflow.training.schedule import ValidationSchedule, is_doubling
from grassflow.training.state import TrainState
from test_training import Watson, assert_identical, config, dataset, params


def spent(train_s: float, val_s: float, **changes) -> tuple[TrainConfig, TrainState]:
    state = TrainState(train=Stopwatch(train_s, train_s), val=Stopwatch(val_s, val_s))
    return config(iterations=None, **changes), state


def test_invocation_limit_charges_validation_only_when_asked():
    # catches: validation left out of (or always put into) what a total budget has spent
    cfg, state = spent(40.0, 15.0, total_budget_minutes=1.0)
    assert invocation_limit(cfg, state) == (20.0, True)
    assert invocation_limit(cfg.replace(charge_validation=True), state) == (5.0, True)
    # the per-invocation budget wins when it is smaller
    assert invocation_limit(cfg.replace(budget_minutes=0.25), state) == (15.0, False)
    state.spent_total_budget = 1.0  # stopped by this very total: nothing left
    assert invocation_limit(cfg, state) == (0.0, True)


def test_budget_clock_reserves_the_final_validation_and_the_work_after():
    # catches: a stop rule that forgets the validation it still owes, or the reserve
    cfg, state = spent(0.0, 0.0, budget_minutes=1.0, charge_validation=True,
                       reserve_points=30)  # fmt: skip
    clock = BudgetClock(cfg, state)
    state.iteration, state.train.cpu = 10, 20.0  # 10 steps of 2 s
    clock.add_validation(6.0)  # one validation of 12 points: 0.5 s a point
    # next step at 2 s: 20 + 2 + 6 (spent validating) + 6 (the final one) + 15 (30 points)
    assert clock.reserve(6.0, 12) == pytest.approx(21.0)
    clock.reserve_points = 1000  # work after training that would take most of the limit
    assert clock.reserve(6.0, 12) == pytest.approx(6.0)  # gets nothing: training first
    clock.reserve_points = 30
    assert not clock.out_of_budget(6.0, 12)  # 49 <= 60
    state.train.cpu = 30.0  # 10 steps of 3 s: 30 + 3 + 6 + 21 = 60, not over
    assert not clock.out_of_budget(6.0, 12)
    state.train.cpu = 31.0
    assert clock.out_of_budget(6.0, 12)
    assert clock.left() == pytest.approx(60.0 - 37.0)
    # a validation must leave as much training as it takes: 60 - 37 - 21 = 2 < 12
    assert not clock.affords_validation(6.0, 12)
    assert not clock.affords_final(24.0) and clock.affords_final(23.0)
    # the same numbers without charging: validation is free and never refused
    free = BudgetClock(cfg.replace(charge_validation=False), state)
    assert free.reserve(6.0, 12) == 0.0 and free.affords_validation(100.0)


def test_budget_clock_limits_the_validation_points():
    # catches: a validation subset that ignores val_share, or drops below the probe
    cfg, state = spent(0.0, 0.0, budget_minutes=2.0, charge_validation=True, val_share=0.1)
    clock = BudgetClock(cfg, state)
    assert clock.validation_points(0.5, 50, 8) == 24  # 12 s of 120 at 0.5 s a point
    assert clock.validation_points(0.01, 50, 8) == 50
    assert clock.validation_points(10.0, 50, 8) == 8
    assert clock.prices_validation(50, 8) and not clock.prices_validation(20, 8)


def test_validation_schedule():
    # catches: doubling times off by one, or a time-based wait that ignores the last cost
    assert [i for i in range(1, 50) if is_doubling(i, 3)] == [3, 6, 12, 24, 48]
    schedule = ValidationSchedule(config(val_every=None, val_every_minutes=1.0), 0.0)
    assert not schedule.due(5, False, 59.0) and schedule.due(5, False, 60.0)
    schedule.done(cost=90.0, elapsed=60.0)  # it took longer than the period: wait as long
    assert not schedule.due(6, False, 149.0) and schedule.due(6, False, 150.0)
    assert schedule.due(7, True, 61.0)  # the final one always
    every = ValidationSchedule(config(val_every=4), 0.0)
    assert [i for i in range(1, 13) if every.due(i, False, 0.0)] == [4, 8, 12]


def test_checkpointer_refuses_non_finite_parameters(tmp_path):
    # catches: a NaN model written over the last good checkpoint
    from grassflow.training.batches import make_batches
    from grassflow.training.checkpointer import Checkpointer
    from grassflow.training.state import make_optimizer

    model = Watson().double()
    cfg = config()
    optimizer, scheduler = make_optimizer(model, cfg)
    stream = make_batches(dataset(20), 8, 0, torch.device("cpu"), torch.float64, None)
    saver = Checkpointer(tmp_path, cfg, model, optimizer, scheduler, stream)
    state = TrainState(iteration=3)
    assert saver.save_last(state) and load_checkpoint(tmp_path / "last.pt")["iteration"] == 3
    with torch.no_grad():
        model.kappa.fill_(float("nan"))
    state.iteration = 4
    assert not saver.save_last(state)
    assert load_checkpoint(tmp_path / "last.pt")["iteration"] == 3
    saver.save_best(3, 1.5)
    assert load_checkpoint(tmp_path / "best.pt")["val_nll"] == 1.5


def test_progress_names_a_blocking_phase(monkeypatch, capsys):
    # catches: a line frozen without a word while a validation runs
    t = [0.0]
    monkeypatch.setattr(clock_module, "_cpu", lambda: t[0])
    display = Progress("run", tick_s=3600.0)
    display.start("flow training", 10.0)
    with display.blocking("validating 50 points", expected_s=120.0):
        assert display.bar.desc == "run flow training, validating 50 points: 0.00 of ~2.0 cpu min"
    assert display.bar.desc == "run flow training"
    display.close()
    assert [minutes(s) for s in (3.0, 90.0, 900.0)] == ["0.05", "1.5", "15"]
    quiet = Progress("run", enabled=False)
    quiet.start("x", 3.0)
    with quiet.blocking("y"):
        assert quiet.bar is None


class Ticking:
    """Every training step takes ``step`` CPU seconds, every validation ``per_point``
    seconds a point (the loop's clocks read ``self``)."""

    def __init__(self, monkeypatch, step: float, per_point: float):
        from grassflow.training import loop

        self.t, self.step = 0.0, step
        monkeypatch.setattr(clock_module, "_cpu", lambda: self.t)
        monkeypatch.setattr(clock_module, "_wall", lambda: self.t)
        evaluate = loop.distributed_mean_nll

        def timed(model, Y, batch_size):
            self.t += per_point * len(Y)
            return evaluate(model, Y, batch_size)

        monkeypatch.setattr(loop, "distributed_mean_nll", timed)

    def objective(self, model, batch):
        from grassflow.training import nll_objective

        self.t += self.step
        return nll_objective(model, batch)


def test_charged_budget_bounds_training_and_validation(tmp_path, monkeypatch):
    # catches: validation time outside the budget (the whole command overran 4x), a final
    # validation or reserve that does not fit, a validation subset that is not kept on resume
    tick = Ticking(monkeypatch, step=1.0, per_point=0.5)
    cfg = config(iterations=None, total_budget_minutes=2.0, charge_validation=True,
                 reserve_points=40, val_every=10, log_every=1000)  # fmt: skip
    val = dataset(64, 1)  # 32 s for all: more than val_share (12 s) allows
    result = train(Watson(), dataset(50), cfg, tmp_path / "run", val_data=val,
                   objective=tick.objective, progress=False)  # fmt: skip
    assert result.stopped == "budget" and result.val_points == 24  # 12 s at 0.5 s a point
    charged = result.cpu_seconds + result.val_cpu_seconds
    # what remains covers the 40 reserved points (20 s), and nothing overran
    assert charged + 20.0 <= 120.0 and tick.t == pytest.approx(charged)
    assert charged + 20.0 > 120.0 - 2 * 1.0 - 12.0  # and not much was left unused
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "val_nll" in r]
    assert records[-1]["iteration"] == result.iterations  # the final one fitted
    # a larger total continues the run on the same 24 validation points
    more = train(Watson(), dataset(50), cfg.replace(total_budget_minutes=3.0),
                 tmp_path / "run", val_data=val, objective=tick.objective, resume=True,
                 progress=False)  # fmt: skip
    assert more.val_points == 24 and more.iterations > result.iterations
    assert more.cpu_seconds + more.val_cpu_seconds + 20.0 <= 180.0


def test_uncharged_budget_is_as_before(tmp_path, monkeypatch):
    # catches: the new stop rule changing runs that do not charge validation
    tick = Ticking(monkeypatch, step=1.0, per_point=0.5)
    cfg = config(iterations=None, budget_minutes=0.5, val_every=10, log_every=1000)
    result = train(Watson(), dataset(50), cfg, tmp_path / "run", val_data=dataset(64, 1),
                   objective=tick.objective, progress=False)  # fmt: skip
    # 30 s of 1 s steps: 29 steps (29 * (1 + 1/29) rounds above 30, as it always has),
    # validation (at 10, 20 and the last step, 32 s each) not charged, on every point
    assert result.iterations == 29 and result.val_points == 64
    assert result.val_cpu_seconds == pytest.approx(3 * 32.0)


@pytest.mark.parametrize("where", ["objective", "validation"])
def test_ctrl_c_saves_and_resumes_bit_identically(tmp_path, where):
    # catches: Ctrl-C losing the steps since the last checkpoint, or saving the RNG of a
    # step that was cut short (a resumed run would then differ from an uninterrupted one)
    data, cfg = dataset(50), config(checkpoint_every=100, val_every=5)
    ref = Watson()
    train(ref, data, cfg, tmp_path / "ref", val_data=dataset(20, 1), progress=False)
    model, calls = Watson(), [0]
    log_prob = model.log_prob

    def interrupting(Y):  # training calls log_prob once a step; validation in eval mode
        calls[0] += model.training
        lp = log_prob(Y)  # draws its noise first: the RNG has moved when Ctrl-C comes
        if (where == "objective" and model.training and calls[0] == 13) or \
                (where == "validation" and not model.training):  # fmt: skip
            raise KeyboardInterrupt
        return lp

    model.log_prob = interrupting
    with pytest.raises(TrainingInterrupted, match="saved .*last.pt at iteration") as info:
        train(model, data, cfg, tmp_path / "run", val_data=dataset(20, 1), progress=False)
    assert info.value.iteration == (12 if where == "objective" else 5)
    assert load_checkpoint(tmp_path / "run" / "last.pt")["iteration"] == info.value.iteration
    torch.manual_seed(999)
    resumed = Watson(kappa=7.0)
    train(resumed, data, cfg, tmp_path / "run", val_data=dataset(20, 1), resume=True,
          progress=False)  # fmt: skip
    assert_identical(params(resumed), params(ref))


def test_ctrl_c_during_an_update_saves_the_last_finished_step_not_a_half_updated_model(
        tmp_path, monkeypatch):  # fmt: skip
    # catches: Ctrl-C inside optimizer.step() saving parameters that are half updated (the
    # checkpoint would then hold a model that no uninterrupted run ever had)
    data, cfg = dataset(50), config(checkpoint_every=10)
    adam_step, calls = torch.optim.Adam.step, [0]

    def cut_short(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 13:  # the 13th update: one parameter moved, then Ctrl-C
            self.param_groups[0]["params"][0].data.add_(1.0)
            raise KeyboardInterrupt
        return adam_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", cut_short)
    with pytest.raises(TrainingInterrupted, match="at iteration 10") as info:
        train(Watson(), data, cfg, tmp_path / "run", progress=False)
    assert info.value.iteration == 10
    assert load_checkpoint(tmp_path / "run" / "last.pt")["iteration"] == 10


def test_the_learning_rate_steps_down_every_lr_step_iterations(tmp_path):
    # catches: the step-decay schedule never stepped (or stepped before the update it belongs
    # to): each metrics line records the lr its update used, lr * gamma^floor((i - 1) / step)
    cfg = config(lr=0.04, lr_step=4, lr_gamma=0.5, iterations=10)
    train(Watson(), dataset(50), cfg, tmp_path / "run", progress=False)
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert lrs == [0.04 * 0.5 ** ((i - 1) // 4) for i in range(1, 11)]


def test_cli_reports_ctrl_c_in_one_line(tmp_path, monkeypatch, capsys):
    # catches: a raw traceback on Ctrl-C, or a line that does not say how to go on
    from grassflow.cli import main
    from grassflow.tasks import texture_runs

    def interrupted(*args, **kwargs):
        raise TrainingInterrupted("interrupted: saved r/last.pt at iteration 7", None, 7)

    monkeypatch.setattr(texture_runs, "run", interrupted)
    code = main(["train", "--dataset", "2spirals", "--run-dir", str(tmp_path / "r"),
                 "--iterations", "5", "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130 and len(err) == 1
    assert "iteration 7" in err[0] and "--resume" in err[0] and "Traceback" not in err[0]


def test_unfinished_runs_are_named(tmp_path):
    # catches: `eval`/`sample` using a run cut short without a word
    from grassflow.tasks.run_dir import unfinished_warning

    data, cfg = dataset(50), config(checkpoint_every=5)
    train(Watson(), data, cfg, tmp_path / "done", progress=False)
    assert unfinished_warning(tmp_path / "done") is None

    def stop(iteration, model, record):
        if iteration == 12:
            raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted):
        train(Watson(), data, cfg, tmp_path / "cut", progress=False, callback=stop)
    assert "was interrupted at iteration 12" in unfinished_warning(tmp_path / "cut")

    def crash(iteration, model, record):
        if iteration == 12:
            raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        train(Watson(), data, cfg, tmp_path / "crash" / "flow", progress=False, callback=crash)
    assert "did not finish (a crash?) at iteration 10" in unfinished_warning(tmp_path / "crash")
    # resumed to the end, the warning goes
    train(Watson(), data, cfg, tmp_path / "crash" / "flow", resume=True, progress=False)
    assert unfinished_warning(tmp_path / "crash") is None
