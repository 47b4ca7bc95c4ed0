"""`InternalFlow`: a molecule's density in internal coordinates, held to the density contract.

Three small molecules, each trained briefly (so that the spline flow moves mass) on broad
synthetic data, independent Gaussian atoms kept away from straight Z-matrix angles, so
that a Gaussian in the (n - 1) 3 centred coordinates is a good importance proposal:

* ``chain4``: 0-1-2-3 (H2O2-like), all heavy, symmetrized over the mirror image by its one
  torsion (``mirror_row=0``): no ring, no geminal pair;
* ``methanol``: C, O and four hydrogens: one geminal pair (the model's 2^-s symmetrization);
* ``ring5``: a 4-ring with a tail atom: one atom in the Cartesian ring block.

Each also with the torsions on the circle (``-torus``: `TorusSplineFlow`, issue 46).

Independent computations: importance sampling with a normalized Gaussian (integrates to
one, with power guards against each plausible missing factor); the full change of
variables from the spline flow's base variable (the base's own log_prob) by autograd
(the value of log_prob); self-normalized importance sampling against the sampler and a
sampler written out by hand; rigid motions, label swaps and the mirror image; and ring
bonds of sampled cyclohexane.
"""

import json
import math

import numpy as np
import pytest
import torch

from grassflow.flows.contract import DensityModel
from grassflow.flows.internal_flow import InternalFlow, InternalFlowConfig
from grassflow.manifolds.shape_space import helmert_basis

F64 = torch.float64
LOG_8PI2 = math.log(8 * math.pi**2)  # written out: the Haar volume of SO(3)
N_MC = 20_000
N_SAMPLE = 8000  # draws from the sampler (the autoregressive inverse: one pass per dimension)
SCALE = 1.1  # the proposal's standard deviation (the data's is 1)

SMALL = {
    "chain4": dict(n_points=4, bonds=((0, 1), (1, 2), (2, 3)), mirror_row=0),
    "methanol": dict(
        n_points=6, bonds=((0, 1), (0, 2), (0, 3), (0, 4), (1, 5)), labels=(6, 8, 1, 1, 1, 1)
    ),  # fmt: skip
    "ring5": dict(n_points=5, bonds=((0, 1), (1, 2), (2, 3), (3, 0), (0, 4)), cartesian_rings=True),
}
# the same molecules with the torsions on the circle (`TorusSplineFlow`, issue 46)
SMALL.update({f"{name}-torus": {**kw, "torus": True, "whiten": "diagonal"}
              for name, kw in list(SMALL.items())})
# the ring in Z-matrix rows: its torsions cut open and whitened in full, the rest circular
SMALL["ring5-rows-torus"] = {**SMALL["ring5"], "cartesian_rings": False, "torus": True}
_built: dict = {}


def _broad(model: InternalFlow, N: int, g: torch.Generator, margin: float = 10.0):
    """``N`` molecules of independent standard normal atoms with every Z-matrix angle at
    least ``margin`` degrees from 0 and 180 (z is then a truncated standard normal)."""
    out, have = [], 0
    while have < N:
        x = torch.randn(2 * N, model.n_points, 3, generator=g, dtype=F64)
        theta = torch.rad2deg(model.ic.split(model.ic(x)[1])[1])
        x = x[((theta > margin) & (theta < 180 - margin)).all(-1)]
        out.append(x)
        have += len(x)
    return torch.cat(out)[:N]


