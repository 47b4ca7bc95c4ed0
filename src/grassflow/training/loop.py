"""The training loop: ``train(model, data, config, run_dir)``, generic over models/objectives.

A run directory holds ``config.json`` (resolved config), ``last.pt`` (everything needed to
resume bit-exactly), ``best.pt`` (best validation model) and ``metrics.jsonl``.

`train` is the order of things, one screen: set up → step → maybe validate and log → maybe
checkpoint → finish. Each of those is a named method of `_Run`, which holds one call's
state; the parts live beside it: the budget clock (`budget`), the validation schedule
(`schedule`), the checkpoints (`checkpointer`) and the progress line (`progress`).

Launched by ``torchrun --nproc_per_node N``, the same call trains data-parallel
(DistributedDataParallel, see `distributed`): each rank takes ``batch_size / N`` points of
the same global batch, draws its own noise (Hutchinson, flow-matching times and prior points)
from the global RNG seeded by ``(seed, rank)`` and checkpointed per rank, and the averaged
gradient is the global-batch one, so ``lr`` keeps its meaning. Validation is sharded in
chunks and gives the single-process value. Rank 0 alone writes the run directory and shows
progress; every rank resumes from ``last.pt``. An adaptive ODE solver picks one step size per
rank's batch, so MLE training matches a single process up to the solver tolerance; with
``"fm-ot"`` the pairing is per rank.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch import Tensor, nn

from . import distributed as dd
from .batches import Sampler, check_points, make_batches, model_manifold
from .budget import BudgetClock
from .checkpoint import write_json
from .checkpointer import Checkpointer
from .clock import Stopwatch
from .config import TrainConfig, resolve_device, resolve_dtype
from .ema import ParameterEMA
from .metrics_log import MetricsLog, make_record
from .objectives import Objective, nll_objective
from .parallel_eval import distributed_mean_nll
from .progress import Progress, minutes
from .result import TrainingDiverged, TrainingInterrupted, TrainResult
from .rng import capture_rng_state, derive_seed, isolated_rng, seed_all
from .schedule import ValidationSchedule
from .state import TrainState, load_last, make_optimizer

__all__ = ["TrainResult", "TrainingDiverged", "TrainingInterrupted", "train"]

logger = logging.getLogger(__name__)

PROBE_POINTS = 8
"""Validation points timed to price a charged validation before the first one."""

Callback = Callable[[int, nn.Module, dict], None]


def train(
    model: nn.Module,
    data: Tensor | Sampler,
    config: TrainConfig,
    run_dir: str | Path,
    *,
    val_data: Tensor | None = None,
    objective: Objective = nll_objective,
    resume: bool = False,
    progress: bool | Progress = True,
    callback: Callback | None = None,
    setup: Stopwatch | None = None,
) -> TrainResult:
    """Train ``model`` with Adam on ``objective`` (default: mean NLL), resumably.

    The model is moved in place to ``config.device`` / ``config.dtype``. A fresh run seeds the
    global RNGs from ``config.seed``; a resumed one restores them, so an interrupted and
    resumed run ends with the same parameters as an uninterrupted one (bit-exact on CPU).
    Ctrl-C saves ``last.pt`` as of the last finished step and raises `TrainingInterrupted`.
    Under torchrun it trains data-parallel (module docstring).

    Args:
        model: ``nn.Module`` with ``log_prob(Y: (B, D, k)) -> (B,)`` (needed by the default
            objective and by validation), optionally ``last_stats = {"nfe": int, ...}``.
        data: training points ``(N, D, k)`` read in seeded shuffled epochs, or a sampler
            ``sampler(n, generator: torch.Generator) -> (n, D, k)`` for an infinite stream.
        config: optimizer, schedule and bookkeeping settings.
        run_dir: run directory, created if missing.
        val_data: validation points ``(M, D, k)``; the NLL is evaluated at the times of
            `ValidationSchedule` and at the end, and the best model is ``best.pt``. With
            ``config.charge_validation`` its time counts against the budgets, the final
            validation is kept within them, and a validation that would leave less training
            time than it takes is skipped.
        objective: ``objective(model, batch) -> (loss, stats)``.
        resume: continue from ``run_dir/last.pt`` if it exists. Fields that change the
            trajectory (``TRAJECTORY_FIELDS``) must equal the checkpoint's; ``iterations``,
            logging, budget and device may change.
        progress: show a progress line with loss, NFE, lr and the budget left; or a
            `Progress` that the caller shares between the phases of a command.
        callback: ``callback(iteration, model, record)`` after each metrics line (e.g. to
            draw pictures); it runs with isolated RNG so it cannot perturb training.
        setup: the caller's work before this call (loading data, building the model), a
            `Stopwatch` started when the command began; stopped here, and with
            ``config.charge_validation`` charged to the budgets (and kept in ``last.pt``).

    Returns:
        A ``TrainResult``; ``stopped`` is ``"done"`` or ``"budget"``.

    Raises:
        TrainingDiverged: non-finite loss, gradient or parameters; nothing bad is saved.
        TrainingInterrupted: Ctrl-C (a ``KeyboardInterrupt``); the message says what was saved.
        FileExistsError: ``run_dir`` already holds ``last.pt`` and ``resume`` is False.
        ValueError: bad data, a resumed config that changes the trajectory, or a
            ``batch_size`` that the number of processes does not divide.
        CheckpointError: ``last.pt`` is corrupt or does not match the model.
    """
    run = _Run(model, data, config, Path(run_dir), val_data, objective, resume, setup)
    if run.budget.exhausted() and run.state.iteration < run.limit:
        return run.nothing_to_train()
    run.start(progress)
    try:
        while run.state.iteration < run.limit:
            loss, stats, lr, grad_norm = run.step()
            done, last = run.state.iteration, run.state.iteration == run.limit
            out_of_budget, val_due = run.decide(done, last)
            final = last or out_of_budget  # log (and validate, budget permitting) the last one
            if done % config.log_every == 0 or final or val_due:
                run.log(done, loss, stats, lr, grad_norm, val_due, callback)
            run.show(done, loss, stats, lr)
            if final:
                run.end(out_of_budget)
            if done % config.checkpoint_every == 0 or final:
                run.checkpoint()
            if out_of_budget:
                break
    except KeyboardInterrupt as interrupt:
        raise run.interrupted() from interrupt
    finally:
        run.close()
    return run.finish()


class _Run:
    """One call of `train`: its parts (budget clock, validation schedule, checkpointer,
    progress line) and the state they share, as named steps for `train` to call in order."""

    def __init__(self, model: nn.Module, data: Tensor | Sampler, config: TrainConfig,
                 run_dir: Path, val_data: Tensor | None, objective: Objective, resume: bool,
                 setup: Stopwatch | None):  # fmt: skip
        if (
            config.iterations is None
            and config.budget_minutes is None
            and config.total_budget_minutes is None
        ):
            raise ValueError("iterations=None trains until a budget runs out: set "
                             "budget_minutes or total_budget_minutes")  # fmt: skip
        self.parallel = dd.init()  # False unless launched by torchrun with several processes
        self.model, self.config, self.objective, self.run_dir = model, config, objective, run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.last_path = run_dir / "last.pt"
        if self.last_path.exists() and not resume:
            raise FileExistsError(f"{self.last_path} exists: pass resume=True or use a new "
                                  "run_dir")  # fmt: skip
        self.device = dd.device_for(resolve_device(config.device))
        dtype = resolve_dtype(config.dtype)
        model.to(device=self.device, dtype=dtype).train()
        manifold = model_manifold(model)  # a flow on Gr(k, D) gets orthonormality checks too
        self.stream = make_batches(data, config.batch_size, config.seed, self.device, dtype,
                                   manifold)  # fmt: skip
        if self.parallel:
            dd.check_batch_size(config.batch_size)
            self.stream = dd.ShardedBatches(self.stream)
        if val_data is not None:
            check_points(val_data, "val_data", manifold)
            val_data = val_data.to(device=self.device, dtype=dtype)
        self.val_data = val_data
        self.optimizer, self.scheduler = make_optimizer(model, config)
        self.ema = None if config.ema_decay is None else ParameterEMA(
            [p for group in self.optimizer.param_groups for p in group["params"]],
            config.ema_decay)  # fmt: skip
        self.state = TrainState()
        if resume and self.last_path.exists():
            self.state = load_last(self.last_path, config, model, self.optimizer,
                                   self.scheduler, self.stream, dd.rank(), dd.world(),
                                   self.ema)  # fmt: skip
        else:  # rank 0 (and a single process) uses the (seed, "global") stream
            seed_all(derive_seed(config.seed, "global", dd.rank()))
        self.ddp_step = dd.DataParallelStep(model, objective, self.device) if self.parallel \
            else None  # fmt: skip
        self.metrics = None
        if dd.is_main():
            write_json(config.replace(device=str(self.device)).to_dict(),
                       run_dir / "config.json")  # fmt: skip
            self.metrics = MetricsLog(run_dir / "metrics.jsonl", keep_until=self.state.iteration)
        if setup is not None:
            setup.stop()
            self.state.setup.cpu += setup.cpu
            self.state.setup.wall += setup.wall
        self.kind, self.threads = config.clock, torch.get_num_threads()
        timed = config.budget_minutes is not None or config.total_budget_minutes is not None \
            or config.val_every_minutes is not None  # fmt: skip
        self.budget = BudgetClock(
            config, self.state, dd.max_over_ranks if self.parallel and timed else None
        )
        self.schedule = ValidationSchedule(config, self.budget.elapsed())
        self.saver = Checkpointer(
            run_dir, config, model, self.optimizer, self.scheduler, self.stream,
            write=dd.is_main(), ema=self.ema,
            gather_rng=(lambda: dd.all_gather_objects(capture_rng_state()))
            if self.parallel else None)  # fmt: skip
        self.limit = math.inf if config.iterations is None else config.iterations
        self.of_limit = "" if config.iterations is None else f"/{config.iterations}"
        self.message = None  # the budget's message, if the budget ends the call
        self.step_rng, self.updating = None, False  # the RNG at the start of an unfinished step
        self.display, self.shared = Progress(enabled=False), False

    # ------------------------------------------------------------------ start and end
    def nothing_to_train(self) -> TrainResult:
        message = (
            f"total budget of {self.config.total_budget_minutes:g} min already spent "
            f"({self.budget.elapsed() / 60:.2f} {self.kind} min, {self.state.iteration} "
            "iterations): nothing to train; raise total_budget_minutes to continue"
        )
        logger.info(message)
        return self.result("budget", message)

    def start(self, progress: bool | Progress) -> None:
        """Open the progress line and start the training clock."""
        self.state.spent_total_budget = None  # set again if this call's total budget runs out
        self.state.stopped = None  # until this call ends
        self.shared = isinstance(progress, Progress)  # a command's line: name the part trained
        name = self.run_dir.name
        self.display = progress if self.shared else Progress(name, enabled=progress,
                                                             kind=self.kind)  # fmt: skip
        self.display.enabled = self.display.enabled and dd.is_main()
        _start_display(self.display, self.config, self.state.iteration, self.budget.limit_s,
                       f"{name} training" if self.shared else "training")  # fmt: skip
        self.state.train.start()

    def end(self, out_of_budget: bool) -> None:
        """Record how this call ends (before the final checkpoint, which keeps it)."""
        self.state.stopped = "budget" if out_of_budget else "done"
        if not out_of_budget:
            return
        by_total = self.budget.by_total
        # recorded in last.pt, so a rerun with the same total does not train again
        self.state.spent_total_budget = self.config.total_budget_minutes if by_total else None
        which = (f"total budget of {self.config.total_budget_minutes:g}" if by_total
                 else f"budget of {self.config.budget_minutes:g}")  # fmt: skip
        self.message = (
            f"{which} {self.kind} min reached at iteration {self.state.iteration}"
            f"{self.of_limit} ({self.budget.elapsed() / 60:.2f} {self.kind} min trained, "
            f"{self.threads} thread(s)); saved {self.last_path}; "
            "rerun with resume=True (and a larger budget) to continue"
        )

    def close(self) -> None:
        self.state.train.stop()
        if not self.shared:  # a shared line is the caller's to close
            self.display.close()

    def finish(self) -> TrainResult:
        dd.barrier()  # rank 0's files are complete when train returns on any rank
        message = self.message or f"done: {self.state.iteration}{self.of_limit} iterations"
        self.display.write(message)
        logger.info(message)
        return self.result("done" if self.message is None else "budget", message)

    def result(self, stopped: str, message: str) -> TrainResult:
        state = self.state
        return TrainResult(
            iterations=state.iteration,
            final_loss=state.last_loss,
            best_val=state.best_val,
            best_iteration=state.best_iteration,
            stopped=stopped,
            elapsed=self.budget.elapsed(),
            run_dir=self.run_dir,
            cpu_seconds=state.train.seconds("cpu"),
            wall_seconds=state.train.seconds("wall"),
            val_cpu_seconds=state.val.seconds("cpu"),
            val_wall_seconds=state.val.seconds("wall"),
            threads=self.threads,
            message=message,
            last_val_seconds=self.schedule.last_cost,
            budget_left_seconds=self.budget.left(),
            val_points=None if self.val_data is None else len(self.validation_set()),
        )

    # ------------------------------------------------------------------ one step
    def step(self) -> tuple[float, dict, float, float]:
        """One optimizer step: its loss, stats, learning rate and gradient norm."""
        state, optimizer = self.state, self.optimizer
        self.step_rng = capture_rng_state() if self.ddp_step is None else None
        batch = self.stream.batch(state.iteration)
        optimizer.zero_grad(set_to_none=True)
        if self.ddp_step is None:
            loss, stats = self.objective(self.model, batch)
            loss_value = float(loss.detach())
            if math.isfinite(loss_value):
                loss.backward()
        else:  # DDP all-reduces the gradients; loss_value is the global batch's
            loss_value, stats = self.ddp_step.loss_and_backward(batch, self.stream.fraction)
        if not math.isfinite(loss_value):
            raise self.diverged("loss", loss_value, state.iteration + 1)
        max_norm = math.inf if self.config.grad_clip is None else self.config.grad_clip
        # returns the norm before clipping, which is what we log
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.saver.params, max_norm))
        if not math.isfinite(grad_norm):
            raise self.diverged("gradient norm", grad_norm, state.iteration + 1)
        lr = optimizer.param_groups[0]["lr"]
        self.updating = True  # an interrupt here leaves a half-updated model: not saved
        optimizer.step()
        if self.ema is not None:
            self.ema.update(state.iteration + 1)
        if self.scheduler is not None:
            self.scheduler.step()
        state.iteration += 1
        state.last_loss = loss_value
        self.updating, self.step_rng = False, None
        self.budget.tick()
        return loss_value, stats, lr, grad_norm

    def log(self, done: int, loss: float, stats: dict, lr: float, grad_norm: float,
            val_due: bool, callback: Callback | None) -> None:  # fmt: skip
        """Write a metrics line (validating first if due) and call ``callback`` on it."""
        record = make_record(done, loss, stats, lr, grad_norm, self.budget.elapsed())
        record["cpu_s"] = self.state.train.seconds("cpu")
        record["wall_s"] = self.state.train.seconds("wall")
        if val_due:
            record["val_nll"] = self.validate(done)
            # how hard the flow is to integrate: NFE of the last validation chunk
            record["val_nfe"] = getattr(self.model, "last_stats", {}).get("nfe")
        if self.metrics is not None:
            self.metrics.append(record)
        if callback is not None:
            with (
                paused(self.state.train),
                isolated_rng(derive_seed(self.config.seed, "callback", done), self.device),
            ):
                callback(done, self.model, record)

    def show(self, done: int, loss: float, stats: dict, lr: float) -> None:
        _show(self.display, self.budget, self.config, done, loss, stats, lr,
              self.state.best_val)  # fmt: skip

    def checkpoint(self, rng: dict | None = None) -> None:
        if not self.saver.save_last(self.state, rng):
            raise self.diverged("parameters", float("nan"), self.state.iteration)

    # ------------------------------------------------------------------ validation
    def decide(self, done: int, last: bool) -> tuple[bool, bool]:
        """Whether the budget ends training after step ``done``, and whether to validate:
        at the schedule's times, priced first if validation is charged and its cost
        unknown, and only if the budget affords it (the final one: if a best model exists,
        only if it fits)."""
        budget, schedule, val_data = self.budget, self.schedule, self.val_data
        points = 1 if val_data is None else len(self.validation_set())
        out_of_budget = not last and budget.out_of_budget(schedule.last_cost, points)
        due = val_data is not None and schedule.due(done, last or out_of_budget, budget.elapsed())
        if due and not (last or out_of_budget) and schedule.last_cost is None \
                and budget.prices_validation(len(val_data), PROBE_POINTS):  # fmt: skip
            self.price_validation()
            points = len(self.validation_set())
            out_of_budget = budget.out_of_budget(schedule.last_cost, points)
        if due and (last or out_of_budget):
            return out_of_budget, self.state.best_val is None \
                or budget.affords_final(schedule.last_cost)  # fmt: skip
        return out_of_budget, due and budget.affords_validation(schedule.last_cost, points)

    def validation_set(self) -> Tensor:
        points = self.state.val_points
        return self.val_data if points is None else self.val_data[:points]

    def validate(self, done: int) -> float:
        """The validation NLL (of the EMA weights, if any, which ``best.pt`` then holds)."""
        with nullcontext() if self.ema is None else self.ema.applied():
            Y = self.validation_set()
            val_nll, cost = self.timed_nll(Y, f"validating {len(Y)} points")
            self.schedule.done(cost, self.budget.elapsed())
            if not math.isfinite(val_nll):  # a model that gives up on held-out data diverged
                raise self.diverged("validation NLL", val_nll, done)
            if self.state.best_val is None or val_nll < self.state.best_val:
                self.state.best_val, self.state.best_iteration = val_nll, done
                self.saver.save_best(done, val_nll)
            return val_nll

    def timed_nll(self, Y: Tensor, what: str) -> tuple[float, float]:
        """The mean NLL of ``Y`` and what it cost (charged to validation)."""
        state, budget = self.state, self.budget
        start = state.val.seconds(self.kind)
        with paused(state.train), state.val, \
                self.display.blocking(what, self.schedule.last_cost), \
                isolated_rng(derive_seed(self.config.seed, "validation"), self.device):  # fmt: skip
            nll = distributed_mean_nll(self.model, Y, self.config.batch_size)
        cost = state.val.seconds(self.kind) - start
        if budget.sync is not None:
            cost = budget.sync(cost)
        budget.add_validation(cost)
        return nll, cost

    def price_validation(self) -> None:
        """Price a validation by timing a few of its points, before the first one, and keep
        to the points that the budget affords (`TrainConfig.val_share`)."""
        val_data, budget = self.val_data, self.budget
        probe = val_data[:PROBE_POINTS]
        per_point = self.timed_nll(probe, f"pricing validation on {len(probe)} points")[1] \
            / len(probe)  # fmt: skip
        points = self.state.val_points or budget.validation_points(
            per_point, len(val_data), PROBE_POINTS)  # fmt: skip
        if points < len(val_data) and self.state.val_points is None:
            self.state.val_points = points
            self.display.write(
                f"{self.run_dir.name}: validating on the first {points} of {len(val_data)} "
                f"points (all would take ~{minutes(per_point * len(val_data))} {self.kind} "
                f"min of a {minutes(budget.limit_s)}-min budget)")  # fmt: skip
        self.schedule.last_cost = per_point * points

    # ------------------------------------------------------------------ failures
    def diverged(self, what: str, value: float, at: int) -> TrainingDiverged:
        good = "none written yet"
        if self.state.saved_iteration is not None:
            good = f"{self.last_path} (iteration {self.state.saved_iteration})"
        msg = (
            f"training diverged at iteration {at}: non-finite {what} "
            f"({value}); the bad update was not saved. Last good checkpoint: {good}. "
            "Try a smaller lr, grad_clip, or tighter ODE tolerances."
        )
        logger.error(msg)
        return TrainingDiverged(msg, self.result("diverged", msg))

    def interrupted(self) -> TrainingInterrupted:
        """Save what Ctrl-C left (the last finished step, with the RNG of the step that was
        cut short, so a resumed run goes on as an uninterrupted one would) and say so."""
        self.state.train.stop()
        self.display.close()
        state, saved = self.state, False
        state.stopped = "interrupted"
        if not (self.updating or self.parallel):
            try:
                self.checkpoint(self.step_rng)
                saved = True
            except TrainingDiverged:
                pass
        if saved or state.saved_iteration is not None:
            what = f"saved {self.last_path} at iteration {state.saved_iteration}"
        else:
            what = "nothing saved yet"
        return TrainingInterrupted(f"interrupted: {what}", self.last_path,
                                   state.saved_iteration)  # fmt: skip


def _start_display(display: Progress, config: TrainConfig, iteration: int,
                   limit_s: float | None, phase: str = "training") -> None:  # fmt: skip
    """A count of iterations; when a budget bounds the run, the share (in permille) of
    the budget or of the iterations done, whichever is ahead, so that the bar ends when
    whichever comes first ends."""
    if limit_s is None:  # iterations is set: train() refuses None without a budget
        display.start(phase, config.iterations, bar_text="{n_fmt}/{total_fmt} it")
        display.update(iteration)
        return
    text = f"of {minutes(limit_s)} {config.clock} min"
    if config.iterations is not None:
        text += " or the iterations"
    display.start(phase, 1000.0, bar_text=text)


def _show(display: Progress, budget: BudgetClock, config: TrainConfig, done: int, loss: float,
          stats: dict, lr: float, best_val: float | None) -> None:  # fmt: skip
    """Move the line to ``done`` iterations, with the step's numbers and the time left."""
    if not display.enabled:
        return
    steps = done - budget.start_iteration
    limit = math.inf if config.iterations is None else config.iterations
    share = max(budget.share(), steps / (limit - budget.start_iteration))
    postfix = {}
    if budget.limit_s is not None:
        postfix["it"] = f"{done}" + ("" if config.iterations is None else f"/{config.iterations}")
    postfix.update(loss=f"{loss:.4f}", nfe=str(stats.get("nfe", "-")), lr=f"{lr:.1e}")
    if best_val is not None:
        postfix["best_val"] = f"{best_val:.4f}"
    left = budget.spent() * (1 / share - 1) if share > 0 else math.inf
    if math.isfinite(left):
        postfix["left"] = f"~{minutes(left)} {budget.kind} min"
    if budget.limit_s is None:
        display.update(done, postfix)
    else:
        display.update(min(1000.0, 1000.0 * share), postfix)


@contextmanager
def paused(watch: Stopwatch) -> Iterator[None]:
    """Stop ``watch`` for the block (validation and callbacks are not training)."""
    running = watch.running
    watch.stop()
    try:
        yield
    finally:
        if running:
            watch.start()
