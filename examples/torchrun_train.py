"""Data-parallel training with torchrun: the same ``train`` call on N processes.

``grassflow.training.train`` notices that torchrun launched it and trains with
DistributedDataParallel (gloo on CPU, NCCL with one GPU per process): each of the N processes
takes ``batch_size / N`` points of the same global batch, the gradients are averaged, so the
learning rate keeps its meaning, and rank 0 alone writes the run directory. Evaluation with
``distributed_mean_nll`` shares fixed chunks among the ranks and gives the single-process
value, which rank 0 checks here against a plain ``mean_nll``. Rank 0 prints the result.

    torchrun --standalone --nproc_per_node 2 examples/torchrun_train.py          # ~1 minute
    torchrun --standalone --nproc_per_node 2 examples/torchrun_train.py --tiny   # CI
    python examples/torchrun_train.py --tiny                                     # 1 process

Rerun the same command to resume from ``last.pt`` (with any number of processes). See
docs/scale-out.md for SLURM.
"""

import argparse
import json

import torch

from grassflow import Grassmann, GrCNF
from grassflow.data.textures import TEXTURES, sample_texture
from grassflow.training import OBJECTIVES, TrainConfig, distributed_mean_nll, mean_nll, train
from grassflow.training import distributed as dd

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tiny", action="store_true", help="a few steps (CI)")
parser.add_argument("--objective", default="mle", choices=sorted(OBJECTIVES))
parser.add_argument("--dataset", default="2spirals", choices=TEXTURES)
parser.add_argument("--device", default="cpu", help='"auto": a GPU per process if enough')
parser.add_argument("--batch-size", type=int, default=None, help="global batch (default 256)")
parser.add_argument("--iterations", type=int, default=None, help="default 400 (tiny: 6)")
parser.add_argument("--out", help="run directory (default runs/torchrun_train[-tiny])")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
args.out = args.out or f"runs/torchrun_train{'-tiny' if args.tiny else ''}"
batch_size = args.batch_size or (32 if args.tiny else 256)
iterations = args.iterations or (6 if args.tiny else 400)

# every rank draws the same data and initial weights; DDP then keeps the weights in step
Y_train = sample_texture(args.dataset, 4000, seed=args.seed)
Y_test = sample_texture(args.dataset, 100 if args.tiny else 500, seed=args.seed + 1)
torch.manual_seed(args.seed)
flow = GrCNF(Grassmann(1, 3))
config = TrainConfig(batch_size=batch_size, iterations=iterations, val_every=None,
                     log_every=2 if args.tiny else 20, checkpoint_every=100, seed=args.seed,
                     device=args.device)  # fmt: skip
result = train(flow, Y_train, config, args.out, objective=OBJECTIVES[args.objective],
               resume=True, progress=not args.tiny)

# every rank must join the sharded evaluation (it gathers over the process group)
nll = distributed_mean_nll(flow, Y_test, 25)
if dd.is_main():
    single = mean_nll(flow, Y_test, 25)  # the same chunks on one process: the same number
    print(f"{dd.world()} process(es), global batch {batch_size} ({batch_size // dd.world()} "
          f"per process), objective {args.objective}: {result.message}")
    print(f"test NLL {nll:.4f} nats (sharded over {dd.world()}), {single:.4f} (one process); "
          f"uniform {Grassmann(1, 3).log_volume():.4f}")
    summary = {"world": dd.world(), "iterations": result.iterations, "test_nll": nll,
               "test_nll_one_process": single}  # fmt: skip
    (result.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"run directory: {result.run_dir} (rank 0 wrote it)")
dd.barrier()  # no rank leaves the process group while rank 0 still checks and writes
dd.shutdown()
