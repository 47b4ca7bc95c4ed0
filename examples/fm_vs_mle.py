"""Flow matching against maximum likelihood on a texture of Gr(1, 3), at equal CPU time.

An honest comparison: the same model (a texture preset of ``grassflow.tasks.texture_runs``,
same seed, same initial weights), the same stream of training data, the same budget of training
CPU seconds per objective (``TrainConfig(budget_minutes=..., clock="cpu")``; validation is not
charged to it), and the same held-out test set, scored by the same exact-divergence NLL.
Maximum likelihood (``"mle"``) backpropagates through an ODE solve at every step; flow
matching (``"fm"``) regresses the field on geodesic velocities with no solve, so it takes many
more, cheaper steps in the same time. Which one wins depends on the texture and the budget.

    python examples/fm_vs_mle.py                       # 1 CPU minute per objective
    python examples/fm_vs_mle.py --dataset 2spirals --preset fourier --minutes 3
    python examples/fm_vs_mle.py --tiny                # seconds (CI)

``grassflow reproduce fm-vs-mle`` is the full experiment (NLL against time, five textures).
"""

import argparse
import json
from pathlib import Path

from grassflow.data.textures import TEXTURES
from grassflow.tasks import texture_runs

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tiny", action="store_true", help="a few CPU seconds per objective (CI)")
parser.add_argument("--dataset", default="2sines", choices=TEXTURES)
parser.add_argument("--preset", default="paper", choices=sorted(texture_runs.PRESETS),
                    help="the model (its own objective is replaced)")
parser.add_argument("--objectives", nargs="+", default=["mle", "fm"],
                    choices=["mle", "fm", "fm-ot"])
parser.add_argument("--minutes", type=float, default=None,
                    help="training CPU minutes per objective (default 1, tiny 0.03)")
parser.add_argument("--out", help="run directory (default runs/fm_vs_mle[-tiny])")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
args.out = args.out or f"runs/fm_vs_mle{'-tiny' if args.tiny else ''}"
minutes = args.minutes or (0.03 if args.tiny else 1.0)
n_held_out = 100 if args.tiny else 500

rows = {}
for objective in args.objectives:
    base = texture_runs.PRESETS[args.preset]
    # stop on the budget alone, a total over reruns: the same command again trains no further
    # (it only evaluates), a larger budget continues both. One validation, at the end.
    train = base.train.replace(iterations=None, lr_step=None, val_every=None, seed=args.seed,
                               batch_size=100 if args.tiny else 200, clock="cpu",
                               total_budget_minutes=minutes, log_every=10,
                               checkpoint_every=10**6)  # fmt: skip
    exp = texture_runs.preset(args.preset, args.dataset, objective=objective, train=train,
                              n_val=n_held_out, n_test=n_held_out, data_seed=args.seed)
    run_dir = Path(args.out, args.dataset, objective)
    result = texture_runs.run(exp, run_dir, resume=True, progress=not args.tiny)
    r = texture_runs.evaluate(run_dir, n_samples=n_held_out, seed=args.seed)
    rows[objective] = {"iterations": result.iterations, "train_cpu_s": result.cpu_seconds,
                       "test_nll": r["test_nll"], "test_nll_sem": r["test_nll_sem"],
                       "mmd2": r["mmd2_model"]}  # fmt: skip
    refs = {"prior_nll": r["prior_nll"], "uniform_nll": r["uniform_nll"],
            "mmd2_data_floor": r["mmd2_data"]}  # fmt: skip

print(f"{args.dataset}, preset {args.preset!r}, {minutes:g} CPU min of training per objective, "
      f"{n_held_out} test points")
print(f"{'objective':>9} {'iterations':>10} {'CPU s':>6}  test NLL (nats)   MMD^2")
for objective, row in rows.items():
    print(f"{objective:>9} {row['iterations']:>10} {row['train_cpu_s']:>6.1f}  "
          f"{row['test_nll']:7.3f} ± {row['test_nll_sem']:.3f}   {row['mmd2']:.4f}")
print(f"references: prior NLL {refs['prior_nll']:.3f}, uniform NLL {refs['uniform_nll']:.3f} "
      f"(log 2 pi), MMD^2 data-vs-data {refs['mmd2_data_floor']:.4f}")
Path(args.out, "summary.json").write_text(json.dumps({"budget_minutes": minutes, **refs,
                                                      "rows": rows}, indent=1))  # fmt: skip