def _train(model: InternalFlow, data: torch.Tensor, steps: int, batch: int, lr: float,
           g: torch.Generator) -> InternalFlow:  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = -model.log_prob(data[torch.randint(0, len(data), (batch,), generator=g)]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _small(name: str) -> InternalFlow:
    """The trained model of ``SMALL[name]`` (built once per session)."""
    if name not in _built:
        torch.manual_seed(10)
        model = InternalFlow(InternalFlowConfig(**SMALL[name], transforms=2 + 2 * SMALL[name].get(
            "torus", False), hidden=(32, 32)))  # fmt: skip
        model = model.double()
        g = torch.Generator().manual_seed(11)
        data = _broad(model, 4000, g)
        model.fit_normalization(data)
        if model.config.torus:  # broad data fit the identity: make the circle's
            with torch.no_grad():  # standardization (`_moebius`) matter
                model.circ_width.fill_(0.4)
                model.circ_mean.fill_(1.0)
        _built[name] = _train(model, data, steps=200, batch=256, lr=3e-3, g=g)
    return _built[name]


def _proposal(n: int, N: int, g: torch.Generator, s: float = SCALE):
    """``x: (N, n, 3)`` centred with z = H^T x ~ N(0, s^2 I), and log q(z)."""
    z = s * torch.randn(N, n - 1, 3, generator=g, dtype=F64)
    d = 3 * (n - 1)
    log_q = -0.5 * d * math.log(2 * math.pi * s**2) - z.square().sum((1, 2)) / (2 * s**2)
    return helmert_basis(n, F64) @ z, log_q


def _skew(w: torch.Tensor) -> torch.Tensor:
    z = torch.zeros_like(w[0])
    return torch.stack([torch.stack([z, -w[2], w[1]]), torch.stack([w[2], z, -w[0]]),
                        torch.stack([-w[1], w[0], z])])  # fmt: skip


def _rotation(g: torch.Generator) -> torch.Tensor:
    Q = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=F64))[0]
    return Q * torch.det(Q)


# ------------------------------------------------------------------ (a) normalization
@pytest.mark.parametrize("name", list(SMALL))
def test_integrates_to_one_by_importance_sampling(name):
    """Catches any missing or wrong factor of the density: E_q[p / q] = 1 for a normalized
    Gaussian q in the centred coordinates, within 4 standard errors. Power, written out:
    the same estimate with log J's -1.5 log n (the centre of mass) dropped or of the wrong
    sign, or the density off by 8 pi^2 (the
    orientation), b for b^2 (a bond's Jacobian), sin(theta) (an angle's), det L (the
    whitening), 2 per full torsion (pi for 2 pi in its logit), 2^s (the geminal
    symmetrization) or 2 (the mirror symmetrization) is outside its own 4 standard errors;
    and the trained flow moves mass."""
    model = _small(name)
    n = model.n_points
    x, log_q = _proposal(n, N_MC, torch.Generator().manual_seed(1))
    with torch.no_grad():
        lp = model.log_prob(x)
        q = model.ic(x)[1]
        # the flow is not the identity (else a wrong spline log-det would go unseen)
        w_flow = model.whiten(model.unbounded(model.ic(model.canonical(x))[1])[0])
        flow_ladj = model.to_base(w_flow)[1]
    assert flow_ladj.abs().mean() > 0.2, flow_ladj.abs().mean()
    w = (lp - log_q).exp()
    se = (w.std() / N_MC**0.5).item()
    assert se < 0.03, se
    assert abs(w.mean().item() - 1) <= 4 * se, (w.mean().item(), se)
    bonds, theta = model.ic.split(q)[:2]
    s, mirror = len(model.zmatrix.swaps), int(model.config.mirror_row is not None)
    bugs = {
        "no -1.5 log n": torch.tensor(n**-1.5), "+1.5 log n": torch.tensor(n**-3.0),
        "no 8 pi^2": torch.tensor(8 * math.pi**2), "b for b^2": bonds.prod(-1),
        "no sin": theta.sin().prod(-1), "no det L": model.scale_tril.diagonal().prod(),
    }  # fmt: skip
    if model.ic.n_torsions - s - mirror:
        bugs["pi for 2 pi"] = torch.tensor(2.0 ** (model.ic.n_torsions - s - mirror))
    if s:
        bugs["no 2^-s"] = torch.tensor(2.0**s)
    if mirror:
        bugs["no 1/2 of the mirror"] = torch.tensor(2.0)
    for bug, factor in bugs.items():
        wb = w * factor
        assert abs(wb.mean().item() - 1) > 4 * (wb.std() / N_MC**0.5).item(), bug


