"""Tests for the forward Laplacian: the Jet primitives of grassflow.nn.jet against torch.func,
and GrassmannField's forward-Laplacian divergence path against the Hessian-vector-product path
and the generic torch.func divergence, for the MLP and the graph potential.

A jet of f at x along directions d_1 .. d_m carries ``J[a] = Df[d_a]`` and
``L = sum_{a < n_lap} D^2 f[d_a, d_a]``. The references are ``torch.func.jvp`` (first
derivatives) and a jvp of a jvp (second directional derivatives), on the same functions run on
plain tensors. Every test uses ``n_lap < m`` where it can, so directions that must enter J only
are told apart from those that enter L.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import grassflow.nn.graph as graph_mod
from conftest import mc_tolerance, random_orthogonal
from grassflow.flows import GrCNF
from grassflow.manifolds import Grassmann
from grassflow.nn import GraphPotential, GrassmannField, Potential, jet, scale_init_
from grassflow.nn.jet import Jet
from grassflow.ode.divergence import divergence_exact, horizontal_noise

B, M, N_LAP = 2, 5, 3  # batch, directions, directions counted in L


# ------------------------------------------------------------------ helpers
def reference_jet(f, x: torch.Tensor, dirs: torch.Tensor, n_lap: int):
    """``(f(x), [Df[d_a]]_a, sum_{a < n_lap} D^2 f[d_a, d_a])`` by torch.func."""
    value = f(x)
    J = torch.stack([torch.func.jvp(f, (x,), (d,))[1] for d in dirs])
    L = torch.zeros_like(value)
    for d in dirs[:n_lap]:
        first = lambda z, d=d: torch.func.jvp(f, (z,), (d,))[1]
        L = L + torch.func.jvp(first, (x,), (d,))[1]
    return value, J, L


def check_jet(out: Jet, f, x: torch.Tensor, dirs: torch.Tensor, n_lap: int, tol: float = 1e-12):
    """Compare a jet with the torch.func reference; J must have shape (m, *v.shape) and L
    v.shape (the documented layout), with None standing for zero."""
    value, J, L = reference_jet(f, x, dirs, n_lap)
    assert isinstance(out, Jet)
    torch.testing.assert_close(out.v, value, atol=tol, rtol=0)
    out_J = torch.zeros_like(J) if out.J is None else out.J
    out_L = torch.zeros_like(L) if out.L is None else out.L
    torch.testing.assert_close(out_J, J, atol=tol, rtol=0)
    torch.testing.assert_close(out_L, L, atol=tol, rtol=0)
    return value, J, L


def mlp_potential(D: int, k: int) -> Potential:
    return scale_init_(Potential(D, k, (16, 16)), 2.0)


def graph_potential(n: int, k: int, labels=None) -> GraphPotential:
    return scale_init_(GraphPotential(n, k, hidden=8, layers=2, labels=labels), 2.0)


# (name, potential factory, k, D); the graph potential lives on Gr(k, n - 1)
POTENTIALS = [
    ("mlp", lambda: mlp_potential(3, 1), 1, 3),
    ("mlp", lambda: mlp_potential(4, 2), 2, 4),
    ("mlp", lambda: mlp_potential(13, 3), 3, 13),
    ("graph", lambda: graph_potential(6, 2), 2, 5),
    ("graph", lambda: graph_potential(13, 3, torch.tensor([0, 1, 1, 2] * 3 + [0])), 3, 12),
]
POTENTIAL_IDS = [f"{name}-Gr({k},{D})" for name, _, k, D in POTENTIALS]


# ------------------------------------------------------------------ 1. primitives
C34 = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
W54 = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
B5 = torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
T253 = torch.randn(B, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
T42 = torch.randn(4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
T642 = torch.randn(6, 4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
T653 = torch.randn(6, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
T232 = torch.randn(B, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(8))

# each f maps X: (B, 3, 4) to a tensor, written once for tensors and jets; the comment names the
# bug it catches
PRIMITIVES = {
    # wrong tanh'' (e.g. +2 f f' or a missing factor 2)
    "tanh": lambda X: jet.tanh(X),
    # wrong silu' or silu'' (e.g. s (1 - s) (1 + x (1 - 2 s)))
    "silu": lambda X: jet.silu(X),
    # silu composed: f'(x) L must be kept next to f''(x) |J|^2
    "silu_of_tanh": lambda X: jet.silu(2.0 * jet.tanh(X) - 0.5),
    # bias added to J or L in linear; weight not transposed
    "linear_bias": lambda X: jet.linear(X, W54, B5),
    "linear_then_tanh": lambda X: jet.tanh(jet.linear(X, W54, B5)),
    "linear_no_bias": lambda X: jet.silu(jet.linear(X, W54)),
    # product rule: missing factor 2 in the cross term, or cross summed over all m directions
    "mul_jets": lambda X: jet.tanh(X) * jet.silu(X),
    "square": lambda X: X * X,
    # product of jets of different ranks (broadcast J along the new axes)
    "mul_broadcast": lambda X: jet.tanh(X) * jet.silu(X.mean(-1)).unsqueeze(-1),
    "mul_rank2_rank3": lambda X: jet.silu(X.mean(-3)) * jet.tanh(X),
    # multiplication by constants and scalars (constant must not be differentiated)
    "mul_const": lambda X: 2.5 * (jet.tanh(X) * C34) - X * 0.5,
    # matmul of jets with batch dims: wrong einsum (contraction over the direction axis)
    "matmul_jets": lambda X: jet.tanh(X) @ jet.silu(X).mT,
    "matmul_jets_inner": lambda X: jet.tanh(X).mT @ jet.silu(X),
    # jet@jet where one side has no batch dims (broadcasting inside the einsums)
    "matmul_rank3_rank2": lambda X: jet.tanh(X) @ jet.silu(X.mean(-3)).mT,
    "matmul_rank2_rank3": lambda X: jet.silu(X.mean(-3)) @ jet.tanh(X).mT,
    # tensor @ jet and jet @ tensor, batched and broadcast: J not padded to the constant's rank
    "tensor_matmul_jet": lambda X: T253 @ jet.tanh(X),
    "jet_matmul_tensor": lambda X: jet.silu(X) @ T42,
    "rank2_jet_matmul_batched_tensor": lambda X: jet.tanh(X.mean(-3)) @ T642,
    "batched_tensor_matmul_rank2_jet": lambda X: T653 @ jet.tanh(X.sum(-3)),
    # cat / stack with constants: zero derivatives placed in the wrong slot or the wrong axis
    "cat_const_last": lambda X: jet.silu(jet.cat([jet.tanh(X), T232], dim=-1)),
    "cat_const_middle": lambda X: jet.tanh(jet.cat([C34.expand(B, 3, 4), X * X], dim=-2)),
    "cat_jets": lambda X: jet.cat([jet.tanh(X), X * X, jet.silu(X)], dim=-3),
    "stack_mixed": lambda X: jet.stack([X, jet.tanh(X), C34.expand(B, 3, 4)], dim=-1),
    "stack_middle": lambda X: jet.silu(jet.stack([X * X, jet.tanh(X)], dim=-3)),
    # reductions and shape ops (wrong dim because J has the leading direction axis)
    "mean_sum": lambda X: jet.tanh(X).mean(-1) + (X * X).sum(-2).mean(-1).unsqueeze(-1),
    "mean_batch": lambda X: jet.silu(X).mean(-3),
    "diagonal": lambda X: jet.tanh(X @ X.mT).diagonal(dim1=-2, dim2=-1),
    "diagonal_dims": lambda X: jet.silu(X.unsqueeze(-1) * X.unsqueeze(-2)).diagonal(
        dim1=-3, dim2=-1
    ),
    "flatten": lambda X: jet.silu(jet.tanh(X).flatten(-2)),
    "flatten_all": lambda X: (X * X).flatten(-3),
    "unsqueeze_squeeze": lambda X: jet.tanh(X.unsqueeze(-2)).squeeze(-2) * X,
    "transpose": lambda X: jet.tanh(X).mT @ X,
    # negation and subtraction on both sides
    "neg_sub": lambda X: 1.0 - X * X - jet.tanh(-X) + (X - 0.5),
    "tensor_minus_jet": lambda X: C34 - jet.silu(X) * X,
    # broadcasting add of jets of different ranks (both carrying J and L)
    "add_rank2_rank3": lambda X: jet.tanh(X) + jet.silu(X.mean(-3)),
    "add_rank1_rank3_sum": lambda X: (jet.tanh(X) + jet.silu(X.mean(-3).mean(-2))).sum(-3),
    # the graph's edge features: sq_i + sq_j - 2 G_ij, stacked with G
    "graph_edges": lambda X: jet.stack(
        [
            X @ X.mT,
            (X * X).sum(-1).unsqueeze(-1) + (X * X).sum(-1).unsqueeze(-2) - 2 * (X @ X.mT),
        ],
        dim=-1,
    ),
    # the MLP potential's HorP: W - Y (Y^T W)
    "horp": lambda X: jet.tanh(T42 - X.mT @ (X @ T42)).flatten(-2),
}

# J and L are (m, *S) and S: a jet that a constant tensor (or a constant jet) broadcasts to a
# larger shape must expand its J/L too, or reductions over the new axis undercount J and L errors
C234 = C34.expand(B, 3, 4)
PRIMITIVES_BROADCAST = {
    # a constant that broadcasts the jet up, then a sum over the broadcast axis
    "add_bigger_const_then_sum": lambda X: (X.mean(-3) + C234).sum(-3),
    "add_bigger_const_to_tanh_then_sum": lambda X: (jet.tanh(X.mean(-3)) + C234).sum(-3),
    # the same jet concatenated with a full-shape jet
    "add_bigger_const_then_cat": lambda X: jet.cat([X.mean(-3) + C234, X], dim=-1),
}


@pytest.mark.parametrize(
    "name",
    list(PRIMITIVES) + list(PRIMITIVES_BROADCAST),
)
def test_primitive_rules_match_autograd(name):
    # catches the bug named next to each function in PRIMITIVES (wrong second-order rule, factor
    # 2 in the product cross term, bias in J, wrong axis because of the direction axis, Y-like
    # first-order-only directions counted in L)
    f = {**PRIMITIVES, **PRIMITIVES_BROADCAST}[name]
    x, dirs = torch.randn(B, 3, 4), torch.randn(M, B, 3, 4)
    out = f(Jet.input(x, dirs, N_LAP))
    _, J, L = check_jet(out, f, x, dirs, N_LAP)
    # power guard: non-trivial derivatives (only the linear maps have L = 0)
    assert J.abs().max() > 1e-2
    # n_lap matters: the full-m Laplacian differs (so counting every direction would fail)
    if L.abs().max() > 1e-3:
        L_all = reference_jet(f, x, dirs, M)[2]
        assert (L_all - L).abs().max() > 1e-3


def test_jet_without_derivatives_and_n_lap_zero():
    # catches: None (zero) J/L mishandled by the elementwise and product rules, or n_lap = 0
    # (first order only, the Y direction) leaking into L
    x, dirs = torch.randn(B, 3, 4), torch.randn(M, B, 3, 4)
    f = PRIMITIVES["matmul_jets"]
    out = f(Jet.input(x, dirs, 0))
    check_jet(out, f, x, dirs, 0)
    assert out.L is None or out.L.abs().max() == 0
    const = jet.tanh(Jet(x, None, None, N_LAP)) * Jet(x, None, None, N_LAP)
    torch.testing.assert_close(const.v, torch.tanh(x) * x)
    assert const.J is None or const.J.abs().max() == 0
    assert const.L is None or const.L.abs().max() == 0


# ------------------------------------------------------------------ 2. field and divergence
@pytest.mark.parametrize("case", POTENTIALS, ids=POTENTIAL_IDS)
def test_forward_laplacian_matches_hvp_and_generic(case):
    # catches: wrong sign or factor of the (D - k) tr(Y^T G) term, the Y direction counted in L,
    # X assembled with the wrong index order (j * (D - k) + i instead of i * k + j), a basis
    # that is not the horizontal one, or any jet rule used by the networks
    _, make, k, D = case
    pot = make()
    fwd, hvp = GrassmannField(pot, "forward"), GrassmannField(pot, "hvp")
    assert fwd.path() == "forward" and hvp.path() == "hvp"
    assert GrassmannField(pot).path() == "forward"  # "auto" picks the jet path
    Y, t = Grassmann(k, D).random(3), torch.tensor(0.3)
    X_ref, div_ref = divergence_exact(lambda Z: fwd(t, Z), Y)
    X_f, div_f = fwd.field_and_divergence(t, Y, create_graph=False)
    assert fwd.last_path == "forward"
    X_h, div_h = hvp.field_and_divergence(t, Y, create_graph=False)
    assert hvp.last_path == "hvp"
    loop = GrassmannField(pot, "loop")
    X_l, div_l = loop.field_and_divergence(t, Y, create_graph=False)
    assert loop.last_path == "loop"
    for X, div in ((X_f, div_f), (X_h, div_h), (X_l, div_l)):
        torch.testing.assert_close(X, X_ref, atol=1e-10, rtol=0)
        torch.testing.assert_close(div, div_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(X_f, fwd(t, Y), atol=1e-10, rtol=0)
    torch.testing.assert_close(Y.mT @ X_f, torch.zeros(3, k, k), atol=1e-12, rtol=0)
    # power guard: neither the field nor the divergence is negligible, so 1e-10 is tight
    assert X_ref.norm(dim=(-2, -1)).min() > 1e-2
    assert div_ref.abs().max() > 1e-1
    # the curvature term alone is not negligible either (a wrong sign would show)
    G = torch.func.grad(lambda Z: pot(t, Z).sum())(Y)
    assert ((D - k) * (Y * G).sum((-2, -1))).abs().max() > 1e-2


@pytest.mark.parametrize("case", POTENTIALS[1:4:2], ids=POTENTIAL_IDS[1:4:2])
def test_forward_laplacian_backward_matches_hvp(case):
    # catches: a forward path whose result is detached (or not differentiable through the frame
    # and the directions), so training gradients to the parameters and to Y would be wrong
    _, make, k, D = case
    pot = make()
    Y0, t = Grassmann(k, D).random(3), torch.tensor(0.6)
    wX, wd = torch.randn(3, D, k), torch.randn(3)
    grads = {}
    for laplacian in ("forward", "hvp"):
        field = GrassmannField(pot, laplacian)
        Y = Y0.clone().requires_grad_(True)
        X, div = field.field_and_divergence(t, Y)
        for name, loss in (("X", (X * wX).sum()), ("div", (div * wd).sum())):
            grads[laplacian, name] = torch.autograd.grad(
                loss, [Y, *pot.parameters()], retain_graph=True, materialize_grads=True
            )
    for name in ("X", "div"):
        gY_f, *gp_f = grads["forward", name]
        gY_h, *gp_h = grads["hvp", name]
        for a, b in zip(gp_f, gp_h):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
        # the Y-gradients agree on the tangent space of the Stiefel manifold (the only directions
        # an orthonormal trajectory moves in). X's normal part Y sym(.) differs by design: the
        # forward path's X = F F^T G extends (I - Y Y^T) G differently off the manifold
        diff = gY_f - gY_h
        normal = Y0 @ (0.5 * (Y0.mT @ diff + diff.mT @ Y0))
        torch.testing.assert_close(diff - normal, torch.zeros_like(diff), atol=1e-10, rtol=0)
        if name == "div":
            torch.testing.assert_close(gY_f, gY_h, atol=1e-10, rtol=1e-10)
        assert gY_f.abs().max() > 1e-2  # power guard


# ------------------------------------------------------------------ 3. graph jet specialisation
def random_jet(shape, m: int, n_lap: int) -> Jet:
    return Jet(torch.randn(*shape), torch.randn(m, *shape), torch.randn(*shape), n_lap)


def test_pair_mean_jet_matches_generic_jet_ops():
    # catches: a wrong term in the expanded square (missing 2 P Q or 2 Q R cross terms), the
    # pair mean over i instead of j, the edge L dropped, or all m directions counted in L
    n, hid, c, m, n_lap = 5, 4, 2, 6, 4
    layer = scale_init_(graph_mod.ConcatSquash(2 * hid + c, 3), 2.0)
    t = torch.tensor(0.45)
    h, e = random_jet((B, n, hid), m, n_lap), random_jet((B, n, n, c), m, n_lap)
    fast = graph_mod._pair_mean_jet(layer, t, h, e)
    slow = jet.silu(graph_mod._pair_layer(layer, t, h, e)).mean(dim=-2)
    for a, b in ((fast.v, slow.v), (fast.J, slow.J), (fast.L, slow.L)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    # power guard: a different n_lap changes L, the second-order part is not negligible
    h2, e2 = Jet(h.v, h.J, h.L, m), Jet(e.v, e.J, e.L, m)
    assert (graph_mod._pair_mean_jet(layer, t, h2, e2).L - fast.L).abs().max() > 1e-2
    # and the fast path (scalar t) agrees with autograd on a function of one input
    x, dirs = torch.randn(B, n, hid), torch.randn(m, B, n, hid)
    E = torch.randn(n, n, c)

    def f(z):
        zz = z @ z.mT
        edges = jet.stack([zz, zz * zz.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)], dim=-1) + E * 0.1
        return graph_mod._pair_mean(layer, t, jet.tanh(z), edges)

    out = f(Jet.input(x, dirs, n_lap))
    check_jet(out, f, x, dirs, n_lap, tol=1e-11)


@pytest.mark.parametrize("case", POTENTIALS[3:], ids=POTENTIAL_IDS[3:])
def test_graph_scalar_time_fast_path_matches_per_sample_time(case, monkeypatch):
    # catches: _pair_mean_jet disagreeing with the generic jet ops inside the real network
    # (scalar t takes the fast path, a per-sample t of equal values the generic one)
    _, make, k, D = case
    pot = make()
    calls = []
    original = graph_mod._pair_mean_jet
    monkeypatch.setattr(graph_mod, "_pair_mean_jet", lambda *a: calls.append(1) or original(*a))
    Y = Grassmann(k, D).random(3)
    dirs, n_lap = torch.randn(7, 3, D, k), 5
    t = torch.tensor(0.55)
    fast = pot(t, Jet.input(Y, dirs, n_lap))
    assert len(calls) == 2  # one per message-passing layer
    slow = pot(t.expand(3), Jet.input(Y, dirs, n_lap))
    assert len(calls) == 2  # the generic path ran
    for a, b in ((fast.v, slow.v), (fast.J, slow.J), (fast.L, slow.L)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    assert fast.L.abs().max() > 1e-2 and fast.J.abs().max() > 1e-2  # power guard


# ------------------------------------------------------------------ 4. MLE parameter gradients
def make_flow(laplacian: str) -> GrCNF:
    torch.manual_seed(11)
    pot = scale_init_(Potential(4, 2, (6,)), 1.5)
    flow = GrCNF(Grassmann(2, 4), GrassmannField(pot, laplacian), prior="uniform",
                 divergence="exact", atol=1e-9, rtol=1e-9)  # fmt: skip
    return flow.train()


def test_mle_gradients_match_finite_differences_and_hvp():
    # catches: a forward path that blocks or distorts backpropagation of the divergence through
    # the ODE (e.g. computed under no_grad, or detached directions), and a wrong stats record
    Y = Grassmann(2, 4).random(3, generator=torch.Generator().manual_seed(5))
    flows = {lap: make_flow(lap) for lap in ("forward", "hvp")}
    grads = {}
    for lap, flow in flows.items():
        flow.zero_grad()
        loss = -flow.log_prob(Y).mean()
        loss.backward()
        assert flow.last_stats["divergence_path"] == lap
        grads[lap] = {n: p.grad.clone() for n, p in flow.named_parameters()}
    for name, g in grads["forward"].items():
        torch.testing.assert_close(g, grads["hvp"][name], atol=1e-9, rtol=1e-7)
    flow = flows["forward"]
    params = dict(flow.named_parameters())
    checks = [
        ("field.potential.horp.weight", (1, 0)),
        ("field.potential.layers.0.linear.weight", (2, 3)),
        ("field.potential.layers.1.gate.weight", (0, 0)),
        ("sqrt_T", ()),
    ]
    eps = 1e-5
    with torch.no_grad():
        for name, idx in checks:
            p = params[name]
            old = p[idx].item()
            p[idx] = old + eps
            up = -flow.log_prob(Y).mean().item()
            p[idx] = old - eps
            down = -flow.log_prob(Y).mean().item()
            p[idx] = old
            fd = (up - down) / (2 * eps)
            g = grads["forward"][name][idx].item()
            assert abs(g) > 1e-3, name  # power guard: a gradient that matters
            assert g == pytest.approx(fd, rel=1e-5, abs=1e-7), name


def test_divergence_path_is_recorded():
    # catches: the stats key missing or always "forward" / always "hvp"
    Y = Grassmann(2, 4).random(2)
    for lap in ("forward", "hvp", "auto"):
        flow = GrCNF(Grassmann(2, 4), GrassmannField(Potential(4, 2, (4,)), lap), prior="uniform")
        with torch.no_grad():
            flow.eval().log_prob(Y)
        assert flow.last_stats["divergence_path"] == ("hvp" if lap == "hvp" else "forward")
    flow = GrCNF(Grassmann(2, 4), GrassmannField(PlainPotential(4, 2)), prior="uniform")
    with torch.no_grad():
        flow.eval().log_prob(Y)
    assert flow.last_stats["divergence_path"] == "hvp"  # "auto" falls back


# ------------------------------------------------------------------ 5. Hutchinson
def vertical_laplacian(pot, t, Y: torch.Tensor) -> torch.Tensor:
    """``sum_{i,j} D^2 v[Y e_i e_j^T, Y e_i e_j^T]``: the bias of a probe left unprojected."""
    k = Y.shape[-1]
    total = torch.zeros(Y.shape[:-2])
    for i in range(k):
        for j in range(k):
            V = Y[..., :, i : i + 1] * torch.eye(k)[j]
            first = lambda Z, V=V: torch.func.jvp(lambda W: pot(t, W), (Z,), (V,))[1]
            total = total + torch.func.jvp(first, (Y,), (V,))[1]
    return total


HUTCHINSON = [(POTENTIALS[1], 8000), (POTENTIALS[2], 4000), (POTENTIALS[3], 3000)]


@pytest.mark.parametrize("case,n", HUTCHINSON, ids=[POTENTIAL_IDS[i] for i in (1, 2, 3)])
def test_forward_hutchinson_is_unbiased_with_exact_field(case, n):
    # catches: a biased probe (not projected onto the horizontal space), a per-sample formula
    # other than e^T H e - (D - k) tr(Y^T G) (sign of the curvature term, the Y direction in L,
    # the basis counted in L next to the probe), or X read from the wrong slots of J once the
    # probe is prepended
    _, make, k, D = case
    pot = make()
    fwd, hvp = GrassmannField(pot, "forward"), GrassmannField(pot, "hvp")
    t = torch.tensor(0.7)
    Y = Grassmann(k, D).random(2)
    X_ex, div_ex = fwd.field_and_divergence(t, Y, create_graph=False)
    Yr = Y.repeat_interleave(n, 0)
    noise = torch.randn_like(Yr)
    with torch.no_grad():
        X, est = fwd.field_and_divergence(t, Yr, noise, create_graph=False)
        _, est_h = hvp.field_and_divergence(t, Yr[:n], noise[:n], create_graph=False)
    assert fwd.last_path == "forward"
    torch.testing.assert_close(X, X_ex.repeat_interleave(n, 0), atol=1e-12, rtol=0)
    # per sample, the estimate is e^T H e - (D - k) tr(Y^T G) with e the projected probe
    few = slice(0, 5)
    Yg = Yr[few].clone().requires_grad_(True)
    G = torch.autograd.grad(pot(t, Yg).sum(), Yg, create_graph=True)[0]
    e = horizontal_noise(Yr[few], noise[few])
    He = torch.autograd.grad(G, Yg, e)[0]
    ref = (e * He).sum((-2, -1)) - (D - k) * (Yr[few] * G).sum((-2, -1))
    torch.testing.assert_close(est[few], ref.detach(), atol=1e-10, rtol=0)
    est = est.reshape(2, n)
    bias_unprojected = vertical_laplacian(pot, t, Y)
    for i in range(2):
        tol = mc_tolerance(est[i])
        assert abs(est[i].mean().item() - div_ex[i].item()) <= tol
        # power guard: truly stochastic, and the bias of an unprojected probe would be seen
        assert est[i].std() > 1e-2
        assert 2 * tol < abs(bias_unprojected[i].item())
    # the hvp path's estimator differs per sample (another formula) but is unbiased too
    assert (est_h - est[0]).abs().max() > 1e-3
    assert abs(est_h.mean().item() - div_ex[0].item()) <= mc_tolerance(est_h)


# ------------------------------------------------------------------ 6. errors
class PlainPotential(nn.Module):
    """A potential without supports_jet."""

    def __init__(self, D: int, k: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D, D))

    def forward(self, t, Y):
        P = Y @ Y.mT
        return torch.tanh((P * self.weight).sum((-2, -1)) * (1 + t))


def test_errors():
    # catches: silently accepting a bad setting, or running the jet path on a network that
    # cannot take a Jet; non-negative dims that would index the direction axis of J
    with pytest.raises(ValueError, match="laplacian"):
        GrassmannField(Potential(3, 1, (4,)), laplacian="backward")
    with pytest.raises(ValueError):
        GrassmannField(Potential(3, 1, (4,)), laplacian="Forward")
    with pytest.raises(ValueError, match="supports_jet"):
        GrassmannField(PlainPotential(3, 1), laplacian="forward")
    field = GrassmannField(PlainPotential(3, 1))  # auto falls back to hvp
    assert field.path() == "hvp"
    Y, t = Grassmann(1, 3).random(2), torch.tensor(0.2)
    X, div = field.field_and_divergence(t, Y, create_graph=False)
    assert field.last_path == "hvp"
    X_ref, div_ref = divergence_exact(lambda Z: field(t, Z), Y)
    torch.testing.assert_close(div, div_ref, atol=1e-10, rtol=0)
    x = Jet.input(torch.randn(B, 3, 4), torch.randn(M, B, 3, 4), N_LAP)
    for op in (
        lambda: x.mean(0), lambda: x.sum(1), lambda: x.flatten(0), lambda: x.flatten(-2, 2),
        lambda: x.unsqueeze(0), lambda: x.squeeze(0), lambda: x.diagonal(dim1=0, dim2=-1),
        lambda: x.diagonal(dim1=-2, dim2=1), lambda: jet.cat([x, x], dim=0),
        lambda: jet.stack([x, x], dim=2), lambda: x.mean(2),
    ):  # fmt: skip
        with pytest.raises(ValueError, match="negative"):
            op()
    # plain tensors keep accepting non-negative dims
    assert jet.cat([torch.zeros(2), torch.ones(3)], dim=0).shape == (5,)


# ------------------------------------------------------------------ 7. invariance
@pytest.mark.parametrize("case", POTENTIALS, ids=POTENTIAL_IDS)
def test_forward_path_is_invariant_under_ok(case):
    # catches: a divergence that depends on the representative (e.g. the frame or the basis
    # taken from Y's columns without the projector, or the curvature term not invariant), and a
    # field that is not equivariant after reassembly from the basis coefficients
    _, make, k, D = case
    field = GrassmannField(make(), "forward")
    Y, t = Grassmann(k, D).random(3), torch.tensor(0.25)
    X, div = field.field_and_divergence(t, Y, create_graph=False)
    assert div.abs().max() > 1e-1  # power guard
    for reflect in (False, True):
        Q = random_orthogonal(k, reflect)
        XQ, divQ = field.field_and_divergence(t, Y @ Q, create_graph=False)
        torch.testing.assert_close(divQ, div, atol=1e-10, rtol=0)
        torch.testing.assert_close(XQ, X @ Q, atol=1e-10, rtol=0)
