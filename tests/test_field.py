import pytest
import torch

from conftest import mc_tolerance, random_orthogonal
from grassflow.manifolds import Grassmann
from grassflow.nn import PAPER_WIDTHS, ConcatSquash, GrassmannField, HorP, Potential, scale_init_
from grassflow.ode.divergence import divergence_exact, divergence_hutchinson, horizontal_basis

CASES = [(1, 3), (2, 4), (3, 13), (3, 4)]


def make_field(D, k, gain=2.0):
    return scale_init_(GrassmannField(Potential(D, k, (16, 16))), gain)


@pytest.mark.parametrize("k,D", CASES)
def test_field_is_horizontal_and_equivariant(k, D):
    gr, f = Grassmann(k, D), make_field(D, k)
    Y, t = gr.random(10), torch.tensor(0.4)
    X = f(t, Y)
    assert (Y.mT @ X).abs().max() < 1e-12
    for reflect in (False, True):
        Q = random_orthogonal(k, reflect)
        assert torch.allclose(f(t, Y @ Q), X @ Q, atol=1e-12)


def test_field_is_riemannian_gradient_of_potential():
    # d/dh v(retr(Y, h xi)) at 0 equals <X, xi>
    gr, f = Grassmann(2, 5), make_field(5, 2)
    Y, t = gr.random(6), torch.tensor(0.1)
    xi = gr.proju(Y, torch.randn(6, 5, 2))
    h = 1e-6
    v = f.potential
    fd = (v(t, gr.retr(Y, h * xi)) - v(t, gr.retr(Y, -h * xi))) / (2 * h)
    assert torch.allclose(fd, gr.inner(Y, f(t, Y), xi), atol=1e-8)


def test_potential_depends_on_time_and_presets():
    v = Potential(3, 1, PAPER_WIDTHS["textures"])
    Y = Grassmann(1, 3).random(4)
    assert not torch.allclose(v(torch.tensor(0.0), Y), v(torch.tensor(1.0), Y))
    assert len(v.layers) == 3 and v.layers[0].linear.out_features == 64
    with pytest.raises(ValueError, match="preset"):
        GrassmannField.from_preset(3, 1, "nope")


def test_layers_shapes():
    h = HorP(5, 2)
    Y = Grassmann(2, 5).random(3)
    assert h(Y).shape == (3, 5, 2)
    assert torch.allclose(h(Y @ random_orthogonal(2)), h(Y))
    cs = ConcatSquash(4, 7)
    assert cs(torch.tensor(0.5), torch.randn(3, 4)).shape == (3, 7)


@pytest.mark.parametrize("k,D", CASES)
def test_exact_divergence_matches_finite_differences(k, D):
    gr, f = Grassmann(k, D), make_field(D, k)
    Y, t = gr.random(5), torch.tensor(0.3)
    X, div = divergence_exact(lambda Z: f(t, Z), Y)
    assert torch.allclose(X, f(t, Y))
    E = horizontal_basis(Y)
    assert torch.allclose(  # orthonormal basis of the horizontal space
        torch.einsum("abij,cbij->bac", E, E), torch.eye(k * (D - k)).expand(5, -1, -1), atol=1e-12
    )
    h, fd = 1e-6, 0
    for e in E:
        fd = fd + ((f(t, Y + h * e) - f(t, Y - h * e)) / (2 * h) * e).sum((-2, -1))
    assert torch.allclose(div, fd, atol=1e-7)


@pytest.mark.parametrize("k,D", [(1, 3), (2, 4), (3, 4)])
def test_divergence_theorem(k, D):
    # a compact manifold without boundary: the divergence integrates to zero
    gr, f = Grassmann(k, D), make_field(D, k)
    t = torch.tensor(0.3)
    with torch.no_grad():
        _, div = divergence_exact(lambda Z: f(t, Z), gr.random(100_000))
    assert abs(div.mean().item()) < mc_tolerance(div)
    assert div.std() > 0.05  # non-trivial field


@pytest.mark.parametrize("k,D", [(1, 3), (3, 13)])
def test_hutchinson_is_unbiased(k, D):
    gr, f = Grassmann(k, D), make_field(D, k)
    t = torch.tensor(0.7)
    Y = gr.random(3)
    _, exact = divergence_exact(lambda Z: f(t, Z), Y)
    n = 20_000
    Yr = Y.repeat_interleave(n, 0)
    with torch.no_grad():
        _, est = divergence_hutchinson(lambda Z: f(t, Z), Yr, torch.randn_like(Yr))
    est = est.reshape(3, n)
    for i in range(3):
        assert est[i].mean().item() == pytest.approx(exact[i].item(), abs=mc_tolerance(est[i]))


def test_divergence_gradient_flows_to_parameters_and_points():
    gr, f = Grassmann(2, 4), make_field(4, 2)
    Y = gr.random(4).requires_grad_(True)
    t = torch.tensor(0.2)
    _, div = divergence_exact(lambda Z: f(t, Z), Y)
    div.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in f.parameters())
    assert torch.isfinite(Y.grad).all()


@pytest.mark.parametrize("k,D", [(1, 3), (2, 4), (3, 13)])
def test_fast_divergences_match_a_python_loop(k, D):
    # reference: one reverse-mode pass per horizontal basis vector, sum_a <E_a, J^T E_a>
    gr, f = Grassmann(k, D), make_field(D, k)
    Y, t = gr.random(4), torch.tensor(0.4)
    Yg = Y.clone().requires_grad_(True)
    X = f(t, Yg)
    loop = torch.zeros(4)
    for e in horizontal_basis(Y).detach():
        loop = loop + (torch.autograd.grad(X, Yg, e, retain_graph=True)[0] * e).sum((-2, -1))
    _, div_vmap = divergence_exact(lambda Z: f(t, Z), Y)
    _, div_lb = f.field_and_divergence(t, Y, create_graph=False)
    torch.testing.assert_close(div_vmap, loop, atol=1e-8, rtol=0)
    torch.testing.assert_close(div_lb, loop, atol=1e-8, rtol=0)