# ------------------------------------------------------------------ (b) value
@pytest.mark.parametrize("name", list(SMALL))
def test_log_prob_is_the_change_of_variables_from_the_base_variable(name):
    """Catches a wrong term anywhere in log_prob (the unbounded map's Jacobian, whitening,
    the volume, the cut, the half-turn torsions of geminal pairs and of the mirror row, the
    block, the base): at points z = H^T inverse(R0 expm([omega]x), bounded(mu + L
    T^{-1}(eps))) for eps drawn from the base, log_prob equals log base(eps) - log |det dz /
    d(omega, eps)| - log 8 pi^2 - (s + mirror) log 2, the determinant by autograd at
    omega = 0 (where Haar measure has unit density), to 1e-8."""
    model = _small(name)
    n = model.n_points
    H = helmert_basis(n, F64)
    s = len(model.zmatrix.swaps) + int(model.config.mirror_row is not None)
    g = torch.Generator().manual_seed(2)
    points = model.sample_base(3, torch.Generator().manual_seed(2))
    for eps in points:
        R0 = _rotation(g)

        def z_of(v, R0=R0):
            R = R0 @ torch.linalg.matrix_exp(_skew(v[:3]))
            u = model.loc + model.scale_tril @ model.from_base(v[None, 3:])[0]
            return (H.mT @ model.ic.inverse(R, model.bounded(u))).reshape(-1)

        v0 = torch.cat([torch.zeros(3, dtype=F64), eps])
        jac = torch.autograd.functional.jacobian(z_of, v0)
        assert jac.shape == (3 * (n - 1), 3 * (n - 1))
        log_base = model.base_log_prob(eps[None])[0]
        want = log_base - torch.linalg.slogdet(jac)[1] - LOG_8PI2 - s * math.log(2)
        x = (H @ z_of(v0).reshape(n - 1, 3))[None]
        with torch.no_grad():
            got = model.log_prob(x)
        assert abs(got.item() - want.item()) < 1e-8, (got.item(), want.item())


# ------------------------------------------------------------------ (c) sampler
def _statistics(model: InternalFlow, x: torch.Tensor) -> torch.Tensor:
    """``(N, k)``: two distances, the signed volume of atoms 0-3 (the hand) and, per geminal
    pair (a, b) with row (b, j, k, a), the signed volume of j, k, a, b (the pair's order)."""
    n = model.n_points

    def volume(a, b, c, d):
        return torch.linalg.det(torch.stack([x[:, b] - x[:, a], x[:, c] - x[:, a],
                                             x[:, d] - x[:, a]], -1))  # fmt: skip

    cols = [(x[:, 0] - x[:, n - 1]).norm(dim=-1), (x[:, 1] - x[:, n - 2]).norm(dim=-1),
            volume(0, 1, 2, 3)]  # fmt: skip
    row = {r[0]: r for r in model.zmatrix.rows}
    for a, b in model.zmatrix.swaps:
        _, j, k, _ = row[b]
        cols.append(volume(j, k, a, b))
    return torch.stack(cols, -1)


def _snis(model: InternalFlow, N: int, g: torch.Generator):
    """Self-normalized importance estimate of E_p[statistics] and its standard error."""
    x, log_q = _proposal(model.n_points, N, g)
    with torch.no_grad():
        lw = model.log_prob(x) - log_q
    w = (lw - lw.max()).exp()
    w = w / w.sum()
    f = _statistics(model, x)
    mean = (w[:, None] * f).sum(0)
    return mean, (w[:, None].square() * (f - mean).square()).sum(0).sqrt()


