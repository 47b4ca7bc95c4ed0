"""The training loop: ``train(model, data, config, run_dir)``, generic over models/objectives.

A run directory holds ``config.json`` (resolved config), ``last.pt`` (everything needed to
resume bit-exactly), ``best.pt`` (best validation model) and ``metrics.jsonl``.

The loop itself is the step and the order of things; its parts live beside it: the budget
clock (`budget`), the validation schedule (`schedule`), the checkpoints (`checkpointer`) and
the progress line (`progress`). Under ``torchrun --nproc_per_node N`` the same call trains
data-parallel (see `distributed`); rank 0 alone writes the run directory and shows progress.
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

    The model is moved in place to ``config.device`` / ``config.dtype``. On a fresh run the
    global RNGs are seeded from ``config.seed``; on resume they are restored, so an
    interrupted and resumed run ends with the same parameters as an uninterrupted one
    (bit-exact on CPU; on GPU as far as the kernels are deterministic). Ctrl-C between two
    steps or during one saves ``last.pt`` as of the last finished step and raises
    `TrainingInterrupted`, whose message says what was saved.

    Launched by torchrun with N processes, it trains data-parallel (DistributedDataParallel):
    each rank takes ``batch_size / N`` points of the same global batch, draws its own noise
    (Hutchinson, flow-matching times and prior points) from the global RNG seeded by
    ``(seed, rank)`` and checkpointed per rank, and the averaged gradient is the global-batch
    one, so ``lr`` keeps its meaning. Validation is sharded in chunks and gives the
    single-process value. Rank 0 writes the files; every rank resumes from ``last.pt``.
    An adaptive ODE solver picks one step size per rank's batch, so MLE training matches a
    single process up to the solver tolerance; with ``"fm-ot"`` the pairing is per rank.

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
    if config.iterations is None and config.budget_minutes is None \
            and config.total_budget_minutes is None:
        raise ValueError("iterations=None trains until a budget runs out: set budget_minutes "
                         "or total_budget_minutes")
    parallel = dd.init()  # False unless launched by torchrun with several processes
    main = dd.is_main()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    last_path = run_dir / "last.pt"
    if last_path.exists() and not resume:
        raise FileExistsError(f"{last_path} exists: pass resume=True or use a new run_dir")
    device, dtype = dd.device_for(resolve_device(config.device)), resolve_dtype(config.dtype)
    model.to(device=device, dtype=dtype).train()
    manifold = model_manifold(model)  # a flow on Gr(k, D) gets orthonormality checks too
    stream = make_batches(data, config.batch_size, config.seed, device, dtype, manifold)
    if parallel:
        dd.check_batch_size(config.batch_size)
        stream = dd.ShardedBatches(stream)
    if val_data is not None:
        check_points(val_data, "val_data", manifold)
        val_data = val_data.to(device=device, dtype=dtype)
    optimizer, scheduler = make_optimizer(model, config)
    ema = None if config.ema_decay is None else ParameterEMA(
        [p for group in optimizer.param_groups for p in group["params"]], config.ema_decay)
    state = TrainState()
    if resume and last_path.exists():
        state = load_last(
            last_path, config, model, optimizer, scheduler, stream, dd.rank(), dd.world(), ema
        )
    else:  # rank 0 (and a single process) uses the (seed, "global") stream
        seed_all(derive_seed(config.seed, "global", dd.rank()))
    step = dd.DataParallelStep(model, objective, device) if parallel else None
    metrics = None
    if main:
        write_json(config.replace(device=str(device)).to_dict(), run_dir / "config.json")
        metrics = MetricsLog(run_dir / "metrics.jsonl", keep_until=state.iteration)
    if setup is not None:
        setup.stop()
        state.setup.cpu += setup.cpu
        state.setup.wall += setup.wall
    kind, threads = config.clock, torch.get_num_threads()
    timed = config.budget_minutes is not None or config.total_budget_minutes is not None \
        or config.val_every_minutes is not None  # fmt: skip
    budget = BudgetClock(config, state, dd.max_over_ranks if parallel and timed else None)
    schedule = ValidationSchedule(config, budget.elapsed())
    saver = Checkpointer(run_dir, config, model, optimizer, scheduler, stream, write=main,
                         gather_rng=(lambda: dd.all_gather_objects(capture_rng_state()))
                         if parallel else None, ema=ema)  # fmt: skip

    def result(stopped: str, message: str) -> TrainResult:
        return TrainResult(
            iterations=state.iteration,
            final_loss=state.last_loss,
            best_val=state.best_val,
            best_iteration=state.best_iteration,
            stopped=stopped,
            elapsed=budget.elapsed(),
            run_dir=run_dir,
            cpu_seconds=state.train.seconds("cpu"),
            wall_seconds=state.train.seconds("wall"),
            val_cpu_seconds=state.val.seconds("cpu"),
            val_wall_seconds=state.val.seconds("wall"),
            threads=threads,
            message=message,
            last_val_seconds=schedule.last_cost,
            budget_left_seconds=budget.left(),
            val_points=None if val_data is None else len(validation_set()),
        )

    def diverged(what: str, value: float, at: int) -> TrainingDiverged:
        good = "none written yet"
        if state.saved_iteration is not None:
            good = f"{last_path} (iteration {state.saved_iteration})"
        msg = (
            f"training diverged at iteration {at}: non-finite {what} "
            f"({value}); the bad update was not saved. Last good checkpoint: {good}. "
            "Try a smaller lr, grad_clip, or tighter ODE tolerances."
        )
        logger.error(msg)
        return TrainingDiverged(msg, result("diverged", msg))

    def checkpoint(rng: dict | None = None) -> None:
        if not saver.save_last(state, rng):
            raise diverged("parameters", float("nan"), state.iteration)

    def timed_nll(Y: Tensor, what: str) -> tuple[float, float]:
        """The mean NLL of ``Y`` and what it cost (charged to validation)."""
        start = state.val.seconds(kind)
        with paused(state.train), state.val, display.blocking(what, schedule.last_cost), \
                isolated_rng(derive_seed(config.seed, "validation"), device):  # fmt: skip
            nll = distributed_mean_nll(model, Y, config.batch_size)
        cost = state.val.seconds(kind) - start
        if budget.sync is not None:
            cost = budget.sync(cost)
        budget.add_validation(cost)
        return nll, cost

    def validation_set() -> Tensor:
        return val_data if state.val_points is None else val_data[: state.val_points]

    def validate(done: int) -> float:
        """The validation NLL (of the EMA weights, if any, which ``best.pt`` then holds)."""
        with nullcontext() if ema is None else ema.applied():
            return _validate(done)

    def _validate(done: int) -> float:
        Y = validation_set()
        val_nll, cost = timed_nll(Y, f"validating {len(Y)} points")
        schedule.done(cost, budget.elapsed())
        if not math.isfinite(val_nll):  # a model that gives up on held-out data has diverged
            raise diverged("validation NLL", val_nll, done)
        if state.best_val is None or val_nll < state.best_val:
            state.best_val, state.best_iteration = val_nll, done
            saver.save_best(done, val_nll)
        return val_nll

    def price_validation() -> None:
        """Price a validation by timing a few of its points, before the first one, and keep
        to the points that the budget affords (`TrainConfig.val_share`)."""
        probe = val_data[:PROBE_POINTS]
        per_point = timed_nll(probe, f"pricing validation on {len(probe)} points")[1] \
            / len(probe)  # fmt: skip
        points = state.val_points or budget.validation_points(per_point, len(val_data),
                                                              PROBE_POINTS)  # fmt: skip
        if points < len(val_data) and state.val_points is None:
            state.val_points = points
            display.write(
                f"{run_dir.name}: validating on the first {points} of {len(val_data)} points "
                f"(all would take ~{minutes(per_point * len(val_data))} {kind} min of a "
                f"{minutes(budget.limit_s)}-min budget)")  # fmt: skip
        schedule.last_cost = per_point * points

    def decide(done: int, last: bool) -> tuple[bool, bool]:
        """Whether the budget ends training after step ``done``, and whether to validate:
        at the schedule's times, priced first if validation is charged and its cost
        unknown, and only if the budget affords it (the final one: if a best model exists,
        only if it fits)."""
        points = 1 if val_data is None else len(validation_set())
        out_of_budget = not last and budget.out_of_budget(schedule.last_cost, points)
        due = val_data is not None and schedule.due(done, last or out_of_budget, budget.elapsed())
        if due and not (last or out_of_budget) and schedule.last_cost is None \
                and budget.prices_validation(len(val_data), PROBE_POINTS):  # fmt: skip
            price_validation()
            points = len(validation_set())
            out_of_budget = budget.out_of_budget(schedule.last_cost, points)
        if due and (last or out_of_budget):
            return out_of_budget, state.best_val is None \
                or budget.affords_final(schedule.last_cost)  # fmt: skip
        return out_of_budget, due and budget.affords_validation(schedule.last_cost, points)

    limit = math.inf if config.iterations is None else config.iterations
    of_limit = "" if config.iterations is None else f"/{config.iterations}"
    if budget.exhausted() and state.iteration < limit:
        message = (
            f"total budget of {config.total_budget_minutes:g} min already spent "
            f"({budget.elapsed() / 60:.2f} {kind} min, {state.iteration} iterations): nothing "
            "to train; raise total_budget_minutes to continue"
        )
        logger.info(message)
        return result("budget", message)
    state.spent_total_budget = None  # set again if this invocation's total budget runs out
    state.stopped = None  # until this invocation ends
    shared = isinstance(progress, Progress)  # a command's line: name the part trained
    display = progress if shared else Progress(run_dir.name, enabled=progress, kind=kind)
    display.enabled = display.enabled and main
    _start_display(display, config, state.iteration, budget.limit_s,
                   f"{run_dir.name} training" if shared else "training")  # fmt: skip
    stopped, message = "done", ""
    step_rng, updating = None, False  # the RNG at the start of an unfinished step
    state.train.start()
    try:
        while state.iteration < limit:
            step_rng = capture_rng_state() if step is None else None
            batch = stream.batch(state.iteration)
            optimizer.zero_grad(set_to_none=True)
            if step is None:
                loss, stats = objective(model, batch)
                loss_value = float(loss.detach())
                if math.isfinite(loss_value):
                    loss.backward()
            else:  # DDP all-reduces the gradients; loss_value is the global batch's
                loss_value, stats = step.loss_and_backward(batch, stream.fraction)
            if not math.isfinite(loss_value):
                raise diverged("loss", loss_value, state.iteration + 1)
            max_norm = math.inf if config.grad_clip is None else config.grad_clip
            # returns the norm before clipping, which is what we log
            grad_norm = float(torch.nn.utils.clip_grad_norm_(saver.params, max_norm))
            if not math.isfinite(grad_norm):
                raise diverged("gradient norm", grad_norm, state.iteration + 1)
            lr = optimizer.param_groups[0]["lr"]
            updating = True  # an interrupt here leaves a half-updated model: not saved
            optimizer.step()
            if ema is not None:
                ema.update(state.iteration + 1)
            if scheduler is not None:
                scheduler.step()
            state.iteration += 1
            state.last_loss = loss_value
            updating, step_rng = False, None
            done, last = state.iteration, state.iteration == limit
            budget.tick()

            out_of_budget, val_due = decide(done, last)
            final = last or out_of_budget  # log (and validate, budget permitting) the last one
            log_due = done % config.log_every == 0 or final
            if log_due or val_due:
                record = make_record(done, loss_value, stats, lr, grad_norm, budget.elapsed())
                record["cpu_s"] = state.train.seconds("cpu")
                record["wall_s"] = state.train.seconds("wall")
                if val_due:
                    record["val_nll"] = validate(done)
                    # how hard the flow is to integrate: NFE of the last validation chunk
                    record["val_nfe"] = getattr(model, "last_stats", {}).get("nfe")
                if metrics is not None:
                    metrics.append(record)
                if callback is not None:
                    with paused(state.train), isolated_rng(
                        derive_seed(config.seed, "callback", done), device
                    ):
                        callback(done, model, record)
            _show(display, budget, config, done, loss_value, stats, lr, state.best_val)
            if out_of_budget:
                # recorded in last.pt, so a rerun with the same total does not train again
                state.spent_total_budget = config.total_budget_minutes if budget.by_total \
                    else None  # fmt: skip
            if final:
                state.stopped = "budget" if out_of_budget else "done"
            if done % config.checkpoint_every == 0 or final:
                checkpoint()
            if out_of_budget:
                stopped = "budget"
                which = (f"total budget of {config.total_budget_minutes:g}" if budget.by_total
                         else f"budget of {config.budget_minutes:g}")  # fmt: skip
                message = (
                    f"{which} {kind} min reached at iteration {done}{of_limit} "
                    f"({budget.elapsed() / 60:.2f} {kind} min trained, {threads} thread(s)); "
                    f"saved {last_path}; "
                    "rerun with resume=True (and a larger budget) to continue"
                )
                break
        else:
            message = f"done: {state.iteration}{of_limit} iterations"
    except KeyboardInterrupt as interrupt:
        state.train.stop()
        display.close()
        raise _interrupted(state, checkpoint, step_rng, updating or parallel,
                           last_path) from interrupt  # fmt: skip
    finally:
        state.train.stop()
        if not shared:  # a shared line is the caller's to close
            display.close()
    dd.barrier()  # rank 0's files are complete when train returns on any rank
    display.write(message)
    logger.info(message)
    return result(stopped, message)


def _interrupted(state: TrainState, checkpoint, step_rng, unsafe: bool,
                 last_path: Path) -> TrainingInterrupted:  # fmt: skip
    """Save what Ctrl-C left (the last finished step, with the RNG of the step that was cut
    short, so a resumed run goes on as an uninterrupted one would) and say so."""
    saved = False
    state.stopped = "interrupted"
    if not unsafe:
        try:
            checkpoint(step_rng)
            saved = True
        except TrainingDiverged:
            pass
    if saved or state.saved_iteration is not None:
        what = f"saved {last_path} at iteration {state.saved_iteration}"
    else:
        what = "nothing saved yet"
    return TrainingInterrupted(f"interrupted: {what}", last_path, state.saved_iteration)


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
