"""The moving average against the raw weights of one `train --data --ema` run, at the same
iteration: ``best.pt`` (the average, when the last validation was the best) against
``last.pt`` (the raw parameters), by the exact NLL of the first 100 test conformers and the
bonds kept and clashes of 1,000 samples::

    PYTHONPATH=src python experiments/molecules/ema_vs_raw.py RUN_DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from grassflow.metrics import chemistry as chem
from grassflow.metrics import mean_sem
from grassflow.tasks import shape_runs as shapes
from grassflow.training import load_checkpoint


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    args = p.parse_args()
    run = Path(args.run)
    exp, model = shapes.load_run(run)
    test = shapes.load_clouds(exp)["test"]
    mol = chem.template_from_molblock((run / shapes.MOLBLOCK).read_text())
    last, best = (load_checkpoint(run / "flow" / f"{w}.pt") for w in ("last", "best"))
    print(f"iterations: last.pt {last['iteration']}, best.pt {best['iteration']}")
    for name, ckpt in (("moving average (best.pt)", best), ("raw weights (last.pt)", last)):
        model.load_state_dict(ckpt["model"])
        with torch.no_grad():
            lp = torch.cat([model.log_prob(c) for c in test[:100].split(64)])
            X = model.sample(1000, torch.Generator().manual_seed(0)).numpy()
        s = chem.chemistry_summary(mol, X, test.numpy(), np.asarray(exp.bonds))
        r = mean_sem("nll", -lp)
        print(f"{name}: NLL {r['nll']:.2f} ± {r['nll_sem']:.2f}, bonds kept "
              f"{s['bonds_kept']:.1%}, clashes {s['clash_fraction']:.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