def _by_hand(model: InternalFlow, N: int, g: torch.Generator) -> dict:
    """The sampler written out from the module doc (base -> flow inverse -> whitening ->
    bounded -> Haar orientation -> the mirror image and each geminal pair's swap with
    probability 1/2), and the same draws through one plausible bug each (for the power
    guard): ``{name: x}``."""
    with torch.no_grad():
        eps = model.sample_base(N, g)
        quat = torch.randn(N, 4, generator=g, dtype=F64)  # Haar: a uniform unit quaternion
        a, b, c, d = (quat / quat.norm(dim=-1, keepdim=True)).unbind(-1)
        R = torch.stack([1 - 2 * (c * c + d * d), 2 * (b * c - a * d), 2 * (b * d + a * c),
                         2 * (b * c + a * d), 1 - 2 * (b * b + d * d), 2 * (c * d - a * b),
                         2 * (b * d - a * c), 2 * (c * d + a * b), 1 - 2 * (b * b + c * c)],
                        -1).reshape(N, 3, 3)  # fmt: skip
        flips = [torch.rand(N, generator=g) < 0.5 for _ in model.zmatrix.swaps]
        mirror = torch.rand(N, generator=g) < 0.5
        w, w_forward = model.from_base(eps), model.to_base(eps)[0]
        w_normal = model.from_base(torch.randn(N, model.ic.dim, generator=g, dtype=F64))

        def place(w, L, swap=True, reflect=True):
            x = model.ic.inverse(R, model.bounded(model.loc + (L @ w[..., None])[..., 0]))
            if reflect and model.config.mirror_row is not None:
                x = torch.where(mirror[:, None, None], -x, x)
            for (p, r), flip in zip(model.zmatrix.swaps, flips if swap else []):
                xp, xr = x[:, p].clone(), x[:, r].clone()
                x[flip, p], x[flip, r] = xr[flip], xp[flip]
            return x

        L = model.scale_tril
        out = {"by hand": place(w, L), "flow forward": place(w_forward, L)}
        if not model.config.torus or model.circular.any():  # else the base is N(0, I)
            out["normal base"] = place(w_normal, L)
        if model.config.whiten == "full":  # a diagonal L is its own transpose
            out["L transposed"] = place(w, L.mT)
        if model.zmatrix.swaps:
            out["no swap"] = place(w, L, swap=False)
        if model.config.mirror_row is not None:
            out["no mirror"] = place(w, L, reflect=False)
        return out


@pytest.mark.parametrize("name", list(SMALL))
def test_sampler_draws_the_law_that_log_prob_scores(name):
    """Catches a sampler that inverts another map than log_prob scores: the mean of each
    statistic under `sample` agrees with its self-normalized importance estimate (weights
    p / q from log_prob, q the Gaussian proposal) within 4 combined standard errors, and so
    does the sampler written out by hand. Power: the hand sampler with the flow run forward,
    with L transposed, from a standard normal instead of the fitted base, without the
    random geminal swap (methanol) or without the random mirror image (chain4), is
    caught."""
    model = _small(name)
    target, se_target = _snis(model, N_MC, torch.Generator().manual_seed(3))

    def z_scores(x):
        f = _statistics(model, x)
        return (f.mean(0) - target) / (f.var(0) / len(f) + se_target**2).sqrt()

    x = model.sample(N_SAMPLE, torch.Generator().manual_seed(4))
    assert x.shape == (N_SAMPLE, model.n_points, 3)
    assert z_scores(x).abs().max() < 4, z_scores(x)
    drawn = _by_hand(model, N_SAMPLE, torch.Generator().manual_seed(5))
    assert z_scores(drawn.pop("by hand")).abs().max() < 4
    for bug, x in drawn.items():
        assert z_scores(x).abs().max() > 4, (bug, z_scores(x))


