"""An exponential moving average (EMA) of a model's parameters, the weights that flow-matching
and diffusion models are usually validated and sampled with: the average of the last ~1 /
(1 - decay) steps smooths the noise of the last updates at no extra gradient."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

__all__ = ["ParameterEMA"]


class ParameterEMA:
    """``shadow <- d_t shadow + (1 - d_t) p`` after the t-th update, with the warm-up
    ``d_t = min(decay, (1 + t) / (10 + t))``, so that early on the shadow follows the
    parameters instead of remembering their initial values.

    Args:
        params: the parameters averaged (the optimizer's).
        decay: the long-run decay, in (0, 1).
    """

    def __init__(self, params: list[Tensor], decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must lie in (0, 1), got {decay!r}")
        self.params, self.decay = list(params), decay
        self.shadow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self, t: int) -> None:
        """Fold in the parameters after update ``t`` (1, 2, ...)."""
        d = min(self.decay, (1.0 + t) / (10.0 + t))
        torch._foreach_lerp_(self.shadow, [p.detach() for p in self.params], 1.0 - d)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The parameters hold the average inside the block, and their own values after."""
        saved = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, s in zip(self.params, self.shadow):
                p.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, s in zip(self.params, saved):
                    p.copy_(s)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": [s.clone() for s in self.shadow]}

    def load_state_dict(self, state: dict) -> None:
        shadow = state["shadow"]
        if len(shadow) != len(self.shadow) or any(
                a.shape != b.shape for a, b in zip(shadow, self.shadow)):  # fmt: skip
            raise ValueError("the EMA state does not fit these parameters")
        for s, v in zip(self.shadow, shadow):
            s.copy_(v)
