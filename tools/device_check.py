"""GPU check: the same model gives the same numbers on CUDA as on the CPU (float64).

Run on a machine with a GPU:  ``PYTHONPATH=src python tools/device_check.py``.
Prints one line per check and exits non-zero if any fails. Not part of CI (no GPU there).
"""

from __future__ import annotations

import copy
import sys

import torch

from grassflow import Grassmann, GrCNF
from grassflow.nn import GrassmannField, scale_init_
from grassflow.training import OBJECTIVES, ot_pairing

FAILED = []


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float64)
    print(torch.__version__, torch.cuda.get_device_name())
    for k, D, preset in ((2, 3, "dw4"), (3, 12, "lj13"), (3, 13, "lj13")):
        gr = Grassmann(k, D)
        cpu = GrCNF(gr, GrassmannField.from_preset(D, k, preset), col_cov=0.09 * torch.eye(k))
        scale_init_(cpu.field, 3.0)  # an untrained flow barely moves: make it move mass
        gpu = copy.deepcopy(cpu).cuda()
        Y = gr.random(64)
        with torch.no_grad():
            lp_c, lp_g = cpu.eval().log_prob(Y), gpu.eval().log_prob(Y.cuda()).cpu()
            Y1_c, Y1_g = cpu.transport_forward(Y), gpu.transport_forward(Y.cuda()).cpu()
        err = (lp_c - lp_g).abs().max().item()
        check(f"Gr({k},{D}) log_prob cuda vs cpu", err < 1e-8, f"max |diff| {err:.1e} nats, "
              f"nfe {gpu.last_stats.get('nfe')}")  # fmt: skip
        err = (Y1_c - Y1_g).abs().max().item()
        check(f"Gr({k},{D}) transport cuda vs cpu", err < 1e-8, f"max |diff| {err:.1e}")
        orth = (Y1_g.mT @ Y1_g - torch.eye(k)).abs().max().item()
        check(f"Gr({k},{D}) orthonormal on cuda", orth < 1e-10, f"{orth:.1e}")
        # training objectives run and give gradients on the GPU
        gpu.train()
        for name, objective in OBJECTIVES.items():
            loss, _ = objective(gpu, Y.cuda()[:16])
            loss.backward()
            grads = [p.grad for p in gpu.parameters() if p.grad is not None]
            finite = bool(torch.isfinite(loss)) and all(torch.isfinite(g).all() for g in grads)
            check(f"Gr({k},{D}) {name} objective on cuda", finite and len(grads) > 0,
                  f"loss {loss.item():.3f}")  # fmt: skip
            gpu.zero_grad()
        Y0 = gr.random(32)
        same = torch.equal(
            ot_pairing(gr, Y0, Y[:32]), ot_pairing(gr, Y0.cuda(), Y[:32].cuda()).cpu()
        )
        check(f"Gr({k},{D}) OT pairing cuda == cpu", same, "")
    print("FAILED:" if FAILED else "all checks passed", *FAILED)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
