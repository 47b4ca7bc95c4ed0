"""The O(k)-equivariant potential-gradient vector field on Gr(k, D) (paper §4.4)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..ode.divergence import horizontal_basis, horizontal_frame, horizontal_noise
from . import jet
from .jet import Jet
from .layers import ConcatSquash, HorP

__all__ = ["LAPLACIANS", "PAPER_WIDTHS", "GrassmannField", "Potential"]

LAPLACIANS = ("auto", "forward", "hvp", "loop")

# hidden widths of the ConcatSquash stack (the final width-1 layer is implicit), paper Tables 3-4
PAPER_WIDTHS: dict[str, tuple[int, ...]] = {
    "textures": (64, 64),
    "dw4": (64, 64, 64),
    "lj13": (32, 32, 32),
    "qm9": (32, 32, 32),
}


def _fourier(h: Tensor | Jet) -> Tensor | Jet:
    """``[sin h, cos h]`` on the last axis: ``(..., m) -> (..., 2m)``; tensors or jets."""
    if not isinstance(h, Jet):
        return torch.cat([torch.sin(h), torch.cos(h)], -1)
    s, c = torch.sin(h.v), torch.cos(h.v)
    return jet.cat([h.elementwise(s, c, -s), h.elementwise(c, -s, -c)], -1)


class Potential(nn.Module):
    """O(k)-invariant scalar potential ``v(t, Y)``: HorP -> tanh -> Vec -> [CS -> tanh]* -> CS.

    Args:
        D: ambient dimension of the manifold Gr(k, D).
        k: subspace dimension of the manifold Gr(k, D).
        hidden: widths of the hidden ConcatSquash layers, e.g. ``(64, 64)``.
        horp_width: columns of the HorP weight; default k (the paper).
        final_tanh: apply tanh to the scalar output, as the paper's tables do.
        fourier_scale: None (the paper): the features are ``tanh(HorP(Y))``. A float: they are
            ``[sin(HorP(Y)), cos(HorP(Y))]`` (2 D horp_width of them) with the HorP weight drawn
            from ``N(0, fourier_scale^2)``. Still O(k)-invariant; periodic features let the
            network resolve fine structure (thin spiral arms) that tanh features, smooth on the
            scale of the data, learn only very slowly (spectral bias).
    """

    supports_jet = True  # forward() is written with jet-aware ops

    def __init__(
        self,
        D: int,
        k: int,
        hidden: Sequence[int] = (64, 64),
        horp_width: int | None = None,
        final_tanh: bool = True,
        fourier_scale: float | None = None,
    ):
        super().__init__()
        width = k if horp_width is None else horp_width
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"horp_width must be a positive integer, got {horp_width!r}")
        self.horp = HorP(D, width)
        self.fourier_scale = fourier_scale
        if fourier_scale is not None:
            if not (math.isfinite(fourier_scale) and fourier_scale > 0):
                raise ValueError(f"fourier_scale must be positive and finite, got {fourier_scale}")
            with torch.no_grad():
                self.horp.weight.mul_(fourier_scale)  # HorP's weight is N(0, 1)
        n_features = D * width * (1 if fourier_scale is None else 2)
        sizes = [n_features, *hidden, 1]
        self.layers = nn.ModuleList(ConcatSquash(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.final_tanh = final_tanh

    def forward(self, t: Tensor, Y: Tensor) -> Tensor:
        """``Y: (..., D, k)`` -> ``(...)``; on a `Jet`, its jet."""
        h = self.horp(Y)
        x = (jet.tanh(h) if self.fourier_scale is None else _fourier(h)).flatten(-2)
        for i, layer in enumerate(self.layers):
            x = layer(t, x)
            if i < len(self.layers) - 1 or self.final_tanh:
                x = jet.tanh(x)
        return x.squeeze(-1)


class GrassmannField(nn.Module):
    """Horizontal, O(k)-equivariant vector field ``X(t, Y) = (I - Y Y^T) dv/dY``.

    The Riemannian gradient of an O(k)-invariant potential on Gr(k, D). Because v is invariant,
    ``Y^T dv/dY`` is symmetric and this equals the paper's ``Z - Y sym(Y^T Z)`` (eq. 13), with
    ``Y^T X = 0`` exactly rather than up to round-off. Equivariance ``X(t, Y Q) = X(t, Y) Q``
    holds for every Q in O(k), reflections included.

    The gradient is taken with ``torch.func.grad`` so the field composes with ``jvp``/``vmap``
    (exact divergence) and with ordinary autograd (training).

    Args:
        potential: a module ``v(t, Y: (..., D, k)) -> (...)``, invariant under ``Y -> Y Q``.
            With ``supports_jet = True`` it also maps a `Jet` of Y
            to the jet of v, and the divergence takes the forward-Laplacian path.
        laplacian: ``"auto"`` (default: the forward Laplacian for the exact divergence where
            supported, Hessian-vector products for Hutchinson; see `path`),
            ``"forward"`` (required, for both), ``"hvp"`` (Hessian-vector products by double
            backward) or ``"loop"`` (one ``torch.autograd.grad`` per ambient coordinate of the
            field, as the paper's RCNF-based implementation; the benchmarks' baseline).
    """

    def __init__(self, potential: nn.Module, laplacian: str = "auto"):
        super().__init__()
        if laplacian not in LAPLACIANS:
            raise ValueError(f"laplacian must be one of {LAPLACIANS}, got {laplacian!r}")
        self.potential = potential
        self.laplacian = laplacian
        self.last_path: str | None = None
        self.path()  # a required but unsupported forward path fails here

    @classmethod
    def from_preset(cls, D: int, k: int, preset: str = "textures", **kwargs) -> GrassmannField:
        if preset not in PAPER_WIDTHS:
            raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PAPER_WIDTHS)}")
        return cls(Potential(D, k, PAPER_WIDTHS[preset], **kwargs))

    def forward(self, t: Tensor, Y: Tensor) -> Tensor:
        """``t``: scalar tensor; ``Y: (..., D, k)`` -> ``X: (..., D, k)``."""
        G = torch.func.grad(lambda Z: self.potential(t, Z).sum())(Y)
        return G - Y @ (Y.mT @ G)

    def field_and_divergence(
        self, t: Tensor, Y: Tensor, noise: Tensor | None = None, create_graph: bool = True
    ) -> tuple[Tensor, Tensor]:
        """Field and its divergence via the Laplace-Beltrami operator of the potential.

        For ``X = (I - Y Y^T) G`` with ``G = dv/dY`` and horizontal E,
        ``<E, DX[E]> = <E, H[E]> - tr(E^T E Y^T G)`` (H the Euclidean Hessian), so
        ``div X = tr_h(H) - (D - k) tr(Y^T G)``. Two paths compute it (`laplacian`):
        one forward pass of a `Jet` (``"forward"``),
        Hessian-vector products by double backward (``"hvp"``), or the Jacobian of X row by
        row (``"loop"``; with ``noise`` it runs as ``"hvp"``). `last_path` says which
        ran.

        Args:
            t: scalar time.
            Y: ``(B, D, k)`` points.
            noise: ``(B, D, k)`` Gaussian probe for a Hutchinson estimate; None for exact
                (the k(D - k) horizontal basis directions).
            create_graph: keep the graph for backpropagation through the result.

        Returns:
            ``X: (B, D, k)`` and ``div: (B,)``.
        """
        path = self.last_path = self.path(hutchinson=noise is not None)
        if path == "forward":
            with torch.set_grad_enabled(create_graph and torch.is_grad_enabled()):
                X, div = self._forward_laplacian(t, Y, noise)
        elif path == "loop":
            X, div = self._loop_divergence(t, Y, create_graph)
        else:
            X, div = self._hvp_laplacian(t, Y, noise, create_graph)
        if not create_graph:
            X, div = X.detach(), div.detach()
        return X, div

    def path(self, hutchinson: bool = False) -> str:
        """The divergence path `field_and_divergence` takes.

        ``"auto"`` picks the fastest: for the exact divergence ``"forward"`` where the potential
        supports jets (``supports_jet``), else ``"hvp"``; for a Hutchinson estimate ``"hvp"``
        (one Hessian-vector product, while a jet still carries the k(D - k) first-order
        directions the field needs). ``"loop"`` runs a Hutchinson estimate as ``"hvp"``.
        """
        if self.laplacian == "hvp" or (self.laplacian == "loop" and hutchinson):
            return "hvp"
        if self.laplacian == "loop":
            return "loop"
        if self.laplacian == "auto" and hutchinson:
            return "hvp"
        if getattr(self.potential, "supports_jet", False):
            return "forward"
        if self.laplacian == "forward":
            raise ValueError(
                f"{type(self.potential).__name__} does not support the forward Laplacian "
                "(no supports_jet); use laplacian='auto' or 'hvp'"
            )
        return "hvp"

    def _forward_laplacian(self, t: Tensor, Y: Tensor, noise: Tensor | None):
        """One jet along the horizontal basis E (first and second derivatives; with ``noise``,
        second derivatives along the probe only) and along Y (first derivative only)."""
        D, k = Y.shape[-2:]
        F = horizontal_frame(Y)  # (B, D, D - k)
        E = horizontal_basis(Y, F)  # (k(D-k), B, D, k)
        probe = [] if noise is None else [horizontal_noise(Y, noise)[None]]
        dirs = torch.cat([*probe, E, Y[None]])
        out = self.potential(t, Jet.input(Y, dirs, n_lap=1 if probe else len(E)))
        dv = out.J  # (m, B): <G, dirs>
        # X = sum_a <G, E_a> E_a = F C with C[i, j] = <G, F_i e_j^T>
        C = dv[len(probe) : -1].unflatten(0, (D - k, k)).movedim((0, 1), (-2, -1))
        return F @ C, out.L - (D - k) * dv[-1]

    def _loop_divergence(self, t: Tensor, Y: Tensor, create_graph: bool):
        """``div X = sum_ij [(I - Y Y^T) d X_ij / dY]_ij``: one backward per coordinate."""
        with torch.enable_grad():
            if not Y.requires_grad:
                Y = Y.detach().requires_grad_(True)
            G = torch.autograd.grad(self.potential(t, Y).sum(), Y, create_graph=True)[0]
            X = G - Y @ (Y.mT @ G)
            div = Y.new_zeros(Y.shape[:-2])
            for i in range(Y.shape[-2]):
                for j in range(Y.shape[-1]):
                    row = torch.autograd.grad(
                        X[..., i, j].sum(), Y, retain_graph=True, create_graph=create_graph
                    )[0]
                    div = div + (row - Y @ (Y.mT @ row))[..., i, j]
        return X, div

    def _hvp_laplacian(self, t: Tensor, Y: Tensor, noise: Tensor | None, create_graph: bool):
        with torch.enable_grad():
            if not Y.requires_grad:
                Y = Y.detach().requires_grad_(True)
            G = torch.autograd.grad(self.potential(t, Y).sum(), Y, create_graph=True)[0]
            E = horizontal_basis(Y) if noise is None else horizontal_noise(Y, noise)[None]
            HE = torch.autograd.grad(
                G,
                Y,
                E if E.shape[0] > 1 else E[0],
                create_graph=create_graph,
                is_grads_batched=E.shape[0] > 1,
            )[0]
            YtG = Y.mT @ G
            X = G - Y @ YtG
            div = (E * HE).sum(dim=(0, -2, -1)) if E.shape[0] > 1 else (E[0] * HE).sum((-2, -1))
            div = div - ((E.mT @ E).sum(0) * YtG.mT).sum(dim=(-2, -1))
        return X, div
