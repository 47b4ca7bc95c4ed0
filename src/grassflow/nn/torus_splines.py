r"""A spline coupling flow on R^a x T^c: rational-quadratic splines on the real features,
circular splines on the angles.

``x: (..., m)`` holds real features (columns where ``circular`` is False) and angles in
``[-pi, pi)`` (where it is True). Each coupling layer keeps one part of the features fixed
and moves the other by a monotonic rational-quadratic spline whose knots a small network
reads from the fixed part (the angles enter it as ``(cos, sin)``, so it sees the circle, not
a cut):

* a real feature: zuko's spline on ``[-B, B]``, the identity outside (slope 1 at the ends,
  so the map of R is smooth);
* an angle: a half-turn shift, then zuko's spline on ``[-pi, pi]``, whose slopes at both
  ends are 1, so it is a diffeomorphism of the circle (Rezende et al. 2020).

The base is N(0, 1) (or a given normalized ``real_base``, e.g. a fitted Gaussian mixture) on
the real features and uniform on the circle, so the density on R^a x T^c is normalized
exactly whatever the weights. Each layer's last linear map starts at
zero (every spline the identity): the flow starts as its base. One pass each way: the
density and the sample cost the same (a coupling flow, not an autoregressive one).

References:
    Durkan, Bekasov, Murray, Papamakarios. Neural spline flows. NeurIPS 2019.
    Rezende, Papamakarios, Racanière et al. Normalizing flows on tori and spheres. ICML 2020.
    Rozet et al. zuko (the spline transform used here).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["TorusSplineFlow"]

TWO_PI = 2 * math.pi


def _spline(params: Tensor, bound: Tensor, bins: int):
    from zuko.transforms import MonotonicRQSTransform

    w, h, d = params.split([bins, bins, bins - 1], -1)
    return MonotonicRQSTransform(w, h, d, bound=bound[..., None], slope=1e-3)


def _shift(x: Tensor, circular: Tensor) -> Tensor:
    """A half turn of the angles (its own inverse on [-pi, pi)), the real features kept."""
    return torch.where(circular, torch.remainder(x, TWO_PI) - math.pi, x)


class _Coupling(nn.Module):
    """One coupling layer: the features in ``moved`` get splines conditioned on the rest."""

    def __init__(self, circular: Tensor, moved: Tensor, hidden: tuple[int, ...], bins: int,
                 bound: float):  # fmt: skip
        super().__init__()
        self.bins = bins
        self.register_buffer("kept_idx", (~moved).nonzero()[:, 0])
        self.register_buffer("moved_idx", moved.nonzero()[:, 0])
        kept_circ = circular[~moved]
        self.register_buffer("kept_circ", kept_circ)
        self.register_buffer("moved_circ", circular[moved])
        self.register_buffer("bound", torch.where(circular[moved], math.pi, bound).double())
        width_in = int((~kept_circ).sum()) + 2 * int(kept_circ.sum())
        layers, last = [], width_in
        for h in hidden:
            layers += [nn.Linear(last, h), nn.SiLU()]
            last = h
        layers.append(nn.Linear(last, int(moved.sum()) * (3 * bins - 1)))
        nn.init.zeros_(layers[-1].weight)
        nn.init.zeros_(layers[-1].bias)
        self.net = nn.Sequential(*layers)

    def _transform(self, x_kept: Tensor):
        c = self.kept_circ
        features = torch.cat([x_kept[..., ~c], x_kept[..., c].cos(), x_kept[..., c].sin()], -1)
        params = self.net(features).unflatten(-1, (len(self.moved_idx), 3 * self.bins - 1))
        return _spline(params, self.bound.to(x_kept.dtype), self.bins)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        spline = self._transform(x[..., self.kept_idx])
        y, ladj = spline.call_and_ladj(_shift(x[..., self.moved_idx], self.moved_circ))
        out = x.clone()
        out[..., self.moved_idx] = y
        return out, ladj.sum(-1)

    def inverse(self, y: Tensor) -> Tensor:
        spline = self._transform(y[..., self.kept_idx])
        out = y.clone()
        out[..., self.moved_idx] = _shift(spline.inv(y[..., self.moved_idx]), self.moved_circ)
        return out


class TorusSplineFlow(nn.Module):
    """Normalized density on R^a x T^c by spline coupling layers (see the module doc).

    Args:
        circular: ``(m,)`` bool, True where the feature is an angle in ``[-pi, pi)``.
        transforms: coupling layers (pairs of them move every feature once).
        hidden: the conditioners' hidden widths.
        bins: spline bins.
        bound: the real features' spline interval ``[-bound, bound]`` (identity outside).
        seed: of the feature split of each pair of layers (a fixed random half).
        real_base: the base of the real features, a module whose call returns a
            distribution over ``(a,)`` (zuko's ``LazyDistribution``, e.g. a fitted ``GMM``);
            None: N(0, 1).
    """

    def __init__(self, circular: Tensor, transforms: int = 8, hidden: tuple[int, ...] = (256, 256),
                 bins: int = 8, bound: float = 5.0, seed: int = 0,
                 real_base: nn.Module | None = None):  # fmt: skip
        super().__init__()
        self.real_base = real_base
        circular = torch.as_tensor(circular, dtype=torch.bool)
        m = len(circular)
        if m < 2:
            raise ValueError(f"a coupling flow needs at least 2 features, got {m}")
        self.register_buffer("circular", circular)
        g = torch.Generator().manual_seed(seed)
        layers = []
        for t in range(transforms):
            if t % 2 == 0:
                half = torch.zeros(m, dtype=torch.bool)
                half[torch.randperm(m, generator=g)[: m // 2]] = True
            layers.append(_Coupling(circular, half if t % 2 == 0 else ~half, tuple(hidden), bins,
                                    bound))  # fmt: skip
        self.layers = nn.ModuleList(layers)

    def base_log_prob(self, z: Tensor) -> Tensor:
        """``(...)``: N(0, 1) (or ``real_base``) on the real features, uniform on the circle."""
        r = z[..., ~self.circular]
        n_circ = int(self.circular.sum())
        real = -0.5 * r.square().sum(-1) - 0.5 * r.shape[-1] * math.log(TWO_PI) \
            if self.real_base is None else self.real_base().log_prob(r)  # fmt: skip
        return real - n_circ * math.log(TWO_PI)

    def to_base(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``z`` of ``x: (..., m)`` and ``log |dz/dx|: (...)``."""
        ladj = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        for layer in self.layers:
            x, step = layer(x)
            ladj = ladj + step
        return x, ladj

    def log_prob(self, x: Tensor) -> Tensor:
        """``log p(x): (...)`` of ``x: (..., m)``, angles in ``[-pi, pi)``."""
        z, ladj = self.to_base(x)
        return self.base_log_prob(z) + ladj

    def from_base(self, z: Tensor) -> Tensor:
        """The inverse of `to_base`."""
        for layer in reversed(self.layers):
            z = layer.inverse(z)
        return z

    def sample_base(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``(n, m)`` draws of the base (CPU generator), in the flow's dtype and device."""
        ref = self.circular
        dtype = next(self.parameters()).dtype
        z = torch.randn(n, len(ref), dtype=dtype, generator=generator)
        u = (torch.rand(n, len(ref), dtype=dtype, generator=generator) * 2 - 1) * math.pi
        z = torch.where(ref.cpu(), u, z).to(ref.device)
        if self.real_base is not None:  # its draws seeded from ``generator``
            seed = int(torch.randint(2**62, (1,), generator=generator))
            with torch.random.fork_rng(devices=[] if ref.device.type == "cpu" else [ref.device]):
                torch.manual_seed(seed)
                z[:, ~ref] = self.real_base().sample((n,)).to(z)
        return z

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``(n, m)`` draws of the flow."""
        return self.from_base(self.sample_base(n, generator))