def test_sample_with_log_prob_matches_sample_and_log_prob():
    """Catches `sample_with_log_prob` drawing other molecules than `sample` with the same
    generator, or scoring them otherwise than `log_prob`."""
    model = _small("methanol")
    x = model.sample(50, torch.Generator().manual_seed(6))
    y, lp = model.sample_with_log_prob(50, torch.Generator().manual_seed(6))
    torch.testing.assert_close(y, x, atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(lp, model.log_prob(x), atol=1e-12, rtol=0)
    torch.testing.assert_close(x.mean(1), torch.zeros(50, 3, dtype=F64), atol=1e-12, rtol=0)


# ------------------------------------------------------------------ (d) symmetries
def _ala2_model():
    """An L-alanine dipeptide model fitted (normalization only) to one-handed RDKit
    conformers, and 24 of them."""
    pytest.importorskip("rdkit")
    from rdkit.Chem import AllChem

    from test_zmatrix import MOLECULES, molecule

    mol, n, bonds, Z = molecule(MOLECULES["ala2"])
    xs = []
    for seed in range(24):
        assert AllChem.EmbedMolecule(mol, randomSeed=seed) == 0
        xs.append(mol.GetConformer().GetPositions())
    x = torch.tensor(np.stack(xs), dtype=F64)
    torch.manual_seed(12)
    model = InternalFlow(InternalFlowConfig(n, bonds, Z, transforms=1, hidden=(32,))).double()
    model.fit_normalization(x)
    return model.eval(), x


def test_invariant_to_rigid_motions_and_geminal_swaps_but_not_the_mirror():
    """Catches a density that sees the frame, the centre or the order of two equivalent
    hydrogens (rotations, translations and each geminal pair's swap leave log_prob
    unchanged to 1e-8; so does the mirror image where the model symmetrizes over it,
    ``mirror_row``), and one that is blind to the hand: a model fitted on one-handed
    L-alanine dipeptide conformers scores each conformer's mirror image at least 10 nats
    lower (a reflection is not a symmetry of a chiral molecule's density)."""
    g = torch.Generator().manual_seed(7)
    ala2, conformers = _ala2_model()
    for model, x in [(_small(name), _proposal(SMALL[name]["n_points"], 8, g)[0])
                     for name in SMALL] + [(ala2, conformers)]:  # fmt: skip
        with torch.no_grad():
            lp = model.log_prob(x)
            moved = x @ _rotation(g).mT + 5 * torch.randn(1, 1, 3, generator=g, dtype=F64)
            torch.testing.assert_close(model.log_prob(moved), lp, atol=1e-8, rtol=0)
            for a, b in model.zmatrix.swaps:
                perm = list(range(model.n_points))
                perm[a], perm[b] = b, a
                torch.testing.assert_close(model.log_prob(x[:, perm]), lp, atol=1e-8, rtol=0)
            if model.config.mirror_row is not None:
                mirror = x * torch.tensor([1.0, -1.0, 1.0], dtype=F64)
                torch.testing.assert_close(model.log_prob(mirror), lp, atol=1e-8, rtol=0)
    with torch.no_grad():
        lp = ala2.log_prob(conformers)
        lp_mirror = ala2.log_prob(conformers * torch.tensor([1.0, 1.0, -1.0], dtype=F64))
    assert (lp_mirror < lp - 10).all(), (lp - lp_mirror).min()


# ------------------------------------------------------------------ (e) contract
def test_shapes_dtypes_and_the_density_model_protocol():
    """Catches a model outside the contract every density model keeps: shapes (B,) and
    (m, n, 3), centred samples, the model's dtype, event_dim = 3 (n - 1)."""
    model = _small("methanol")
    assert isinstance(model, DensityModel)
    assert model.event_dim == 15 and model.dtype == F64 and model.ic.dim == 12
    x = model.sample(7, torch.Generator().manual_seed(8))
    assert x.shape == (7, 6, 3) and x.dtype == F64
    with torch.no_grad():
        lp = model.log_prob(x)
    assert lp.shape == (7,) and lp.dtype == F64 and torch.isfinite(lp).all()
    y, lq = model.sample_with_log_prob(3)
    assert y.shape == (3, 6, 3) and lq.shape == (3,)
    torch.testing.assert_close(model(x), lp, atol=0, rtol=0)  # forward is log_prob


def test_bad_input_is_refused_with_a_clear_error():
    """Catches a silent wrong answer (or a deep torch error) on bad input: shape, dtype,
    device, NaN, an empty batch, labels, a bad sample count; and bad configs."""
    model = _small("methanol")
    x = model.sample(3, torch.Generator().manual_seed(9))
    for bad, message in [(x[:, :5], r"\(B, 6, 3\)"), (x[0], r"\(B, 6, 3\)"),
                         (x.float(), "float32"), (x.to("meta"), "meta"),
                         (torch.full_like(x, float("nan")), "finite"), (x[:0], "non-empty"),
                         (x.numpy(), "ndarray")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            model.log_prob(bad)
    with pytest.raises(ValueError, match="labels=None"):
        model.log_prob(x, labels=torch.tensor(model.config.labels))
    with pytest.raises(ValueError, match="labels=None"):
        model.sample(2, labels=torch.tensor(model.config.labels))
    with pytest.raises(ValueError, match="labels=None"):
        model.sample_with_log_prob(2, labels=torch.tensor(model.config.labels))
    for m in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="integer >= 1"):
            model.sample(m)
    bonds = SMALL["chain4"]["bonds"]
    with pytest.raises(ValueError, match="labels must have 4"):
        InternalFlowConfig(4, bonds, labels=(6, 6))
    with pytest.raises(ValueError, match="3-D"):
        InternalFlowConfig(4, bonds, dim=2)
    with pytest.raises(ValueError, match="passes"):
        InternalFlowConfig(4, bonds, passes=3)
    with pytest.raises(ValueError, match="not connected"):
        InternalFlowConfig(4, ((0, 1), (2, 3)))
    with pytest.raises(ValueError, match="unknown InternalFlowConfig fields"):
        InternalFlowConfig.from_dict({**InternalFlowConfig(4, bonds).to_dict(), "depth": 3})


def test_config_and_checkpoint_round_trips_give_identical_log_prob(tmp_path):
    """Catches state that a checkpoint loses (the cuts, the whitening, the flow's weights) or
    a config that cannot be rebuilt from JSON: from_config(JSON of to_dict) +
    load_state_dict, and torch.save / torch.load of the state dict and of the module, each
    give bit-identical log_prob (a fresh model does not)."""
    model = _small("methanol")
    x = model.sample(16, torch.Generator().manual_seed(10))
    with torch.no_grad():
        lp = model.log_prob(x)
        config = json.loads(json.dumps(model.config.to_dict()))
        fresh = InternalFlow.from_config(config).double()
        assert json.dumps(fresh.config.to_dict()) == json.dumps(model.config.to_dict())
        assert not torch.allclose(fresh.log_prob(x), lp)
        fresh.load_state_dict(model.state_dict())
        assert torch.equal(fresh.log_prob(x), lp)
        torch.save(model.state_dict(), tmp_path / "state.pt")
        other = InternalFlow.from_config(model.config).double()
        other.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
        assert torch.equal(other.log_prob(x), lp)
        torch.save(model, tmp_path / "model.pt")
        whole = torch.load(tmp_path / "model.pt", weights_only=False)
        assert torch.equal(whole.log_prob(x), lp)


def test_gradients_reach_every_parameter():
    """Catches a parameter cut off from the likelihood (detached, or a layer left out): every
    parameter that trains gets a finite, nonzero gradient."""
    model = _small("ring5")
    x = _proposal(5, 64, torch.Generator().manual_seed(11))[0]
    model.zero_grad()
    (-model.log_prob(x).mean()).backward()
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    assert params and any(k.startswith("flow.base.") for k in params)  # train_base's default
    for name, p in params.items():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    model.zero_grad()


@pytest.mark.parametrize("train_base", [False, True])
def test_the_fitted_mixture_trains_only_with_train_base(train_base):
    """Catches ``train_base`` ignored: an Adam step on the whole model moves the mixture that
    k-means and EM fitted exactly when ``train_base`` is True, and the spline flow always
    (issue 46: a trained mixture on minimized conformers blows the loss up)."""
    torch.manual_seed(10)
    model = InternalFlow(InternalFlowConfig(**SMALL["chain4"], transforms=2, hidden=(16, 16),
                                            train_base=train_base)).double()  # fmt: skip
    data = _broad(model, 500, torch.Generator().manual_seed(12))
    model.fit_normalization(data)
    base = {k: p.detach().clone() for k, p in model.flow.base.named_parameters()}
    flow = {k: p.detach().clone() for k, p in model.flow.transform.named_parameters()}
    _train(model, data, steps=3, batch=64, lr=1e-2, g=torch.Generator().manual_seed(13))
    moved = lambda before, now: any(not torch.equal(before[k], p) for k, p in now)
    assert moved(base, model.flow.base.named_parameters()) == train_base
    assert moved(flow, model.flow.transform.named_parameters())


def test_float32_model_agrees_with_float64():
    """Catches a dtype hard-coded in the density (the cast model refuses or mis-scores
    float32 input): `.float()` scores float32 molecules as the float64 model, to 1e-3."""
    model = _small("chain4")
    x = model.sample(16, torch.Generator().manual_seed(12))
    single = InternalFlow.from_config(model.config)
    single.load_state_dict(model.state_dict())
    single = single.float()
    assert single.dtype == torch.float32
    with torch.no_grad():
        lp32 = single.log_prob(x.float())
        lp64 = model.log_prob(x)
    assert lp32.dtype == torch.float32
    torch.testing.assert_close(lp32.double(), lp64, atol=1e-3, rtol=0)
    assert single.sample(4).dtype == torch.float32


def test_a_model_built_under_the_float32_default_is_usable():
    """Catches a model whose `dtype` is not the dtype its layers compute in: built under
    the float32 default (as a user script would), it must score and sample in its dtype."""
    torch.set_default_dtype(torch.float32)  # the conftest fixture restores float64
    model = InternalFlow(InternalFlowConfig(**SMALL["chain4"], transforms=1, hidden=(8,)))
    x = torch.randn(5, 4, 3, dtype=model.dtype)
    assert model.log_prob(x).dtype == model.dtype
    assert model.sample(3).dtype == model.dtype


# ------------------------------------------------------------------ (f) ring closure
def _cyclohexane(n_embed: int, one_chair: bool, noise: float, g: torch.Generator):
    """MMFF-minimized RDKit embeddings of cyclohexane (with hydrogens) plus Gaussian noise;
    ``one_chair``: only chairs, reflected to one sense of pucker (ring torsions +-+-+-)."""
    pytest.importorskip("rdkit")
    from rdkit import Chem
    from rdkit.Chem import AllChem
    from rdkit.Chem import rdMolTransforms as T

    mol = Chem.AddHs(Chem.MolFromSmiles("C1CCCCC1"))
    xs = []
    for seed in range(n_embed):
        assert AllChem.EmbedMolecule(mol, randomSeed=seed) == 0
        AllChem.MMFFOptimizeMolecule(mol)
        conf = mol.GetConformer()
        x = conf.GetPositions()
        if one_chair:
            tors = np.array([T.GetDihedralDeg(conf, k, (k + 1) % 6, (k + 2) % 6, (k + 3) % 6)
                             for k in range(6)])  # fmt: skip
            sense = np.sign(tors[0]) * np.array([1, -1, 1, -1, 1, -1])
            if not ((np.abs(tors) > 40).all() and (np.sign(tors) == sense).all()):
                continue  # a twist-boat
            x = x * np.array([1.0, 1.0, np.sign(tors[0])])  # the mirror chair: the other sense
        xs.append(x)
    X = torch.tensor(np.stack(xs), dtype=F64)
    X = X + noise * torch.randn(X.shape, generator=g, dtype=F64)
    bonds = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()]
    Z = [a.GetAtomicNum() for a in mol.GetAtoms()]
    ring = [(i, j) for i, j in bonds if Z[i] == 6 and Z[j] == 6]
    return X, bonds, Z, ring


