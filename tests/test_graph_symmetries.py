"""`InternalFlow` symmetrized over equivalent sibling subtrees (issue 46 item 4), held to the
density contract on a molecule whose symmetry moves more than two atoms.

The molecule, ``branch``, 9 atoms: a centre C0 with two different heavy leaves (O1, F2: the
root frame) and two equivalent CH2 groups M3 (H5, H6) and M4 (H7, H8): the swap of the two
sides, sigma = (3 4)(5 7)(6 8), is a graph automorphism that moves six atoms, and inside each
side a geminal pair. `build_zmatrix` lists three swaps: the outer one (3, 4), b's row
(4, 0, 1, 3), then the inner ones (5, 6) and (7, 8).

The data: a Gaussian random walk down the bond tree from C0 (each atom its parent plus a
N(0, I) step), kept away from straight Z-matrix angles. Unlike independent atoms it is not
symmetric under the exchange of M3 and M4 alone (each H stays near its own carbon), only
under sigma; so a model that swaps a <-> b without their sides, or skips a coin, is seen.

Independent computations: importance sampling with the walk's own Gaussian law (scaled by
1.1) in the centred coordinates, its density written out from the walk's matrix;
permutations written out by hand; self-normalized importance sampling against the sampler
and against a sampler written out by hand.
"""

import math

import pytest
import torch

from grassflow.flows.internal_flow import InternalFlow, InternalFlowConfig
from grassflow.manifolds.shape_space import helmert_basis
from grassflow.manifolds.zmatrix import ZMatrix

F64 = torch.float64
N_MC = 20_000
N_SAMPLE = 8000
SCALE = 1.1  # the proposal's scale against the data's walk
BONDS = ((0, 1), (0, 2), (0, 3), (0, 4), (3, 5), (3, 6), (4, 7), (4, 8))
LABELS = (6, 8, 9, 6, 6, 1, 1, 1, 1)
N = len(LABELS)
OUTER = [0, 1, 2, 4, 3, 7, 8, 5, 6]  # sigma: M3's side onto M4's, by hand
INNER = [0, 1, 2, 3, 4, 6, 5, 7, 8]  # the geminal pair (5, 6) on M3
ONLY_AB = [0, 1, 2, 4, 3, 5, 6, 7, 8]  # M3 <-> M4 without their hydrogens (not a symmetry)
_built: dict = {}


def _walk_matrix() -> torch.Tensor:
    """``T: (n, n - 1)``, x = T eps: atom u is the sum of the steps on the path from C0 to u
    (one step per bond, the bond's index in BONDS)."""
    T = torch.zeros(N, N - 1, dtype=F64)
    parent = {1: 0, 2: 0, 3: 0, 4: 0, 5: 3, 6: 3, 7: 4, 8: 4}
    for u in range(1, N):
        v = u
        while v:
            T[u, BONDS.index((parent[v], v))] = 1.0
            v = parent[v]
    return T


def _walk(M: int, g: torch.Generator, s: float = 1.0):
    """``x: (M, n, 3)`` centred walks with steps N(0, s^2 I), and the log-density of z =
    H^T x: N(0, s^2 A A^T) per spatial axis, A = H^T T."""
    T, H = _walk_matrix(), helmert_basis(N, F64)
    eps = s * torch.randn(M, N - 1, 3, generator=g, dtype=F64)
    x = T @ eps
    x = x - x.mean(1, keepdim=True)
    A = H.mT @ T
    z = H.mT @ x
    white = torch.linalg.solve(A, z) / s  # eps / s, recomputed from z
    log_q = (-0.5 * white.square().sum((1, 2)) - 3 * torch.linalg.slogdet(A)[1]
             - 1.5 * (N - 1) * math.log(2 * math.pi * s**2))  # fmt: skip
    return x, log_q


