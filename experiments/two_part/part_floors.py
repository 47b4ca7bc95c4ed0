"""The Boltzmann density's own split into the two-part ShapeFlow's parts: how low each part can
go.

Run: ``PYTHONPATH=src python experiments/two_part/part_floors.py [--systems dw4 lj13]
[--samples 4096]``.

The two-part ShapeFlow's NLL (`grassflow_paper.two_part`, the paper's model) of a centred cloud
is Grassmann + Gram + Jacobian: ``-log p_Gr([Y]) - log p(S | Y) + J(S)``
(``TwoPartShapeFlow.log_prob_terms``; J depends on the
data only). The Boltzmann density ``p_B(P) = exp(-U(P)) / Z`` that generated the DW4 and
LJ13 files splits the same way, and its parts are the floors of each model part:

    ``log p_B(S | Y) = -U(Y S^1/2) + ((n - k - 1) / 2) log det S - log I(Y)``,
    ``I(Y) = int_{SPD(k)} exp(-U(Y S'^1/2)) det(S')^((n - k - 1) / 2) dS'``,

(``Y S^1/2`` is any cloud with span [Y] and in-span Gram S; U is rotation invariant). I(Y) is
a k(k+1)/2-dimensional integral, estimated per test cloud by importance sampling from a
log-normal around the cloud's own S (:func:`~grassflow.distributions.spd.spd_lognormal_sample`)
at two proposal widths; they must agree. Z is not needed for the Gram floor; with ``log Z``
from a run's ``boltzmann.json`` (``--boltzmann``: the importance weights of a trained model,
:func:`grassflow_paper.boltzmann_report.evaluate`), the Grassmann floor is the rest:
``floor_total - J - gram_floor``. Results go to
``results/part_floors.{json,md}``, each row with the command that made it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from grassflow.data.particles import dw4_energy, lj13_energy
from grassflow.distributions.cartesian import log_jacobian_gram
from grassflow.distributions.spd import spd_lognormal_log_prob, spd_lognormal_sample
from grassflow.manifolds.shape_space import helmert_basis, shape_factor
from grassflow.metrics.boltzmann import effective_sample_size
from grassflow_paper import provenance
from grassflow_paper.vs_enf import SHAPES, load_enf_splits

ENERGIES = {"dw4": dw4_energy, "lj13": lj13_energy}


def gram_floor(system: str, samples: int, sigmas: tuple[float, ...], seed: int = 0,
               chunk: int = 20) -> dict:  # fmt: skip
    """``-log p_B(S | Y)`` on the test rows: mean, SEM and the importance sampler's ESS. The
    proposal is an equal mixture of log-normals of widths ``sigmas`` around each cloud's S
    (wide components for multimodal conditionals, e.g. DW4's double wells)."""
    n, k = SHAPES[system]
    U = ENERGIES[system]
    test = load_enf_splits(system, 1000)["test"]
    H = helmert_basis(n).double()
    Y, lam, _ = shape_factor(H.mT @ (test - test.mean(-2, keepdim=True)))
    S = torch.diag_embed(lam)
    c = (n - k - 1) / 2
    gen = torch.Generator().manual_seed(seed)
    nll, ess = [], []
    for Yc, Sc, lc in zip(Y.split(chunk), S.split(chunk), lam.split(chunk)):
        B, C = len(Yc), len(sigmas)
        widths = torch.tensor(sigmas, dtype=torch.float64)
        s = widths[torch.arange(samples) % C].expand(B, samples)
        M = Sc.unsqueeze(1).expand(B, samples, k, k)
        Sp = spd_lognormal_sample(M, s, s, gen)  # (B, m, k, k)
        w = widths[:, None, None].expand(C, B, samples)
        log_q = torch.logsumexp(spd_lognormal_log_prob(Sp, M, w, w), 0) - math.log(C)
        # any B with B B^T = S' gives a cloud Y B of that span and Gram; U ignores rotations
        root = torch.linalg.cholesky(Sp)
        log_f = -U(H @ Yc.unsqueeze(1) @ root) + c * torch.logdet(Sp)
        log_w = torch.nan_to_num(log_f - log_q, nan=-math.inf)
        log_I = torch.logsumexp(log_w, -1) - math.log(samples)
        own = -U(H @ Yc @ torch.diag_embed(lc.sqrt())) + c * lc.log().sum(-1)
        nll.append(log_I - own)
        ess.append(torch.tensor([effective_sample_size(w) for w in log_w]))
    nll, ess = torch.cat(nll), torch.cat(ess)
    jac = -log_jacobian_gram(lam, n - 1)
    return {"system": system, "sigmas": list(sigmas), "samples": samples, "n_test": len(nll),
            "gram_floor": nll.mean().item(), "gram_floor_sem": (nll.std() / len(nll) ** 0.5
                                                                 ).item(),
            "jacobian": jac.mean().item(), "ess_fraction_median": ess.median().item(),
            "ess_fraction_min": ess.min().item()}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", nargs="+", default=["dw4", "lj13"])
    p.add_argument("--samples", nargs="+", type=int, default=[4096, 16384],
                   help="importance samples per cloud (several: a convergence check)")
    p.add_argument("--sigmas", nargs="+", type=float, default=[0.1, 0.3, 0.7, 1.5],
                   help="proposal widths: wide ones for DW4's multimodal conditional")
    p.add_argument("--boltzmann", nargs="*", default=[], help="boltzmann.json files (log Z)")
    p.add_argument("--out", default="results")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = [gram_floor(s, m, tuple(args.sigmas)) for s in args.systems for m in args.samples]
    totals = {b["system"]: b for b in (json.loads(Path(f).read_text()) for f in args.boltzmann)}
    for r in rows:
        r["command"] = provenance.command()
        if r["system"] in totals:  # the total floor, from a model's importance weights
            total = totals[r["system"]]["boltzmann_test_nll"]
            r.update(total_floor=total, grassmann_floor=total - r["jacobian"] - r["gram_floor"])
        print(json.dumps(r), flush=True)
    path = Path(args.out) / "part_floors.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    key = lambda r: (r["system"], r["samples"], tuple(r["sigmas"]))  # noqa: E731
    old = json.loads(path.read_text()) if path.exists() else []
    rows = [r for r in old if key(r) not in {key(n) for n in rows}] + rows
    path.write_text(json.dumps(rows, indent=1))
    lines = ["| system | proposal widths | samples | Gram floor (± SEM) | Jacobian | total floor | "
             "Grassmann floor | median ESS | min ESS |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tot = f"{r['total_floor']:.2f} | {r['grassmann_floor']:.2f}" if "total_floor" in r \
            else "– | –"  # fmt: skip
        widths = ", ".join(f"{v:g}" for v in r["sigmas"])
        lines.append(f"| {r['system']} | {widths} | {r['samples']:,} | "
                     f"{r['gram_floor']:.2f} ± {r['gram_floor_sem']:.2f} | {r['jacobian']:.2f} "
                     f"| {tot} | {r['ess_fraction_median']:.1%} | {r['ess_fraction_min']:.1%} |")
    table = provenance.made_by(rows) + "\n".join(lines) + "\n"
    (Path(args.out) / "part_floors.md").write_text(table)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
