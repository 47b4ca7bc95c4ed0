"""A density on Gr(2, 4): fit a GrCNF to a mixture of two concentrated Cayley-Gaussians.

Shows the basic loop: data on Gr(2, 4) (2-planes in R^4, as orthonormal 4 x 2 frames) from an
equal mixture of two ``MatrixGaussianPrior``s; a ``GrCNF`` with a uniform base trained by flow
matching (``OBJECTIVES["fm"]``: no ODE solve during training) with ``training.train`` into a
resumable run directory; its exact test NLL beside the uniform density's (``log Vol Gr(2,4)``)
and the mixture's own (the best any model can do, on average); samples, which are orthonormal; and
invariance: ``log_prob(Y @ Q) == log_prob(Y)`` for an orthogonal 2 x 2 ``Q``, since the density
is one of subspaces, not of their bases.

    python examples/density_gr24.py              # about 1 CPU minute, writes runs/density_gr24
    python examples/density_gr24.py --tiny       # a few seconds (CI)

Rerunning with the same settings resumes the run directory (and only evaluates if it is done).
"""

import argparse
import json
import math
from pathlib import Path

import torch

from grassflow import Grassmann, GrCNF, MatrixGaussianPrior
from grassflow.manifolds import orthonormality_error
from grassflow.training import OBJECTIVES, TrainConfig, train

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tiny", action="store_true", help="a few seconds of training (CI)")
parser.add_argument("--iterations", type=int, default=None, help="default 10000 (tiny: 1000)")
parser.add_argument("--out", help="run directory (default runs/density_gr24[-tiny])")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
args.out = args.out or f"runs/density_gr24{'-tiny' if args.tiny else ''}"
iterations = args.iterations or (1000 if args.tiny else 10000)
n_train, n_test = (512, 100) if args.tiny else (4000, 500)

gr = Grassmann(2, 4)
g = torch.Generator().manual_seed(args.seed)
a, b = 1.2, 0.6  # principal angles of the second mean from span(e1, e2); distinct on purpose
mean2 = torch.tensor([[math.cos(a), 0], [0, math.cos(b)], [math.sin(a), 0], [0, math.sin(b)]])
cov = 0.2**2 * torch.eye(4)
parts = [MatrixGaussianPrior(gr, torch.eye(4, 2), cov), MatrixGaussianPrior(gr, mean2, cov)]


def mixture(n: int) -> torch.Tensor:
    Y = torch.cat([p.sample((n // 2,), generator=g) for p in parts])  # n even
    return Y[torch.randperm(len(Y), generator=g)]


def mixture_log_prob(Y: torch.Tensor) -> torch.Tensor:
    return torch.stack([p.log_prob(Y) for p in parts]).logsumexp(0) - math.log(2)


Y_train, Y_val, Y_test = mixture(n_train), mixture(n_test), mixture(n_test)
torch.manual_seed(args.seed)  # the field's initial weights
flow = GrCNF(gr, prior="uniform")
config = TrainConfig(batch_size=128, iterations=iterations, lr=2e-3, val_every=None,
                     log_every=50, checkpoint_every=500, seed=args.seed)
result = train(flow, Y_train, config, args.out, val_data=Y_val, objective=OBJECTIVES["fm"],
               resume=True, progress=not args.tiny)

flow.eval()
Y_test = Y_test.to(flow.device, flow.dtype)  # where and how `train` left the flow
with torch.no_grad():
    logp = flow.log_prob(Y_test)
    samples = flow.sample(200, generator=torch.Generator(flow.device).manual_seed(args.seed))
    Q = torch.linalg.qr(torch.randn(2, 2, generator=g, dtype=torch.float64))[0]
    Q = Q.to(flow.device, flow.dtype)
    logp_rotated = flow.log_prob(Y_test @ Q)
summary = {
    "iterations": result.iterations,
    "test_nll": -logp.mean().item(),
    "uniform_nll": gr.log_volume(),
    "data_nll": -mixture_log_prob(Y_test.cpu().float()).mean().item(),
    "sample_orthonormality_error": orthonormality_error(samples).max().item(),
    "invariance_error": (logp_rotated - logp).abs().max().item(),
}
print(f"{result.iterations} iterations, {result.cpu_seconds:.1f} CPU s of training")
print(f"test NLL {summary['test_nll']:.3f} nats | uniform {summary['uniform_nll']:.3f} "
      f"(= log Vol Gr(2,4)) | true mixture {summary['data_nll']:.3f}")
print(f"samples {tuple(samples.shape)}: max |Y^T Y - I| = "
      f"{summary['sample_orthonormality_error']:.1e}")
print(f"max |log p(Y Q) - log p(Y)| over the test set = {summary['invariance_error']:.1e}")
Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1))