def _data(model: InternalFlow, M: int, g: torch.Generator, margin: float = 10.0):
    """``M`` walks with every Z-matrix angle ``margin`` degrees from 0 and 180 (a set that
    the swaps map onto itself, so the data keep the symmetry)."""
    out, have = [], 0
    while have < M:
        x = _walk(2 * M, g)[0]
        theta = torch.rad2deg(model.ic.split(model.ic(x)[1])[1])
        x = x[((theta > margin) & (theta < 180 - margin)).all(-1)]
        out.append(x)
        have += len(x)
    return torch.cat(out)[:M]


def _model() -> InternalFlow:
    """The model of ``branch``, fitted and trained 200 steps on walks (built once); coupling
    layers (``passes=2``), so that sampling costs two passes."""
    if "branch" not in _built:
        torch.manual_seed(20)
        model = InternalFlow(InternalFlowConfig(N, BONDS, LABELS, transforms=3, hidden=(32, 32),
                                                passes=2)).double()  # fmt: skip
        g = torch.Generator().manual_seed(21)
        data = _data(model, 4000, g)
        model.fit_normalization(data)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(200):
            loss = -model.log_prob(data[torch.randint(0, len(data), (256,), generator=g)]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        _built["branch"] = model.eval()
    return _built["branch"]


def _old_canonical(model: InternalFlow):
    """The canonicalization before issue 46, on the new Z-matrix (the plausible bug): every
    swap's test read on the input at once, and only a <-> b exchanged."""

    def canonical(P):
        row = {r[0]: m for m, r in enumerate(model.zmatrix.rows)}
        phi = model.ic.split(model.ic(P)[1])[2][:, [row[b] for _, b in model.zmatrix.swaps]]
        index = torch.arange(N).expand(len(P), -1).clone()
        for m, (a, b) in enumerate(model.zmatrix.swaps):
            index[:, a] = torch.where(phi[:, m] < 0, b, a)
            index[:, b] = torch.where(phi[:, m] < 0, a, b)
        return P.gather(1, index[..., None].expand(-1, -1, 3))

    return canonical


def _leaf_only(model: InternalFlow) -> InternalFlow:
    """The same weights with each swap exchanging a <-> b only (``swap_sides`` of leaves)."""
    zm = model.zmatrix.to_dict()
    zm.pop("swap_sides", None)
    config = InternalFlowConfig(**{**model.config.to_dict(), "zmatrix": zm})
    other = InternalFlow(config).double()
    other.load_state_dict(model.state_dict())
    return other.eval()


def test_the_branch_has_an_outer_swap_of_whole_sides_and_two_inner_pairs():
    """Catches a Z-matrix that misses the non-geminal symmetry this file tests (or lists it
    after its inner pairs): the swaps, outer first, and sigma as written out by hand."""
    zm = _model().zmatrix
    assert zm.swaps == ((3, 4), (5, 6), (7, 8))
    assert {r[0]: r for r in zm.rows}[4] == (4, 0, 1, 3)
    assert zm.swap_permutation(0) == OUTER and zm.swap_permutation(1) == INNER


def test_integrates_to_one_by_importance_sampling():
    """Catches a symmetrization that leaves the density unnormalized when a swap moves whole
    sides: E_q[p / q] = 1 for the walk's Gaussian q (scale 1.1) within 4 standard errors
    (se < 0.03). Power: the same estimate with 2^-s dropped, and with the canonicalization
    before issue 46 (tests read at once, a <-> b exchanged without their sides), is outside
    its own 4 standard errors; and the trained flow moves mass."""
    model = _model()
    x, log_q = _walk(N_MC, torch.Generator().manual_seed(1), SCALE)
    with torch.no_grad():
        lp = model.log_prob(x)
        w_flow = model.whiten(model.unbounded(model.ic(model.canonical(x))[1])[0])
        flow_ladj = model.to_base(w_flow)[1]
        model.canonical = _old_canonical(model)
        try:
            lp_old = model.log_prob(x)
        finally:
            del model.canonical
    assert flow_ladj.abs().mean() > 0.2, flow_ladj.abs().mean()
    w = (lp - log_q).exp()
    se = (w.std() / N_MC**0.5).item()
    assert se < 0.03, se
    assert abs(w.mean().item() - 1) <= 4 * se, (w.mean().item(), se)
    for bug, wb in {"no 2^-s": w * 2.0 ** len(model.zmatrix.swaps),
                    "a <-> b only, tests at once": (lp_old - log_q).exp()}.items():  # fmt: skip
        assert abs(wb.mean().item() - 1) > 4 * (wb.std() / N_MC**0.5).item(), (bug, wb.mean())


def test_log_prob_is_invariant_under_each_whole_swap_and_their_composition():
    """Catches a density that sees which of two equivalent sides is which: log_prob is
    unchanged to 1e-8 under sigma (the outer swap, six atoms), the inner geminal pair, and
    sigma after the inner pair (each permutation written out by hand). Power: M3 <-> M4
    without their hydrogens changes it (by over 1 nat in most molecules), and the same weights
    with swaps that exchange a <-> b only are not invariant under sigma."""
    model = _model()
    x = _data(model, 64, torch.Generator().manual_seed(2))
    both = [OUTER[i] for i in INNER]  # x[:, INNER] then [:, OUTER]
    with torch.no_grad():
        lp = model.log_prob(x)
        for perm in (OUTER, INNER, both, [INNER[i] for i in OUTER]):
            torch.testing.assert_close(model.log_prob(x[:, perm]), lp, atol=1e-8, rtol=0)
        moved = (model.log_prob(x[:, ONLY_AB]) - lp).abs()
        leaf = _leaf_only(model)
        leaf_moved = (leaf.log_prob(x[:, OUTER]) - leaf.log_prob(x)).abs()
    assert (moved > 1).double().mean() > 0.5, moved
    assert (leaf_moved > 1e-3).double().mean() > 0.5, leaf_moved


def _statistics(x: torch.Tensor) -> torch.Tensor:
    """``(M, 5)``: the signed volume of C0, O1, M3, M4 (which side is where), the distances
    M3-H5 and M4-H7 (whether the hydrogens travel with their carbon), and the signed volumes
    of C0, M3, H5, H6 and C0, M4, H7, H8 (each inner pair's order)."""

    def volume(a, b, c, d):
        return torch.linalg.det(torch.stack([x[:, b] - x[:, a], x[:, c] - x[:, a],
                                             x[:, d] - x[:, a]], -1))  # fmt: skip

    return torch.stack([volume(0, 1, 3, 4), (x[:, 3] - x[:, 5]).norm(dim=-1),
                        (x[:, 4] - x[:, 7]).norm(dim=-1), volume(0, 3, 5, 6),
                        volume(0, 4, 7, 8)], -1)  # fmt: skip


def _by_hand(model: InternalFlow, M: int, g: torch.Generator) -> dict:
    """Draws of p_c (the flow's canonical part), then the swaps' coins, inner first, with
    the permutations written out by hand; and the same draws through one bug each."""
    with torch.no_grad():
        y = model.ic.inverse(torch.eye(3, dtype=F64).expand(M, 3, 3), model._sample_q(M, g))
        coins = [torch.rand(M, generator=g) < 0.5 for _ in range(3)]
        inner2 = [0, 1, 2, 3, 4, 5, 6, 8, 7]

        def place(outer, outer_coin=True):
            x = y
            for perm, coin in ((inner2, coins[2]), (INNER, coins[1])):
                x = torch.where(coin[:, None, None], x[:, perm], x)
            return torch.where((coins[0] & outer_coin)[:, None, None], x[:, outer], x)

        return {"by hand": place(OUTER), "no coin on the outer swap": place(OUTER, False),
                "outer coin swaps a <-> b only": place(ONLY_AB)}  # fmt: skip


def test_sampler_draws_the_law_that_log_prob_scores():
    """Catches a sampler that does not undo the canonicalization of whole sides: the mean of
    each statistic under `sample`, and under the sampler written out by hand, agrees with
    its self-normalized importance estimate (weights p / q from log_prob) within 4 combined
    standard errors. Power: the hand sampler with no coin on the outer swap, or with the
    outer coin exchanging M3 and M4 without their hydrogens, is caught."""
    model = _model()
    x, log_q = _walk(N_MC, torch.Generator().manual_seed(3), SCALE)
    with torch.no_grad():
        lw = model.log_prob(x) - log_q
    w = (lw - lw.max()).exp()
    w = w / w.sum()
    f = _statistics(x)
    target = (w[:, None] * f).sum(0)
    se_target = (w[:, None].square() * (f - target).square()).sum(0).sqrt()

    def z_scores(x):
        f = _statistics(x)
        return (f.mean(0) - target) / (f.var(0) / len(f) + se_target**2).sqrt()

    drawn = model.sample(N_SAMPLE, torch.Generator().manual_seed(4))
    assert z_scores(drawn).abs().max() < 4, z_scores(drawn)
    hand = _by_hand(model, N_SAMPLE, torch.Generator().manual_seed(5))
    assert z_scores(hand.pop("by hand")).abs().max() < 4
    for bug, x in hand.items():
        assert z_scores(x).abs().max() > 4, (bug, z_scores(x))


def test_swap_sides_survive_the_config_and_refuse_a_bad_permutation():
    """Catches side permutations a saved run loses, and hand-made ones that would break the
    exactness: a JSON round trip of the config gives the same swaps and log_prob; sides that
    move j or k, are no involution (an atom twice), or list an inner swap first are
    refused."""
    import json

    model = _model()
    config = json.loads(json.dumps(model.config.to_dict()))
    assert config["zmatrix"]["swap_sides"][0] == [[3, 5, 6], [4, 7, 8]]
    other = InternalFlow.from_config(config).double()
    other.load_state_dict(model.state_dict())
    x = _data(model, 8, torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(other.log_prob(x), model.log_prob(x), atol=0, rtol=0)
    zm = model.zmatrix.to_dict()
    for sides, message in [((((3, 0), (4, 1)),), "must fix j=0 and k=1"),
                           ((((3, 5), (4, 5)),), "no involution"),
                           ((((3,), (4, 5)),), "one length")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            ZMatrix(**{**zm, "swap_sides": sides + tuple(zm["swap_sides"][1:])})
    inner_first = {**zm, "swaps": zm["swaps"][1:2] + zm["swaps"][:1] + zm["swaps"][2:],
                   "swap_sides": (((5,), (6,)), ((3, 5, 6), (4, 7, 8)), ((7,), (8,)))}
    with pytest.raises(ValueError, match="list outer swaps first"):
        ZMatrix(**inner_first)


def test_canonical_puts_every_swapped_torsion_in_the_upper_half():
    """Catches a canonicalization whose test disagrees with the Z-matrix torsion it guards
    (another formula or sign, or tests read before the outer swap moved the inner pairs):
    after `canonical`, each swap's torsion computed by the full internal-coordinate pass is
    in (0, pi) for every molecule, where the input has each sign in about half of them; the
    canonical molecules are permutations of the input (the same multiset of positions)."""
    model = _model()
    x = _walk(2000, torch.Generator().manual_seed(7))[0]
    row = {r[0]: m for m, r in enumerate(model.zmatrix.rows)}
    rows = [row[b] for _, b in model.zmatrix.swaps]
    with torch.no_grad():
        before = model.ic.split(model.ic(x)[1])[2][:, rows]
        c = model.canonical(x)
        after = model.ic.split(model.ic(c)[1])[2][:, rows]
    assert ((before > 0).double().mean(0) - 0.5).abs().max() < 0.05
    assert (after > 0).all()
    key = lambda P: P[..., 0] * 1e6 + P[..., 1] * 1e3 + P[..., 2]  # noqa: E731
    assert torch.equal(key(c).sort(1).values, key(x).sort(1).values)