def _ring_bonds_kept(x: torch.Tensor, ring, length: float) -> float:
    """The share of molecules whose every ring bond is within 10 % of ``length``."""
    d = torch.stack([(x[:, i] - x[:, j]).norm(dim=-1) for i, j in ring], -1)
    return ((d / length - 1).abs() < 0.1).all(-1).double().mean().item()


def _fit_cyclohexane(X, bonds, Z, cartesian_rings: bool, steps: int, g: torch.Generator):
    torch.manual_seed(13)
    config = InternalFlowConfig(18, bonds, Z, cartesian_rings=cartesian_rings, transforms=2,
                                hidden=(64, 64), passes=2)  # fmt: skip
    model = InternalFlow(config).double()
    model.fit_normalization(X)
    return _train(model, X, steps=steps, batch=64, lr=2e-3, g=g)


def test_sampled_cyclohexane_keeps_its_ring_bonds():
    """Catches ring atoms whose sampled coordinates lose their correlations (the ring then
    breaks): a model (coupling flow, for cheap sampling) fitted and trained 200 steps on one
    chair of cyclohexane (MMFF minima of RDKit embeddings, 0.03 Å noise) keeps every C-C
    bond within 10 % of its mean length in at least 95 % of 1000 samples (the data: 99 %).
    Power: the fitted model with its whitening's correlations dropped (a diagonal
    covariance) keeps under 80 % (measured 69 %).

    Contrast (not asserted): ``cartesian_rings=False`` keeps as many (99 %) on this
    one-chair ensemble, and loses as many without correlations (62 %); see
    `test_a_flexible_ring_ensemble_keeps_its_ring_bonds` for the two-chair ensemble, where
    neither keeps the ring."""
    g = torch.Generator().manual_seed(14)
    X, bonds, Z, ring = _cyclohexane(100, one_chair=True, noise=0.03, g=g)
    assert len(X) >= 60
    length = torch.stack([(X[:, i] - X[:, j]).norm(dim=-1) for i, j in ring]).mean().item()
    assert _ring_bonds_kept(X, ring, length) >= 0.95
    model = _fit_cyclohexane(X, bonds, Z, True, steps=0, g=g)
    zm = model.zmatrix
    assert set(zm.root) | set(zm.cartesian) == set(range(6))  # the ring is the block
    # the power guard: the fitted (untrained) model, with and without correlations
    draw = lambda seed: model.sample(1000, torch.Generator().manual_seed(seed))  # noqa: E731
    assert _ring_bonds_kept(draw(15), ring, length) >= 0.95
    L = model.scale_tril.clone()
    with torch.no_grad():
        model.scale_tril.copy_(torch.diag((L @ L.mT).diagonal().sqrt()))
        dropped = _ring_bonds_kept(draw(15), ring, length)
        model.scale_tril.copy_(L)
    assert dropped < 0.8, dropped
    model = _train(model.train(), X, steps=200, batch=64, lr=2e-3, g=g)
    kept = _ring_bonds_kept(draw(16), ring, length)
    assert kept >= 0.95, kept


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "library limitation: with both chair senses (and twist-boats) in the data, each block "
    "atom's coordinates in the root frame are bimodal (+-1.2 Å across the root plane) and "
    "a briefly trained flow puts samples in between, so ring bonds break. Measured share "
    "of samples keeping every ring bond (GMM base, 8 components): cartesian_rings=True "
    "3 % fitted, 11-15 % after 300-2000 steps; cartesian_rings=False 12-14 %"))  # fmt: skip
