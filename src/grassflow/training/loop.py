"""The training loop: ``train(model, data, config, run_dir)``, generic over models/objectives.

A run directory holds ``config.json`` (resolved config), ``last.pt`` (everything needed to
resume bit-exactly), ``best.pt`` (best validation model) and ``metrics.jsonl``.

Under ``torchrun --nproc_per_node N`` the same call trains data-parallel (see
`distributed`); rank 0 alone writes the run directory and shows the progress bar.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from . import distributed as dd
from .batches import Sampler, check_points, make_batches, model_manifold
from .checkpoint import atomic_save, write_json
from .clock import Stopwatch
from .config import TrainConfig, resolve_device, resolve_dtype
from .metrics_log import MetricsLog, make_record
from .objectives import Objective, nll_objective
from .parallel_eval import distributed_mean_nll
from .result import TrainingDiverged, TrainResult
from .rng import capture_rng_state, derive_seed, isolated_rng, seed_all
from .state import TrainState, load_last, make_optimizer, save_last

__all__ = ["TrainResult", "TrainingDiverged", "train"]

logger = logging.getLogger(__name__)

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
    progress: bool = True,
    callback: Callback | None = None,
) -> TrainResult:
    """Train ``model`` with Adam on ``objective`` (default: mean NLL), resumably.

    The model is moved in place to ``config.device`` / ``config.dtype``. On a fresh run the
    global RNGs are seeded from ``config.seed``; on resume they are restored, so an
    interrupted and resumed run ends with the same parameters as an uninterrupted one
    (bit-exact on CPU; on GPU as far as the kernels are deterministic).

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
        val_data: validation points ``(M, D, k)``; the NLL is evaluated every
            ``config.val_every`` iterations and at the end, and the best model is ``best.pt``.
        objective: ``objective(model, batch) -> (loss, stats)``.
        resume: continue from ``run_dir/last.pt`` if it exists. Fields that change the
            trajectory (``TRAJECTORY_FIELDS``) must equal the checkpoint's; ``iterations``,
            logging, budget and device may change.
        progress: show a tqdm bar with loss, NFE, lr and ETA.
        callback: ``callback(iteration, model, record)`` after each metrics line (e.g. to
            draw pictures); it runs with isolated RNG so it cannot perturb training.

    Returns:
        A ``TrainResult``; ``stopped`` is ``"done"`` or ``"budget"``.

    Raises:
        TrainingDiverged: non-finite loss, gradient or parameters; nothing bad is saved.
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
    state = TrainState()
    if resume and last_path.exists():
        state = load_last(
            last_path, config, model, optimizer, scheduler, stream, dd.rank(), dd.world()
        )
    else:  # rank 0 (and a single process) uses the (seed, "global") stream
        seed_all(derive_seed(config.seed, "global", dd.rank()))
    step = dd.DataParallelStep(model, objective, device) if parallel else None
    metrics = None
    if main:
        write_json(config.replace(device=str(device)).to_dict(), run_dir / "config.json")
        metrics = MetricsLog(run_dir / "metrics.jsonl", keep_until=state.iteration)
    kind, threads = config.clock, torch.get_num_threads()
    start_iteration, start_s = state.iteration, state.train.seconds(kind)
    budget_s, by_total = _invocation_limit(config, state)
    val_period_s = None if config.val_every_minutes is None else 60.0 * config.val_every_minutes
    synced = None  # with several ranks: the slowest rank's training seconds since start_s
    sync_clock = parallel and (budget_s is not None or val_period_s is not None)
    # time-based validation waits val_period_s of training after the last one, or as long
    # as that one took if longer: validation then never takes more than half the time
    last_val_s, val_wait_s = start_s, val_period_s
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def since_start() -> float:
        return state.train.seconds(kind) - start_s if synced is None else synced

    def elapsed() -> float:  # training seconds of the run on the budget clock
        return start_s + since_start()

    def result(stopped: str, message: str) -> TrainResult:
        return TrainResult(
            iterations=state.iteration,
            final_loss=state.last_loss,
            best_val=state.best_val,
            best_iteration=state.best_iteration,
            stopped=stopped,
            elapsed=elapsed(),
            run_dir=run_dir,
            cpu_seconds=state.train.seconds("cpu"),
            wall_seconds=state.train.seconds("wall"),
            val_cpu_seconds=state.val.seconds("cpu"),
            val_wall_seconds=state.val.seconds("wall"),
            threads=threads,
            message=message,
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

    def checkpoint() -> None:
        if state.saved_iteration == state.iteration:
            return
        if not all(bool(torch.isfinite(p).all()) for p in params):
            raise diverged("parameters", float("nan"), state.iteration)
        rng_ranks = dd.all_gather_objects(capture_rng_state()) if parallel else None
        if main:
            save_last(last_path, state, config, model, optimizer, scheduler, stream, rng_ranks)
        state.saved_iteration = state.iteration

    def validate(done: int) -> float:
        nonlocal last_val_s, val_wait_s
        start = state.val.seconds(kind)
        with paused(state.train), state.val, isolated_rng(
            derive_seed(config.seed, "validation"), device
        ):
            val_nll = distributed_mean_nll(model, val_data, config.batch_size)
        cost = state.val.seconds(kind) - start
        if sync_clock:
            cost = dd.max_over_ranks(cost)
        last_val_s = elapsed()
        if val_period_s is not None:
            val_wait_s = max(val_period_s, cost)
        if not math.isfinite(val_nll):  # a model that gives up on held-out data has diverged
            raise diverged("validation NLL", val_nll, done)
        if state.best_val is None or val_nll < state.best_val:
            state.best_val, state.best_iteration = val_nll, done
            best = {"model": model.state_dict(), "iteration": done, "val_nll": val_nll}
            if main:
                atomic_save({**best, "config": config.to_dict()}, run_dir / "best.pt")
        return val_nll

    limit = math.inf if config.iterations is None else config.iterations
    of_limit = "" if config.iterations is None else f"/{config.iterations}"
    if budget_s is not None and budget_s <= 0 and state.iteration < limit:
        message = (
            f"total budget of {config.total_budget_minutes:g} min already spent "
            f"({elapsed() / 60:.2f} {kind} min, {state.iteration} iterations): nothing to train; "
            "raise total_budget_minutes to continue"
        )
        logger.info(message)
        return result("budget", message)
    state.spent_total_budget = None  # set again if this invocation's total budget runs out
    bar = _progress_bar(config, state.iteration, budget_s, run_dir.name, progress and main)
    stopped, message = "done", ""
    state.train.start()
    try:
        while state.iteration < limit:
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
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            if not math.isfinite(grad_norm):
                raise diverged("gradient norm", grad_norm, state.iteration + 1)
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            state.iteration += 1
            state.last_loss = loss_value
            done, last = state.iteration, state.iteration == limit
            if sync_clock:  # time-based decisions must agree, or the ranks part ways
                synced = dd.max_over_ranks(state.train.seconds(kind) - start_s)

            # stop if one more step, at the mean pace, would overrun the budget
            out_of_budget = (
                budget_s is not None
                and not last
                and since_start() * (1 + 1 / (done - start_iteration)) > budget_s
            )
            final = last or out_of_budget  # always log and validate the final iteration
            log_due = done % config.log_every == 0 or final
            val_due = val_data is not None and (
                final
                or (config.val_every is not None and done % config.val_every == 0)
                or (val_wait_s is not None and elapsed() - last_val_s >= val_wait_s)
                or _is_doubling(done, config.val_doubling_from)
            )
            if log_due or val_due:
                record = make_record(done, loss_value, stats, lr, grad_norm, elapsed())
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
            if budget_s is None:
                bar.update(1)
            else:  # the share of the budget or of the iterations done, whichever is ahead
                share = max(since_start() / max(budget_s, 1e-9),
                            (done - start_iteration) / (limit - start_iteration))
                bar.update(min(1000.0, 1000.0 * share) - bar.n)
            postfix = _postfix(loss_value, stats, lr, state.best_val)
            if budget_s is not None:
                postfix = {"it": f"{done}{of_limit}", **postfix}
            bar.set_postfix(postfix, refresh=False)
            if out_of_budget:
                # recorded in last.pt, so a rerun with the same total does not train again
                state.spent_total_budget = config.total_budget_minutes if by_total else None
            if done % config.checkpoint_every == 0 or final:
                checkpoint()
            if out_of_budget:
                stopped = "budget"
                which = (f"total budget of {config.total_budget_minutes:g}" if by_total
                         else f"budget of {config.budget_minutes:g}")  # fmt: skip
                message = (
                    f"{which} {kind} min reached at iteration {done}{of_limit} "
                    f"({elapsed() / 60:.2f} {kind} min trained, {threads} thread(s)); "
                    f"saved {last_path}; "
                    "rerun with resume=True (and a larger budget) to continue"
                )
                break
        else:
            message = f"done: {state.iteration}{of_limit} iterations"
    finally:
        state.train.stop()
        bar.close()
    dd.barrier()  # rank 0's files are complete when train returns on any rank
    if progress and main:
        tqdm.write(message)
    logger.info(message)
    return result(stopped, message)


def _invocation_limit(config: TrainConfig, state: TrainState) -> tuple[float | None, bool]:
    """Seconds this invocation may train (None: unlimited) and whether the run's total
    budget, rather than the per-invocation one, sets that limit."""
    budget_s = None if config.budget_minutes is None else 60.0 * config.budget_minutes
    total = config.total_budget_minutes
    if total is None:
        return budget_s, False
    spent = state.spent_total_budget is not None and total <= state.spent_total_budget
    left_s = 0.0 if spent else 60.0 * total - state.train.seconds(config.clock)
    if budget_s is not None and budget_s < left_s:
        return budget_s, False
    return left_s, True


def _progress_bar(
    config: TrainConfig, iteration: int, limit_s: float | None, name: str, enabled: bool
) -> tqdm:
    """Counts iterations; when a budget bounds the run, the share (in permille) of
    the budget or of the iterations done, whichever is ahead, so that the ETA is the end of
    whichever comes first rather than that of ``config.iterations`` alone."""
    common = {"disable": not enabled, "desc": name, "dynamic_ncols": True}
    if limit_s is None:  # iterations is set: train() refuses None without a budget
        return tqdm(total=config.iterations, initial=iteration, **common)
    budget = f"{limit_s / 60:.3g} {config.clock} min"
    if config.iterations is not None:
        budget += " or the iterations"
    return tqdm(
        total=1000.0,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| of " + budget + " "
        "[{elapsed}<{remaining}{postfix}]",
        **common,
    )


def _is_doubling(iteration: int, start: int | None) -> bool:
    """Whether ``iteration`` is ``start * 2^j`` for some j >= 0."""
    if start is None or iteration % start:
        return False
    q = iteration // start
    return q & (q - 1) == 0


def _postfix(loss: float, stats: dict, lr: float, best_val: float | None) -> dict[str, str]:
    postfix = {"loss": f"{loss:.4f}", "nfe": str(stats.get("nfe", "-")), "lr": f"{lr:.1e}"}
    if best_val is not None:
        postfix["best_val"] = f"{best_val:.4f}"
    return postfix


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
