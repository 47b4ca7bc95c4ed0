r"""``InternalFlow``: a molecule's shape model in internal coordinates (bonds, angles, torsions).

A normalized density on the conformers of one molecule with a bond graph, with the same
contract as `ShapeFlow`: ``log_prob`` in nats per molecule on the (n - 1) 3 centred
coordinates (so NLLs compare row by row), ``sample`` and ``sample_with_log_prob``, one
config record.

The pieces, each an exact bijection with its log-determinant:

1. ``x -> (R, q)``: `grassflow.manifolds.internal.InternalCoordinates` of the bond graph's
   `ZMatrix` (ring-closing bonds implicit by default, or ring atoms as a Cartesian block in
   the root frame); the orientation R is uniform on SO(3),
   ``log p(x) = log p(q) - log 8 pi^2 - log J(q)``.
2. ``q -> u`` in R^(3n - 6): bond lengths by ``log``, angles by ``logit(theta / pi)``, and
   each torsion, cut open at its least populated angle in the training data ``c``, by
   ``logit(((phi - c) mod 2 pi) / 2 pi)``. The torus minus one point per torsion (measure
   zero) maps onto R, so the density over (bonds, angles) x torus stays exactly normalized,
   and a torsion's modes never straddle the cut.
3. Whitening ``u -> L^{-1}(u - mu)``, fitted to the training data (`fit_normalization`): the
   full covariance (the ring block's correlations close rings; the torsions' take the
   linear part of their couplings), or (``whiten="diagonal"``) each coordinate
   standardized on its own. With ``torus=True`` the torsions stay angles and are
   standardized on the circle instead: ``g = 2 atan(tan((phi - m) / 2) / c)`` about their
   circular mean m, with c their wrapped-normal spread (at most 1, the identity), a
   diffeomorphism of the circle (`_moebius`) that widens a stiff torsion's few degrees
   as whitening widens a stiff bond (measured on butan-1-ol: clashes 4.4 % -> 0.5 %).
4. Equivalent siblings (`ZMatrix.swaps`: geminal hydrogens, e.g. the three of a methyl,
   and equivalent side trees, e.g. an isopropyl's two methyls with their hydrogens, a
   nitro group's O's, CF3's F's): their labels can swap without changing the molecule, and
   data from several embeddings hold both orders, so the sign of the second sibling's
   torsion about the first is a coin flip. The model ``p(x) = 2^{-s} p_c(c(x))``
   symmetrizes over the s swaps: ``c`` applies, in the order of `ZMatrix.swaps` (outer
   pairs first), each swap's whole permutation sigma (`ZMatrix.swap_sides`: a's side onto
   b's and back) where b's torsion ``(b, j, k, a)`` is negative on the coordinates swapped
   so far, and ``p_c`` takes that torsion in ``(0, pi)`` (step 2 with ``logit(phi /
   pi)``), so it lives on the canonical part only. Exact: sigma fixes j and k and
   ``torsion(a, j, k, b) = -torsion(b, j, k, a)``, so sigma maps one sign onto the other
   with volume 1, and no later (inner) swap moves an atom of an earlier test; c is 2^s to
   1 with unit Jacobian on each piece, so p integrates to one. Sampling draws from ``p_c``
   and applies the swaps with coins in the reverse order (inner first), the inverse of c on
   each piece. Without this, a flow leaks mass between the two signs, and the siblings land
   on each other. Not symmetrized (`grassflow.manifolds.zmatrix`): a ring's flip (a
   phenyl's 180-degree turn: its side is not a tree), siblings in the root frame, and the
   labellings of a group of three beyond its first pair.
   The mirror image (``mirror_row``): for a molecule without a hand (no stereo centre) the
   same holds for x and -x, whose torsions are negated (the force field cannot tell them
   apart either); labelled conformers again come in both "hands" (is the OH of
   cyclohexanol above or below the ring read from C2 to C6?). With ``mirror_row``, the
   torsion of that Z-matrix row (an improper one, far from 0 and pi in the data: see
   `choose_mirror_row`) also lives in ``(0, pi)``, c reflects x where it is negative, and
   the model symmetrizes over the reflection as well. c reflects first: the reflection
   negates every torsion, so it would flip the swaps' tests after them, while the swaps
   leave the mirror row's torsion alone (its atoms are in no swapped side).
5. A rational-quadratic spline flow, one of two designs (``InternalFlowConfig.torus``):
   ``torus=True``: every full torsion about a chain bond stays an angle on the circle (no
   cut, no logit in step 2, not shifted or scaled in step 3), and
   `grassflow.nn.torus_splines.TorusSplineFlow` maps R^a x T^c by coupling layers, circular
   splines on the torsions (one pass each way: sampling costs what the density costs), to a
   base that is a Gaussian mixture fitted to the real coordinates times uniform on the
   circle. Torsions about ring bonds are real, cut as in step 2: their pucker modes (two
   chairs) are joint, which the mixture and the whitening hold, and a uniform base does not
   (cyclohexanol: 42.8 % of samples kept every bond from a N(0, 1) x uniform base with every
   torsion circular, 99.5 % so); ``torus=False``
   (issue 41): zuko's ``NSF`` (autoregressive by default) from a Gaussian mixture fitted to
   the whitened data, whose sampling inverts 3n - 6 passes.

A bond is then one coordinate with its own small spread, so a broken bond is nearly
impossible, which a Cartesian field has to learn to 1 %.

The hand: internal coordinates carry it in the signs of the torsions (a mirror image has
every torsion negated, bonds and angles unchanged), and the density is over both hands:
``(R, q) -> x`` covers every non-degenerate configuration, mirror images included, once. A
mirror image gets the density of its negated torsions, which a model trained on one hand
makes small; nothing is reflected or cut, so normalization needs no correction.

References:
    Noé, Olsson, Köhler, Wu. Boltzmann generators. Science 365 (2019).
    Durkan, Bekasov, Murray, Papamakarios. Neural spline flows. NeurIPS 2019.
    Rozet et al. zuko: normalizing flows in PyTorch (the ``NSF`` used here).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..manifolds.internal import LOG_SO3_VOLUME, InternalCoordinates, dihedral, random_rotation
from ..manifolds.zmatrix import ZMatrix, build_zmatrix, ring_bonds
from ..nn.torus_splines import TorusSplineFlow

__all__ = ["InternalFlow", "InternalFlowConfig", "choose_mirror_row"]

TWO_PI = 2 * math.pi
TINY = 1e-9  # keeps logits finite at the ends of (0, 1)
CUT_BINS = 36


def _zuko():
    try:
        import zuko
    except ImportError as e:  # a core dependency; a broken install should say so
        raise ImportError("InternalFlow needs zuko: pip install zuko") from e
    return zuko


@dataclass(frozen=True)
class InternalFlowConfig:
    """Everything that defines an internal-coordinate model (`to_dict`, `from_dict`);
    `InternalFlow.from_config` builds it.

    Attributes:
        n_points: n, atoms per molecule (>= 3).
        bonds: the bond graph ``((i, j), ...)``, connected.
        labels: atomic numbers (hydrogens, 1, are placed after heavy atoms); or None.
        cartesian_rings: ring atoms as one Cartesian block in the root frame; False (the
            default, the measured winner on cyclohexanol: 99.9 % against 94.8 % of samples
            with every bond kept, `experiments/internal_coordinates/design.py`): Z-matrix
            rows for them too, the ring-closing bonds implicit, held by the whitening's
            correlations and the mixture.
        transforms, hidden, bins: the spline flow's layers, its conditioners' hidden
            widths, and the spline's bins.
        passes: None (autoregressive: one pass for the density, 3n - 6 to sample) or 2
            (coupling: two for both).
        components: of the Gaussian mixture the flow starts from (fitted by k-means and EM
            to the whitened training data; with ``torus``, to its real coordinates):
            separate modes (two chairs of a ring, rotamers) need no mass between them, which
            a flow from one Gaussian leaks.
        zmatrix: the `ZMatrix` as a dict; None: built from the bond graph (`build_zmatrix`).
        dim: 3 (molecules in space; the field is there so that the contract reads alike).
        mirror_row: index of the Z-matrix row whose torsion's sign the model symmetrizes
            over by reflection (an achiral molecule, `choose_mirror_row`); None: none.
        torus: the torsions on the circle: a `grassflow.nn.torus_splines.TorusSplineFlow`
            (coupling layers, circular splines on the torsions about chain bonds, a mixture
            x uniform base; ``passes`` unused); False: each torsion cut open at its
            emptiest angle and zuko's ``NSF`` from a Gaussian mixture (issue 41).
        whiten: ``"full"``: the real coordinates (all but the circular torsions) whitened by
            their full covariance; ``"diagonal"``: each standardized on its own.
        train_base: train the fitted mixture with the flow (the default). False: it stays as
            k-means and EM fitted it, and only the flow learns. On minimized conformers
            (near-copies of a few minima) a trained component shrinks onto one minimum until
            a step throws the loss up by 100-200 nats, and training spends thousands of steps
            getting back; a fixed mixture does not, and leads after 180 CPU s, but a trained
            one is 26 nats ahead after 20 CPU minutes (issue 46, butan-1-ol).
    """

    n_points: int
    bonds: tuple[tuple[int, int], ...]
    labels: tuple[int, ...] | None = None
    cartesian_rings: bool = False
    transforms: int = 4
    hidden: tuple[int, ...] = (128, 128)
    bins: int = 8
    passes: int | None = None
    zmatrix: dict | None = None
    dim: int = 3
    mirror_row: int | None = None
    components: int = 8
    torus: bool = False
    whiten: str = "full"
    train_base: bool = True

    def __post_init__(self):
        object.__setattr__(self, "bonds", tuple((int(i), int(j)) for i, j in self.bonds))
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if self.labels is not None:
            object.__setattr__(self, "labels", tuple(int(a) for a in self.labels))
            if len(self.labels) != self.n_points:
                raise ValueError(f"labels must have {self.n_points} entries, got "
                                 f"{len(self.labels)}")  # fmt: skip
        if self.dim != 3:
            raise ValueError(f"internal coordinates are for molecules in 3-D, got dim={self.dim}")
        if self.whiten not in ("full", "diagonal"):
            raise ValueError(f"whiten must be 'full' or 'diagonal', got {self.whiten!r}")
        if self.passes not in (None, 2):
            raise ValueError(f"passes must be None (autoregressive) or 2 (coupling), got "
                             f"{self.passes!r}")  # fmt: skip
        zm = build_zmatrix(self.n_points, self.bonds, self.labels, self.cartesian_rings) \
            if self.zmatrix is None else ZMatrix(**self.zmatrix)  # refuses a bad one
        object.__setattr__(self, "zmatrix", zm.to_dict())  # tuples, also after JSON
        if self.mirror_row is not None and not (0 <= self.mirror_row < len(zm.rows) and
                                                self.mirror_row in _mirror_rows(zm)):
            raise ValueError(f"mirror_row must index one of the {len(zm.rows)} Z-matrix rows that "
                             f"is not a swap's and has no atom in a swapped side, got "
                             f"{self.mirror_row!r}")  # fmt: skip

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> InternalFlowConfig:
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown InternalFlowConfig fields: {sorted(unknown)}")
        return cls(**d)


class InternalFlow(nn.Module):
    """Normalized density on the conformers of one molecule, in internal coordinates.

    Args:
        config: an `InternalFlowConfig` (or use `from_config` with its dict).

    Call `fit_normalization` with the training molecules before training (the torsions'
    cuts, the whitening and the base mixture); its values are saved with the weights.
    """

    @classmethod
    def from_config(cls, config: InternalFlowConfig | dict) -> InternalFlow:
        """The model of ``config`` (an `InternalFlowConfig` or its ``to_dict``)."""
        if isinstance(config, dict):
            config = InternalFlowConfig.from_dict(config)
        return cls(config)

    def __init__(self, config: InternalFlowConfig):
        super().__init__()
        self.config = config
        self.n_points, self.dim = config.n_points, 3
        self.chunk_size = 1024  # molecules per likelihood call in `evaluate`
        self.ic = InternalCoordinates(ZMatrix(**config.zmatrix))
        m = self.ic.dim
        self.n_swaps = len(self.ic.zmatrix.swaps)
        self.register_buffer("loc", torch.zeros(m, dtype=torch.float64))
        self.register_buffer("scale_tril", torch.eye(m, dtype=torch.float64))
        self.register_buffer("cut", torch.full((self.ic.n_torsions,), math.pi,
                                               dtype=torch.float64))  # fmt: skip
        zm = self.ic.zmatrix
        row = {r[0]: index for index, r in enumerate(zm.rows)}
        half = torch.zeros(self.ic.n_torsions, dtype=torch.bool)
        half[[row[b] for _, b in zm.swaps]] = True
        if config.mirror_row is not None:
            half[config.mirror_row] = True
        self.n_mirror = int(config.mirror_row is not None)
        self.register_buffer("half_turn", half, persistent=False)  # torsions in (0, pi)
        nb, na = self.ic.n_bonds, self.ic.n_angles
        circular = torch.zeros(m, dtype=torch.bool)
        if config.torus:  # the torsions that live on the whole circle: not about a ring bond
            ring = ring_bonds(self.n_points, config.bonds)
            about_ring = torch.tensor([tuple(sorted(r[1:3])) in ring for r in zm.rows],
                                      dtype=torch.bool)  # fmt: skip
            circular[nb + na: nb + na + self.ic.n_torsions] = ~half & ~about_ring
        self.register_buffer("circular", circular, persistent=False)
        if config.torus:  # the circle's standardization (`_moebius`), fitted to the data
            self.register_buffer("circ_mean", torch.zeros(self.ic.n_torsions, dtype=torch.float64))
            self.register_buffer("circ_width", torch.ones(self.ic.n_torsions, dtype=torch.float64))
        if config.torus:
            mixture = _zuko().flows.GMM(int((~circular).sum()), components=config.components)
            self.flow = TorusSplineFlow(circular, config.transforms, config.hidden, config.bins,
                                        real_base=mixture)  # fmt: skip
        else:
            zuko = _zuko()
            nsf = zuko.flows.NSF(m, transforms=config.transforms, bins=config.bins,
                                 hidden_features=config.hidden, passes=config.passes)
            for t in nsf.transform.transforms:  # the identity at first: training starts from
                last = t.hyper[-1]  # the mixture fitted to the data, not a random warp of it
                nn.init.zeros_(last.weight)
                nn.init.zeros_(last.bias)
            self.flow = zuko.flows.Flow(nsf.transform,
                                        zuko.flows.GMM(m, components=config.components))
        # per swap (in canonical order): the atoms (b, j, k, a) of its torsion test, and its
        # permutation sigma as an index (x[:, sigma] relabels)
        self.register_buffer("swap_tests", torch.tensor([zm.rows[row[b]] for _, b in zm.swaps],
                                                        dtype=torch.long).reshape(-1, 4),
                             persistent=False)  # fmt: skip
        self.register_buffer("swap_perms", torch.tensor(
            [zm.swap_permutation(m) for m in range(self.n_swaps)], dtype=torch.long).reshape(
            -1, self.n_points), persistent=False)  # fmt: skip
        mirror = zm.rows[config.mirror_row] if self.n_mirror else (0, 0, 0, 0)
        self.register_buffer("mirror_test", torch.tensor(mirror, dtype=torch.long),
                             persistent=False)  # fmt: skip
        if not config.train_base:  # still parameters, so that checkpoints keep the fit
            (self.flow.real_base if config.torus else self.flow.base).requires_grad_(False)
        self.last_stats: dict = {}
        self.double()  # one dtype for zuko's parameters and the buffers, whatever the default

    @property
    def zmatrix(self) -> ZMatrix:
        return self.ic.zmatrix

    @property
    def dtype(self) -> torch.dtype:
        """The model's floating dtype (inputs must match it)."""
        return self.loc.dtype

    @property
    def device(self) -> torch.device:
        return self.loc.device

    @property
    def event_dim(self) -> int:
        """(n - 1) 3, the dimension of the centred coordinates."""
        return 3 * (self.n_points - 1)

    @property
    def labels(self) -> Tensor | None:
        labels = self.config.labels
        return None if labels is None else torch.tensor(labels)

    @property
    def bonds(self) -> Tensor:
        return torch.tensor(self.config.bonds)

    def extra_repr(self) -> str:
        zm = self.zmatrix
        return (f"n_points={self.n_points}, rows={len(zm.rows)}, ring_block={len(zm.cartesian)}, "
                f"q={self.ic.dim}")  # fmt: skip

    # ------------------------------------------------------------ coordinates
    def _check(self, P: Tensor) -> None:
        if not isinstance(P, Tensor) or P.dim() != 3 or P.shape[1:] != (self.n_points, 3):
            shape = tuple(P.shape) if isinstance(P, Tensor) else type(P).__name__
            raise ValueError(f"P must be (B, {self.n_points}, 3) molecules, got {shape}")
        if P.dtype != self.dtype or P.device != self.device:
            raise ValueError(f"P is {P.dtype} on {P.device}, but the model is {self.dtype} on "
                             f"{self.device}; convert with .to() first")  # fmt: skip
        if P.shape[0] == 0 or not torch.isfinite(P).all():
            raise ValueError(f"P must be a non-empty batch of finite molecules, got "
                             f"{tuple(P.shape)}")  # fmt: skip

    def unbounded(self, q: Tensor) -> tuple[Tensor, Tensor]:
        """``u: (B, 3n - 6)`` in R^(3n - 6) of internal coordinates ``q``, and
        ``log |du/dq|: (B,)`` (step 2 of the module doc)."""
        bonds, theta, phi, block = self.ic.split(q)
        s_theta = (theta / math.pi).clamp(TINY, 1 - TINY)
        s_phi = torch.where(self.half_turn, phi / math.pi,
                            torch.remainder(phi - self.cut, TWO_PI) / TWO_PI).clamp(TINY, 1 - TINY)
        s = torch.cat([s_theta, s_phi], -1)
        u = torch.cat([bonds.log(), torch.logit(s), block], -1)
        span = torch.where(self.half_turn, math.pi, TWO_PI).to(s_phi).expand_as(s_phi)
        scale = torch.cat([torch.full_like(s_theta, math.pi), span], -1)
        log_d = (scale * s * (1 - s)).log()
        on_circle = self.circular[self.ic.n_bonds: self.ic.n_bonds + log_d.shape[-1]]
        if self.config.torus:  # circular torsions stay angles, standardized on the circle
            g, log_dg = _moebius(phi - self.circ_mean, self.circ_width)
            u = torch.where(self.circular, torch.cat([bonds.log(), theta, g, block], -1), u)
            log_d = torch.where(on_circle, -torch.cat([torch.zeros_like(theta), log_dg], -1),
                                log_d)  # fmt: skip
        ladj = -bonds.log().sum(-1) - log_d.sum(-1)
        return u, ladj

    def bounded(self, u: Tensor) -> Tensor:
        """The internal coordinates q of ``u`` (the inverse of `unbounded`)."""
        nb, na, nt = self.ic.n_bonds, self.ic.n_angles, self.ic.n_torsions
        log_b, a, t, block = u.split([nb, na, nt, self.ic.n_block], -1)
        cut_open = self.cut + TWO_PI * torch.sigmoid(t)
        if self.config.torus:
            on_circle = self.circular[nb + na: nb + na + nt]
            psi = 2 * torch.atan2(self.circ_width * torch.sin(t / 2), torch.cos(t / 2))
            cut_open = torch.where(on_circle, psi + self.circ_mean, cut_open)
        phi = torch.where(self.half_turn, math.pi * torch.sigmoid(t),
                          torch.remainder(cut_open + math.pi, TWO_PI) - math.pi)
        return torch.cat([log_b.exp(), math.pi * torch.sigmoid(a), phi, block], -1)

    def whiten(self, u: Tensor) -> Tensor:
        """``L^{-1} (u - mu)`` (step 3)."""
        L = self.scale_tril
        return torch.linalg.solve_triangular(L, (u - self.loc)[..., None], upper=False)[..., 0]

    @torch.no_grad()
    def fit_normalization(self, P: Tensor) -> None:
        """Fit the torsions' cuts (each at the centre of the emptiest of `CUT_BINS` bins of
        the training torsions, smoothed) and the whitening to the training molecules
        ``P: (N, n, 3)`` (any dtype); refuses near-linear Z-matrix angles
        (`InternalCoordinates.check_angles`)."""
        if not isinstance(P, Tensor) or P.dim() != 3 or P.shape[1:] != (self.n_points, 3):
            raise ValueError(f"P must be (N, {self.n_points}, 3) molecules")
        P = P.to(self.loc)
        self.ic.check_angles(P)
        q = self.ic(self.canonical(P))[1]
        phi = self.ic.split(q)[2]
        width = TWO_PI / CUT_BINS
        bins = ((phi + math.pi) / width).long().clamp(0, CUT_BINS - 1)
        counts = torch.zeros(phi.shape[1], CUT_BINS, dtype=q.dtype, device=q.device)
        counts.scatter_add_(1, bins.T, torch.ones_like(bins.T, dtype=q.dtype))
        smooth = counts + 0.5 * (counts.roll(1, 1) + counts.roll(-1, 1))
        self.cut.copy_(-math.pi + width * (smooth.argmin(1) + 0.5))
        if self.config.torus:  # each circular torsion's mean direction and spread
            z = torch.polar(torch.ones_like(phi), phi).mean(0)
            width = (-2 * z.abs().clamp_min(1e-12).log()).sqrt().clamp(1e-3, 1.0)
            on = self.circular[self.ic.n_bonds + self.ic.n_angles:][:len(self.cut)]
            self.circ_mean.copy_(torch.where(on, z.angle(), 0.0))
            self.circ_width.copy_(torch.where(on, width, 1.0))
        u = self.unbounded(q)[0]
        real = ~self.circular  # the circular torsions are standardized on the circle
        self.loc.zero_()
        self.loc[real] = u[:, real].mean(0)
        r = u[:, real]
        cov = torch.cov(r.T).reshape(r.shape[1], r.shape[1])
        if self.config.whiten == "diagonal":
            cov = torch.diag(cov.diagonal())
        cov = cov + 1e-8 * cov.diagonal().mean() * torch.eye(len(cov), dtype=cov.dtype,
                                                              device=cov.device)  # fmt: skip
        L = torch.eye(len(u[0]), dtype=u.dtype, device=u.device)
        L[real.nonzero(), real.nonzero()[:, 0]] = torch.linalg.cholesky(cov)
        self.scale_tril.copy_(L)
        w = self.whiten(u)
        if self.config.torus:
            self._init_mixture(self.flow.real_base, w[:, real])
        else:
            self._init_mixture(self.flow.base, w)

    @torch.no_grad()
    def _init_mixture(self, gmm, w: Tensor, iterations: int = 20) -> None:
        """zuko's ``GMM`` ``gmm`` fitted to the whitened training data ``w: (N, m)``: k-means
        (Lloyd, from evenly spaced points), then EM with full, ridged covariances."""
        logits, loc, diag, tril = gmm.phi
        # at least 4 m points per fitted component (few molecules: fewer components; the
        # rest keep a negligible weight), or EM fits each cluster's noise
        K = max(1, min(len(logits), len(w) // (4 * w.shape[1])))
        centers = w[torch.linspace(0, len(w) - 1, K).long()].clone()
        for _ in range(iterations):
            match = torch.cdist(w, centers).argmin(-1)
            for c in range(K):
                if (match == c).any():
                    centers[c] = w[match == c].mean(0)
        m = w.shape[1]
        eye = torch.eye(m, dtype=w.dtype, device=w.device)
        resp = torch.nn.functional.one_hot(match, K).to(w)
        for _ in range(iterations):  # EM: full covariances (a mode's bonds are correlations)
            n_k = resp.sum(0) + 1e-3
            mean = (resp.T @ w) / n_k[:, None]
            d = w[:, None, :] - mean  # (N, K, m)
            cov = torch.einsum("nk,nki,nkj->kij", resp, d, d) / n_k[:, None, None] + 1e-3 * eye
            L = torch.linalg.cholesky(cov)
            z = torch.linalg.solve_triangular(L, d.permute(1, 2, 0), upper=False)  # (K, m, N)
            log_n = -0.5 * z.square().sum(1).T - L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
            resp = torch.softmax(log_n + (n_k / n_k.sum()).log(), dim=-1)
        lower = torch.tril(torch.ones(m, m, dtype=torch.bool, device=w.device), -1)
        logits.fill_(-30.0)
        loc.zero_()
        diag.zero_()
        tril.zero_()
        logits[:K] = n_k.log()
        loc[:K] = mean
        diag[:K] = L.diagonal(dim1=-2, dim2=-1).log()
        tril[:K] = L[:, lower]

    @staticmethod
    def _torsion(P: Tensor, atoms: Tensor) -> Tensor:
        """``(B,)``: the torsion ``i-j-k-l`` of ``atoms = (i, j, k, l)`` in ``P: (B, n, 3)``,
        as `InternalCoordinates` computes it, for one row instead of a whole pass."""
        return dihedral(*(P[:, a] for a in atoms))

    def _swapped(self, P: Tensor, swap: Tensor) -> Tensor:
        """``P: (B, n, 3)`` with the permutation of each swap of `ZMatrix.swaps` applied where
        ``swap: (B, s)`` is True, inner swaps first (the last listed first): the inverse of
        `canonical` on the piece that ``swap`` names."""
        for m in reversed(range(self.n_swaps)):
            P = torch.where(swap[:, m, None, None], P[:, self.swap_perms[m]], P)
        return P

    def canonical(self, P: Tensor) -> Tensor:
        """``P: (B, n, 3)`` relabelled so that each swap's torsion ``(b, j, k, a)`` is
        positive (the part where ``p_c`` lives): reflected first where the mirror row's
        torsion is negative (`mirror_row`; the reflection negates every torsion, the swaps
        leave that row's alone), then each swap in turn, outer first, its test read on the
        molecules as swapped so far."""
        with torch.no_grad():
            flip = self._torsion(P, self.mirror_test) < 0 if self.n_mirror else None
        if flip is not None:
            P = torch.where(flip[:, None, None], -P, P)
        for m in range(self.n_swaps):
            with torch.no_grad():
                flip = self._torsion(P, self.swap_tests[m]) < 0
            P = torch.where(flip[:, None, None], P[:, self.swap_perms[m]], P)
        return P

    # ------------------------------------------------------------ densities
    def _log_prob_q(self, q: Tensor) -> Tensor:
        u, ladj = self.unbounded(q)
        w = self.whiten(u)
        ladj = ladj - self.scale_tril.diagonal().log().sum()
        eps, flow_ladj = self.to_base(w)
        return self.base_log_prob(eps) + flow_ladj + ladj

    # the spline flow between the whitened coordinates w and its base variable eps
    def to_base(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """``eps: (B, m)`` of whitened coordinates ``w: (B, m)``, and ``log |d eps/dw|``."""
        return self.flow.to_base(w) if self.config.torus else \
            self.flow().transform.call_and_ladj(w)  # fmt: skip

    def from_base(self, eps: Tensor) -> Tensor:
        """The inverse of `to_base`."""
        return self.flow.from_base(eps) if self.config.torus else self.flow().transform.inv(eps)

    def base_log_prob(self, eps: Tensor) -> Tensor:
        """The base density of ``eps: (B, m)``: the mixture (with ``torus``: on the real
        coordinates, times uniform on the circle)."""
        return self.flow.base_log_prob(eps) if self.config.torus else \
            self.flow().base.log_prob(eps)  # fmt: skip

    def sample_base(self, m: int, generator: torch.Generator | None = None) -> Tensor:
        """``(m, 3n - 6)`` draws of the base (``generator``: CPU, for reproducible draws)."""
        if self.config.torus:
            return self.flow.sample_base(m, generator)
        seed = int(torch.randint(2**62, (1,), generator=generator))
        with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
            torch.manual_seed(seed)
            return self.flow().base.sample((m,))

    def log_prob(self, P: Tensor, labels: Tensor | None = None) -> Tensor:
        """Exact log-density of molecules ``P: (B, n, 3)`` -> ``(B,)`` in nats per molecule,
        w.r.t. Lebesgue measure on the (n - 1) 3 centred coordinates (any translation).
        Differentiable. ``labels``: None (the contract of `ShapeFlow`; one molecule)."""
        if labels is not None:
            raise ValueError("InternalFlow models one molecule: pass labels=None")
        self._check(P)
        q = self.ic(self.canonical(P))[1]
        return (self._log_prob_q(q) - LOG_SO3_VOLUME - self.ic.log_volume(q)
                - (self.n_swaps + self.n_mirror) * math.log(2.0))  # fmt: skip

    def forward(self, P: Tensor, labels: Tensor | None = None) -> Tensor:
        """Alias of `log_prob`."""
        return self.log_prob(P, labels)

    # ------------------------------------------------------------ sampling
    def _sample_q(self, m: int, generator: torch.Generator | None) -> Tensor:
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ValueError(f"number of samples must be an integer >= 1, got {m!r}")
        w = self.from_base(self.sample_base(m, generator))
        u = self.loc + (self.scale_tril @ w[..., None])[..., 0]
        return self.bounded(u)

    def sample_with_log_prob(
        self, m: int, generator: torch.Generator | None = None, labels: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``m`` centred molecules ``(m, n, 3)`` and their exact log-density ``(m,)`` (for
        importance weights); ``generator``: a CPU generator, for reproducible draws."""
        if labels is not None:
            raise ValueError("InternalFlow models one molecule: pass labels=None")
        with torch.no_grad():
            X = self.sample(m, generator)
            return X, self.log_prob(X)

    def sample(self, m: int, generator: torch.Generator | None = None,
               labels: Tensor | None = None) -> Tensor:  # fmt: skip
        """``m`` centred molecules ``(m, n, 3)``."""
        if labels is not None:
            raise ValueError("InternalFlow models one molecule: pass labels=None")
        with torch.no_grad():
            q = self._sample_q(m, generator)
            X = self.ic.inverse(random_rotation(m, self.dtype, self.device, generator), q)
            coins = (torch.rand(m, self.n_swaps + 1, generator=generator) < 0.5).to(self.device)
            if self.n_mirror:  # a reflection commutes with relabelling: the order is free
                X = torch.where(coins[:, -1, None, None], -X, X)
            return self._swapped(X, coins[:, :-1])


def _moebius(psi: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """The circle's standardization ``g = 2 atan(tan(psi / 2) / c)`` (wrapped to [-pi, pi)), a
    diffeomorphism of the circle that widens the arc near 0 by 1 / c and narrows the far
    side by c (the CDF of a wrapped Cauchy, rescaled), and ``log dg/dpsi``. c = 1: the
    identity."""
    s, co = torch.sin(psi / 2), torch.cos(psi / 2)
    g = torch.remainder(2 * torch.atan2(s, c * co) + math.pi, TWO_PI) - math.pi
    return g, c.log() - (c.square() * co.square() + s.square()).log()


def choose_mirror_row(zmatrix: ZMatrix, P: Tensor, labels=None, margin_deg: float = 15.0,
                      least: float = 0.05) -> int | None:  # fmt: skip
    """The Z-matrix row whose torsion best tells the two "hands" of labelled conformers of a
    molecule without one, for `InternalFlowConfig.mirror_row`: among rows of heavy atoms
    (``labels`` != 1; all if None), those whose torsion stays ``margin_deg`` away from 0 and
    180 degrees in ``P: (N, n, 3)`` with each sign in at least ``least`` of them, the most
    balanced; None if no row qualifies. Call it only for a molecule without a hand
    (`grassflow.data.molecule_files.find_hand` finds none): a chiral one keeps its hand.
    Rows with an atom in a swapped side (`ZMatrix.swap_sides`) are not candidates."""
    ic = InternalCoordinates(zmatrix).to(torch.as_tensor(P).dtype)
    phi = torch.rad2deg(ic.split(ic(torch.as_tensor(P))[1])[2])
    heavy = (lambda a: True) if labels is None else (lambda a: int(labels[a]) != 1)
    best, best_gap, allowed = None, math.inf, _mirror_rows(zmatrix)
    for m, row in enumerate(zmatrix.rows):
        f = phi[:, m]
        if m not in allowed or not all(heavy(a) for a in row) or not (
                (f.abs() > margin_deg) & (f.abs() < 180 - margin_deg)).all():  # fmt: skip
            continue
        positive = (f > 0).double().mean().item()
        if least <= positive <= 1 - least and abs(positive - 0.5) < best_gap:
            best, best_gap = m, abs(positive - 0.5)
    return best


def _mirror_rows(zmatrix: ZMatrix) -> set[int]:
    """The rows that may carry the mirror's test: none of their atoms moved by a swap (else
    the swaps, applied after the reflection in `InternalFlow.canonical`, could change it)."""
    moved = {u for A, B in zmatrix.swap_sides for u in A + B}
    return {m for m, row in enumerate(zmatrix.rows) if not moved & set(row)}