def test_a_flexible_ring_ensemble_keeps_its_ring_bonds():
    """Documents the limitation of the Cartesian ring block on a flexible ring: 200 MMFF
    minima of independent RDKit embeddings of cyclohexane (both chairs, some twist-boats,
    0.02 Å noise; every ring bond within 10 % in the data), 300 training steps: at least
    95 % of samples should keep every ring bond, as the module doc promises ("rings stay
    closed")."""
    g = torch.Generator().manual_seed(17)
    X, bonds, Z, ring = _cyclohexane(200, one_chair=False, noise=0.02, g=g)
    length = torch.stack([(X[:, i] - X[:, j]).norm(dim=-1) for i, j in ring]).mean().item()
    assert _ring_bonds_kept(X, ring, length) == 1.0
    model = _fit_cyclohexane(X, bonds, Z, True, steps=300, g=g)
    kept = _ring_bonds_kept(model.sample(1000, torch.Generator().manual_seed(18)), ring, length)
    assert kept >= 0.95, kept


def test_torus_keeps_ring_torsions_off_the_circle():
    """Catches the circle taking the torsions about ring bonds (their pucker modes then meet
    a uniform base, and rings break: cyclohexanol kept every bond in 42.8 % of samples) or
    leaving a chain torsion cut: on propylcyclopentane's carbons exactly the Z-matrix rows
    whose axis j-k is a ring bond are real, and a mixture of the real coordinates is the
    base."""
    bonds = ((0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (0, 5), (5, 6), (6, 7))
    model = InternalFlow(InternalFlowConfig(n_points=8, bonds=bonds, torus=True))
    ring = {(0, 1), (1, 2), (2, 3), (3, 4), (0, 4)}
    nb, na = model.ic.n_bonds, model.ic.n_angles
    on_circle = model.circular[nb + na:nb + na + model.ic.n_torsions].tolist()
    expected = [tuple(sorted(r[1:3])) not in ring and not half
                for r, half in zip(model.zmatrix.rows, model.half_turn.tolist())]
    assert on_circle == expected and any(expected) and not all(expected)
    assert model.flow.real_base is not None
