"""Why `grassflow.InternalFlow`'s validation NLL peaks after a few hundred steps (issue 46):
each suspect switched on its own, trained alike for a fixed CPU budget, with the whole
validation curve kept.

Run (one core; ``--seconds`` CPU seconds of training per variant and molecule)::

    PYTHONPATH=src python experiments/internal_coordinates/keeps_learning.py \\
        --molecules butanol-minimized l-alanine-dipeptide --seconds 180 \\
        --out results/keeps_learning

Data: ``butanol-minimized``: 1,500 ETKDG embeddings of butan-1-ol (15 atoms), each
MMFF94-minimized (`grassflow.data.conformers.minimized_ensemble`, the kind of file users
bring); the others: the thermal MMFF94 ensembles of ``experiments/molecules/
real_molecules.py`` (3,000 conformers from 16 chains), made there or here. Every variant
sees the same seeded 80/10/10 split.

Variants (``VARIANTS``): ``issue41`` is what ``grassflow train --data`` trains (issue 41's
design, still the default after issue 46: zuko's autoregressive NSF, 3 transforms of
64 x 64, cut torsions, full whitening, an 8-component mixture base, trained; Adam lr 1e-3,
L2 weight decay 1e-4, batch 128); each other changes one thing: ``diagonal`` (each
coordinate standardized alone), ``coupling`` (two-pass coupling NSF), ``one-gaussian``
(a one-component base), ``big`` (8 transforms of 256 x 256), ``lr3e-4``, ``cosine`` (the
lr decays to 0 over the budget), ``batch512``, ``no-decay``, ``clip100`` (gradients clipped
to norm 100), ``frozen-base`` (the fitted mixture not trained,
``InternalFlowConfig(train_base=False)``), ``torus`` (circular splines on the torsions,
coupling layers, a N(0,1) x uniform base,
`grassflow.nn.torus_splines`), and combinations of the winners. The
``torus-*`` rows of a file were made before the circle's standardization
(`grassflow.flows.internal_flow._moebius`) existed; ``moebius-*`` have it.

Reported per variant: the validation curve (every 100 steps), the best step, the test NLL
± SEM at the best validation, the training loss there and at the end, and of 1,000 samples
the share that keep every bond within 10 % of its mean test length and the clashes (two
atoms closer than 0.9 Å). Rows accumulate in ``OUT.json`` / ``OUT.md`` with their command.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from grassflow.data import conformers
from grassflow.data.molecule_files import find_hand
from grassflow.flows.internal_flow import InternalFlow, InternalFlowConfig, choose_mirror_row
from grassflow.manifolds.zmatrix import build_zmatrix
from grassflow.training.threads import set_threads
from grassflow_paper import provenance

SMILES = {"butanol-minimized": "CCCCO", "butane": "CCCC", "glycerol": "OCC(O)CO",
          "cyclohexanol": "OC1CCCCC1", "l-alanine-dipeptide": "CC(=O)N[C@@H](C)C(=O)NC"}  # fmt: skip
ISSUE41 = dict(model=dict(transforms=3, hidden=(64, 64), train_base=True),
               train=dict(lr=1e-3, weight_decay=1e-4, batch=128, cosine=False,
                          clip=None))  # fmt: skip
TORUS = dict(torus=True, transforms=8, hidden=(256, 256), whiten="diagonal")
VARIANTS = {
    "issue41": {},
    "diagonal": dict(model=dict(whiten="diagonal")),
    "coupling": dict(model=dict(passes=2)),
    "one-gaussian": dict(model=dict(components=1)),
    "big": dict(model=dict(transforms=8, hidden=(256, 256))),
    "lr3e-4": dict(train=dict(lr=3e-4)),
    "cosine": dict(train=dict(cosine=True)),
    "batch512": dict(train=dict(batch=512)),
    "no-decay": dict(train=dict(weight_decay=0.0)),
    "clip100": dict(train=dict(clip=100.0)),
    "frozen-base": dict(model=dict(train_base=False)),
    "torus-small": dict(model=dict(torus=True)),
    "torus-small-full": dict(model=dict(torus=True, whiten="full", transforms=8)),
    "torus": dict(model=TORUS, train=dict(weight_decay=0.0)),
    "torus-cosine": dict(model=TORUS, train=dict(weight_decay=0.0, cosine=True)),
    "torus-full": dict(model={**TORUS, "whiten": "full"}, train=dict(weight_decay=0.0)),
    "moebius-small": dict(model=dict(torus=True)),
    "moebius-wd": dict(model=dict(torus=True), train=dict(weight_decay=1e-2)),
    "moebius-lr": dict(model=dict(torus=True), train=dict(lr=3e-4)),
    "moebius-mid": dict(model=dict(torus=True, transforms=6, hidden=(128, 128))),
}


def data(name: str, data_dir: Path, n_conformers: int = 3000):
    """``(X: (N, n, 3) float64, bonds, labels)`` of molecule ``name`` (thermal:
    ``n_conformers`` from ``n_conformers / 187.5`` chains, 16 for 3,000)."""
    if name.endswith("-minimized"):
        path = data_dir / f"{name}-1500-seed0.npz"
        if not path.exists():
            conformers.save_ensemble(path, conformers.minimized_ensemble(SMILES[name], 1500))
        ens = conformers.load_ensemble(path)
    else:
        N = n_conformers
        ens = conformers.cached_ensemble(data_dir / f"{name}-{N}-seed0.npz", SMILES[name], N,
                                         seed=0, n_chains=max(16, round(N / 187.5)))
    X = torch.as_tensor(ens.positions, dtype=torch.float64)
    return X, tuple(map(tuple, ens.bonds.tolist())), tuple(ens.labels[0].tolist())


def split(X: torch.Tensor):
    perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(0))
    k = len(X) // 10
    return X[perm[2 * k:]], X[perm[k: 2 * k]], X[perm[:k]]


def run(name: str, variant: str, seconds: float, data_dir: Path, n_conformers: int = 3000
        ) -> dict:  # fmt: skip
    X, bonds, labels = data(name, data_dir, n_conformers)
    train, val, test = split(X)
    spec = {k: {**ISSUE41[k], **VARIANTS[variant].get(k, {})} for k in ISSUE41}
    n = X.shape[1]
    zm = build_zmatrix(n, bonds, labels)
    mirror = choose_mirror_row(zm, train, labels) if find_hand(train.numpy(), bonds) is None \
        else None  # fmt: skip
    torch.manual_seed(0)
    model = InternalFlow(InternalFlowConfig(n, bonds, labels, mirror_row=mirror,
                                            **spec["model"])).double()  # fmt: skip
    model.fit_normalization(train)
    model.float()
    t = spec["train"]
    opt = torch.optim.Adam(model.parameters(), t["lr"], weight_decay=t["weight_decay"])
    data32, val32 = train.float(), val.float()
    gen = torch.Generator().manual_seed(0)
    start, step, curve, running = time.process_time(), 0, [], []
    best = (math.inf, 0, None, None)
    while (used := time.process_time() - start) < seconds:
        if t["cosine"]:
            for group in opt.param_groups:
                group["lr"] = t["lr"] * 0.5 * (1 + math.cos(math.pi * used / seconds))
        batch = data32[torch.randint(len(data32), (t["batch"],), generator=gen)]
        loss = -model.log_prob(batch).mean()
        opt.zero_grad()
        loss.backward()
        if t["clip"] is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t["clip"])
        opt.step()
        step += 1
        running = (running + [loss.item()])[-100:]
        if step % 100 == 0:
            with torch.no_grad():
                v = -model.log_prob(val32).mean().item()
            train_loss = sum(running) / len(running)
            curve.append((step, round(v, 3), round(train_loss, 3)))
            if v < best[0]:
                best = (v, step, {k: x.clone() for k, x in model.state_dict().items()}, train_loss)
    model.load_state_dict(best[2])
    model.double()
    with torch.no_grad():
        logp = model.log_prob(test)
        S = model.sample(1000, torch.Generator().manual_seed(0))
    b = torch.as_tensor(bonds)
    length = lambda P: (P[:, b[:, 0]] - P[:, b[:, 1]]).norm(dim=-1)
    broken = (length(S) / length(test).mean(0) - 1).abs() > 0.1
    i, j = torch.triu_indices(n, n, 1)
    return {
        "molecule": name, "conformers": len(X), "variant": variant, "spec": spec, "seconds": seconds, "steps": step,
        "best_step": best[1], "best_val": best[0], "train_at_best": best[3],
        "train_at_end": curve[-1][2] if curve else None, "test_nll": -logp.mean().item(),
        "test_nll_sem": (logp.std() / len(logp) ** 0.5).item(),
        "bonds_kept": 1 - broken.any(1).float().mean().item(),
        "clashes": ((S[:, i] - S[:, j]).norm(dim=-1) < 0.9).any(1).float().mean().item(),
        "params": sum(p.numel() for p in model.parameters()), "curve": curve,
    }  # fmt: skip


def _at(curve, step):
    """The validation NLL at the last point of ``curve`` at or before ``step``."""
    done = [v for s, v, _ in curve if s <= step]
    return f"{done[-1]:.1f}" if done else "–"


def markdown(rows: list[dict]) -> str:
    lines = ["| molecule | conformers | variant | CPU s | steps (best) | val @100 / 1k / 4k / end | "
             "train at best / end | test NLL | bonds kept | clashes | params |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        c = r["curve"]
        vals = " / ".join(_at(c, s) for s in (100, 1000, 4000, r["steps"]))
        lines.append(f"| {r['molecule']} | {r.get('conformers', '')} | {r['variant']} | {r['seconds']:g} | {r['steps']:,} "
                     f"({r['best_step']:,}) | {vals} | {r['train_at_best']:.1f} / "
                     f"{r['train_at_end']:.1f} | {r['test_nll']:.2f} ± {r['test_nll_sem']:.2f} "
                     f"| {r['bonds_kept']:.1%} | {r['clashes']:.1%} | {r['params']:,} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--molecules", nargs="+", default=["butanol-minimized"], choices=list(SMILES))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--seconds", type=float, default=180.0, help="CPU seconds of training each")
    p.add_argument("--n-conformers", type=int, default=3000, help="thermal ensembles' size")
    p.add_argument("--data", default="runs/real_molecules/data")
    p.add_argument("--out", default="results/keeps_learning")
    args = p.parse_args()
    set_threads(1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(args.data).mkdir(parents=True, exist_ok=True)
    path = out.with_suffix(".json")
    for name in args.molecules:
        for variant in args.variants:
            row = run(name, variant, args.seconds, Path(args.data), args.n_conformers)
            row["command"] = provenance.command()
            print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
            rows = json.loads(path.read_text()) if path.exists() else []
            key = lambda r: (r["molecule"], r.get("conformers"), r["variant"], r["seconds"])
            rows = [r for r in rows if key(r) != key(row)] + [row]
            path.write_text(json.dumps(rows, indent=1))
            out.with_suffix(".md").write_text(provenance.made_by(rows) + markdown(rows))


if __name__ == "__main__":
    main()
