"""A reference coupling flow in internal coordinates beside ``grassflow train --data`` on the
same split and CPU budget (issue 46: the target is within 10 nats of it).

Run (one core; the grassflow run first, then the reference on its split)::

    PYTHONPATH=src python experiments/molecules/real_molecules.py --minutes 20 \\
        --molecules butan-1-ol --minimized --n-conformers 1500 --models internal \\
        --runs runs/real_molecules --out results
    PYTHONPATH=src python experiments/internal_coordinates/reference_flow.py \\
        --run runs/real_molecules/butan-1-ol-minimized/internal --minutes 20 \\
        --out results/reference_flow

A rerun with another ``--run`` on the same data reuses the trained reference (its checkpoint
``OUT.pt``) and adds that run's row.

The reference is the design the issue measured (written here, not `grassflow.nn`):

* 8 coupling layers of rational-quadratic splines (zuko's ``MonotonicRQSTransform`` on
  [-5, 5] for bonds and angles, zuko's ``CircularRQSTransform`` for the torsions), each
  conditioner 2 x 256 (ReLU), reading each torsion as (cos, sin); every layer moves a
  fixed random half of the features;
* bonds and angles standardized one by one, torsions as they are;
* a N(0, 1) x uniform base;
* Adam (lr ``--lr``, no weight decay), batch 256, the learning rate decayed to 0 by a cosine
  over the budget; validation every 100 steps on the run's validation split, charged to
  the budget (CPU seconds of this process, as ``--minutes`` in grassflow); the best
  validation is kept.

It plugs into the same `grassflow.InternalFlow` coordinates as the run (its Z-matrix, the
geminal/side swaps and the mirror symmetrization, the rigid-body and Jacobian terms), so
both NLLs are exact, in nats per molecule on the centred coordinates, on the run's own
test conformers; only the flow on the internal coordinates and its training differ.
Checkpoints every ``--checkpoint-seconds`` make a rerun continue an interrupted one.

Reported: test NLL ± SEM of both on the whole test split, the reference's validation curve
and best step, and of 1,000 samples of each the share that keep every bond within 10 % of
its mean test length and the clashes (two atoms closer than 0.9 Å). ``OUT.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from grassflow.flows.internal_flow import InternalFlow
from grassflow.tasks import shape_runs as shapes
from grassflow.training.threads import set_threads
from grassflow_paper import provenance

TWO_PI = 2 * math.pi


class Layer(nn.Module):
    """One coupling layer: splines on the features in ``moved``, conditioned on the rest."""

    def __init__(self, circular: Tensor, moved: Tensor, hidden: int, bins: int):
        super().__init__()
        self.bins = bins
        self.register_buffer("kept", (~moved).nonzero()[:, 0])
        self.register_buffer("moved", moved.nonzero()[:, 0])
        self.register_buffer("kept_circ", circular[~moved])
        self.register_buffer("moved_circ", circular[moved])
        width = int((~self.kept_circ).sum()) + 2 * int(self.kept_circ.sum())
        out = len(self.moved) * (3 * bins - 1)
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, out))  # fmt: skip
        nn.init.zeros_(self.net[-1].weight)  # each layer the identity at first
        nn.init.zeros_(self.net[-1].bias)

    def splines(self, x_kept: Tensor) -> tuple:
        from zuko.flows.spline import CircularRQSTransform
        from zuko.transforms import MonotonicRQSTransform

        c = self.kept_circ
        h = torch.cat([x_kept[..., ~c], x_kept[..., c].cos(), x_kept[..., c].sin()], -1)
        p = self.net(h).unflatten(-1, (len(self.moved), 3 * self.bins - 1))
        p = p.split([self.bins, self.bins, self.bins - 1], -1)
        real = [t[..., ~self.moved_circ, :] for t in p]
        circ = [t[..., self.moved_circ, :] for t in p]
        return MonotonicRQSTransform(*real, bound=5.0), CircularRQSTransform(*circ)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        real, circ = self.splines(x[..., self.kept])
        y = x[..., self.moved]
        c = self.moved_circ
        y_r, l_r = real.call_and_ladj(y[..., ~c])
        y_c, l_c = circ.call_and_ladj(y[..., c])
        out = x.clone()
        out[..., self.moved[~c]], out[..., self.moved[c]] = y_r, y_c
        return out, l_r.sum(-1) + l_c.sum(-1)

    def inverse(self, y: Tensor) -> Tensor:
        real, circ = self.splines(y[..., self.kept])
        z, c = y[..., self.moved], self.moved_circ
        out = y.clone()
        out[..., self.moved[~c]] = real.inv(z[..., ~c])
        out[..., self.moved[c]] = torch.remainder(circ.inv(z[..., c]) + math.pi, TWO_PI) - math.pi
        return out


class ReferenceFlow(nn.Module):
    """The reference's flow on R^a x T^c, with the interface `InternalFlow` calls on its
    ``flow`` (``to_base``, ``from_base``, ``base_log_prob``, ``sample_base``)."""

    def __init__(self, circular: Tensor, layers: int = 8, hidden: int = 256, bins: int = 8):
        super().__init__()
        m = len(circular)
        self.register_buffer("circular", circular.clone())
        g = torch.Generator().manual_seed(1)
        masks = []
        for _ in range(layers):
            moved = torch.zeros(m, dtype=torch.bool)
            moved[torch.randperm(m, generator=g)[: m // 2]] = True
            masks.append(moved)
        self.layers = nn.ModuleList(Layer(circular, mk, hidden, bins) for mk in masks)

    def to_base(self, x: Tensor) -> tuple[Tensor, Tensor]:
        ladj = x.new_zeros(x.shape[:-1])
        for layer in self.layers:
            x, step = layer(x)
            ladj = ladj + step
        return x, ladj

    def from_base(self, z: Tensor) -> Tensor:
        for layer in reversed(self.layers):
            z = layer.inverse(z)
        return z

    def base_log_prob(self, z: Tensor) -> Tensor:
        r, n_c = z[..., ~self.circular], int(self.circular.sum())
        return -0.5 * r.square().sum(-1) - 0.5 * r.shape[-1] * math.log(TWO_PI) - n_c * math.log(
            TWO_PI)

    def sample_base(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        dtype = self.circular.new_zeros((), dtype=next(self.parameters()).dtype).dtype
        z = torch.randn(n, len(self.circular), dtype=dtype, generator=generator)
        u = (torch.rand(n, len(self.circular), dtype=dtype, generator=generator) * 2 - 1) * math.pi
        return torch.where(self.circular.cpu(), u, z).to(self.circular.device)


def reference_model(run_model: InternalFlow, train: Tensor) -> InternalFlow:
    """The run's coordinates (Z-matrix, swaps, mirror row), bonds and angles standardized one
    by one, torsions raw, and the `ReferenceFlow` on them."""
    cfg = dataclasses.replace(run_model.config, torus=True, whiten="diagonal")
    model = InternalFlow(cfg)
    model.fit_normalization(train)
    model.circ_mean.zero_()  # torsions as they are: the circle's standardization off
    model.circ_width.fill_(1.0)
    model.flow = ReferenceFlow(model.circular).double()
    return model


def quality(model: InternalFlow, test: Tensor, n: int = 1000) -> dict:
    """Bonds kept (each within 10 % of its mean test length) and clashes (< 0.9 Å) of ``n``
    samples."""
    with torch.no_grad():
        S = model.sample(n, torch.Generator().manual_seed(0))
    b = model.bonds
    length = lambda P: (P[:, b[:, 0]] - P[:, b[:, 1]]).norm(dim=-1)
    i, j = torch.triu_indices(S.shape[1], S.shape[1], 1)
    return {"bonds_kept": 1 - ((length(S) / length(test).mean(0) - 1).abs() > 0.1).any(1)
            .double().mean().item(),
            "clashes": ((S[:, i] - S[:, j]).norm(dim=-1) < 0.9).any(1).double().mean().item()}


def nll(model: InternalFlow, X: Tensor) -> dict:
    with torch.no_grad():
        logp = torch.cat([model.log_prob(c) for c in X.split(256)])
    return {"test_nll": -logp.mean().item(), "test_nll_sem": (logp.std() / len(logp) ** 0.5).item()}


def train(model: InternalFlow, splits: dict, seconds: float, lr: float, ckpt: Path,
          checkpoint_seconds: float = 120.0, batch: int = 256) -> dict:  # fmt: skip
    """Train ``model`` (float32) for ``seconds`` CPU seconds, validation included; resumes
    from ``ckpt``. Returns the state of the run (curve, best, steps)."""
    model.float()
    opt = torch.optim.Adam(model.parameters(), lr)
    tr, val = splits["train"].float(), splits["val"].float()
    gen = torch.Generator().manual_seed(0)
    s = {"step": 0, "used": 0.0, "curve": [], "best_val": math.inf, "best_step": 0}
    best = None
    if ckpt.exists():
        c = torch.load(ckpt, weights_only=False)
        model.load_state_dict(c["model"])
        opt.load_state_dict(c["opt"])
        gen.set_state(c["gen"])
        s, best = c["state"], c["best"]
    start, saved = time.process_time() - s["used"], time.process_time()
    running = []
    save = lambda: torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                               "gen": gen.get_state(), "state": s, "best": best}, ckpt)
    while (used := time.process_time() - start) < seconds:
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * used / seconds))
        loss = -model.log_prob(tr[torch.randint(len(tr), (batch,), generator=gen)]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        s["step"] += 1
        running = (running + [loss.item()])[-100:]
        if s["step"] % 100 == 0:
            with torch.no_grad():
                v = -model.log_prob(val).mean().item()
            s["curve"].append((s["step"], round(v, 3), round(sum(running) / len(running), 3)))
            if v < s["best_val"]:
                s["best_val"], s["best_step"] = v, s["step"]
                best = {k: x.clone() for k, x in model.state_dict().items()}
        s["used"] = time.process_time() - start
        if time.process_time() - saved > checkpoint_seconds:
            save()
            saved = time.process_time()
    s["used"] = time.process_time() - start
    save()
    model.load_state_dict(best)
    return s


def markdown(rows: list[dict]) -> str:
    lines = [provenance.made_by(rows).rstrip("\n"), "",
             "Test NLL (nats per molecule, exact, the run's whole test split) of the grassflow run "
             "and of the reference coupling flow trained on the same split for the same CPU "
             "minutes (validation included). Bonds: samples with every bond within 10 % of its "
             "mean test length; clashes: two atoms closer than 0.9 Å (1,000 samples).", "",
             "| data | model | CPU min | test NLL | best step / steps | bonds | clashes | params |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        for who in ("grassflow", "reference"):
            x = r[who]
            lines.append(f"| {r['data']} | {x['name']} | {x['cpu_minutes']:.1f} | "
                         f"{x['test_nll']:.2f} ± {x['test_nll_sem']:.2f} (n={r['n_test']}) | "
                         f"{x['best_step']:,} / "
                         f"{x['steps']:,} | {x['bonds_kept']:.1%} | {x['clashes']:.1%} | "
                         f"{x['params']:,} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="a finished `grassflow train --data` run")
    p.add_argument("--minutes", type=float, default=20.0, help="the reference's CPU budget")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--checkpoint-seconds", type=float, default=120.0)
    p.add_argument("--out", default="results/reference_flow")
    args = p.parse_args()
    set_threads(1)
    torch.manual_seed(0)
    run = Path(args.run)
    exp, ours = shapes.load_run(run)
    if exp.geometry != "internal":
        raise SystemExit(f"{run} is a {exp.geometry} run; the reference is for InternalFlow runs")
    splits = shapes.load_clouds(exp)
    test = splits["test"]
    ref = reference_model(ours, splits["train"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = train(ref, splits, 60 * args.minutes, args.lr, out.with_suffix(".pt"),
                  args.checkpoint_seconds)
    ref.double()
    ours.double()
    status = shapes.training_status(run / "flow")
    metrics = [json.loads(line) for line in (run / "flow" / "metrics.jsonl").read_text()
               .splitlines() if line.strip()]
    val = [(m["iteration"], m["val_nll"]) for m in metrics if m.get("val_nll") is not None]
    row = {
        "data": exp.data, "minutes": args.minutes, "n_test": len(test), "lr": args.lr,
        "grassflow": {"name": f"grassflow ({ours.config.transforms} x {ours.config.hidden}, "
                              f"torus={ours.config.torus})", **nll(ours, test),
                      **quality(ours, test), "steps": status["iterations"],
                      "best_step": min(val, key=lambda v: v[1])[0] if val else 0,
                      "cpu_minutes": status["cpu_minutes"] + (status["val_cpu_minutes"] or 0.0),
                      "val_curve": val,
                      "params": sum(x.numel() for x in ours.parameters())},
        "reference": {"name": "reference (8 x 2 x 256)", **nll(ref, test), **quality(ref, test),
                      "steps": state["step"], "best_step": state["best_step"],
                      "cpu_minutes": state["used"] / 60, "val_curve": state["curve"],
                      "params": sum(x.numel() for x in ref.parameters())},
        "command": provenance.command(),
    }  # fmt: skip
    path = out.with_suffix(".json")
    rows = json.loads(path.read_text()) if path.exists() else []
    key = lambda r: (r["run"], r["minutes"])
    row["run"] = str(run)
    rows = [r for r in rows if key(r) != key(row)]
    rows.append(row)
    path.write_text(json.dumps(rows, indent=1))
    out.with_suffix(".md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
