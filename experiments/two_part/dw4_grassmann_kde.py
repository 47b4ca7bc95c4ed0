"""What limits DW4's Grassmann part: a kernel density estimate on Gr(2, 3) for comparison.

The span of a centred DW4 configuration is a 2-plane in R^3 (Helmert coordinates), i.e. a
line of normals ``+-n`` on RP^2. The estimate is an antipodally symmetrised von Mises-Fisher
mixture over the training normals; its concentration is selected on the validation split and
its NLL reported on the test split, in nats w.r.t. the same measure as the flow's Grassmann
term (the uniform density is log 2 pi = 1.838)::

    PYTHONPATH=src python experiments/two_part/dw4_grassmann_kde.py [--n-train 1000]
"""

from __future__ import annotations

import argparse
import math

import torch

from grassflow_paper import vs_enf
from grassflow_paper.two_part import TwoPartShapeFlow


def kde_nll(x: torch.Tensor, centres: torch.Tensor, kappa: float) -> float:
    """Mean NLL of unit normals ``x: (N, 3)`` under the symmetrised vMF mixture at ``centres``.
    Per kernel: ``kappa / (4 pi sinh kappa) (e^{kappa c} + e^{-kappa c})`` with ``c = x . n_i``,
    which integrates to one over RP^2 (half the sphere's area)."""
    c = x @ centres.T
    log_norm = math.log(kappa / (4 * math.pi)) - (kappa + math.log1p(-math.exp(-2 * kappa))
                                                  - math.log(2))  # fmt: skip
    log_kernel = torch.logsumexp(torch.stack([kappa * c, -kappa * c]), 0)
    return -(log_norm + torch.logsumexp(log_kernel, 1) - math.log(len(centres))).mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=1000)
    args = parser.parse_args()
    data = vs_enf.load_enf_splits("dw4", args.n_train)
    model = TwoPartShapeFlow(4, 2).double()
    normals = {s: torch.linalg.cross(*model.factor(data[s])[0].unbind(-1)) for s in data}
    kappas = [10.0 * 2**i for i in range(11)]
    val = [kde_nll(normals["val"], normals["train"], k) for k in kappas]
    best = kappas[min(range(len(kappas)), key=val.__getitem__)]
    for k, v in zip(kappas, val):
        print(f"kappa {k:8.0f}: val NLL {v:.3f}")
    test = kde_nll(normals["test"], normals["train"], best)
    print(f"selected kappa {best:.0f}: test NLL {test:.3f} (uniform {math.log(2 * math.pi):.3f})")


if __name__ == "__main__":
    main()
