"""Sphere pictures of Gr(1, 3): each figure writes a PNG; densities get (N, 3, 1) inputs."""

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from grassflow.data.textures import sample_texture
from grassflow.distributions import MatrixGaussianPrior
from grassflow.manifolds import Grassmann
from grassflow.viz import (
    SphereColumn,
    figure_antipodal,
    figure_prior_views,
    figure_textures,
    plot_density,
    plot_points,
    sphere_grid,
)

GRID = (12, 24)  # small grids keep the tests fast; the default is (60, 120)


@pytest.fixture
def prior():
    gr = Grassmann(1, 3)
    return MatrixGaussianPrior(
        gr,
        mean=torch.eye(3, 1, dtype=torch.float32),
        row_cov=0.5 * torch.eye(3, dtype=torch.float32),
        col_cov=torch.eye(1, dtype=torch.float32),
    )


class Recorder:
    """Wraps a log_prob_fn and records the shapes it is called with."""

    def __init__(self, fn):
        self.fn, self.shapes = fn, []

    def __call__(self, Y):
        self.shapes.append(tuple(Y.shape))
        return self.fn(Y)


def _png_ok(path):
    assert path.exists() and path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sphere_grid():
    g = sphere_grid(7, 11)
    assert g.shape == (7, 11, 3)
    np.testing.assert_allclose(np.linalg.norm(g, axis=-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(g[0, :], [[0, 0, 1]] * 11, atol=1e-12)  # north pole row
    np.testing.assert_allclose(g[:, 0], g[:, -1], atol=1e-12)  # closed in longitude
    with pytest.raises(ValueError):
        sphere_grid(1, 10)


def test_plot_density_calls_with_chunks(prior):
    rec = Recorder(prior.log_prob)
    ax = Figure().add_subplot(projection="3d")
    dens = plot_density(ax, rec, GRID, chunk=100, dtype=torch.float32)
    n = GRID[0] * GRID[1]
    assert all(len(s) == 3 and s[1:] == (3, 1) for s in rec.shapes)
    assert sum(s[0] for s in rec.shapes) == n and max(s[0] for s in rec.shapes) == 100
    assert dens.shape == GRID and (dens > 0).all()
    # the density on Gr(1, 3) is even: the grid's antipodal points get the same value
    g = torch.as_tensor(sphere_grid(*GRID), dtype=torch.float32).reshape(-1, 3, 1)
    torch.testing.assert_close(prior.log_prob(g), prior.log_prob(-g), rtol=1e-4, atol=1e-4)


def test_plot_density_rejects_bad_output():
    ax = Figure().add_subplot(projection="3d")
    with pytest.raises(ValueError, match="shape"):
        plot_density(ax, lambda Y: torch.zeros(Y.shape[0], 1), GRID)
    with pytest.raises(ValueError, match="NaN"):
        plot_density(ax, lambda Y: torch.full(Y.shape[:1], float("nan")), GRID)


def test_plot_points_accepts_shapes():
    ax = Figure().add_subplot(projection="3d")
    Y = sample_texture("2sines", 50, seed=0)
    plot_points(ax, Y)
    plot_points(ax, Y[..., 0].numpy(), antipodal=False, hide_back=False)
    with pytest.raises(ValueError, match="shape"):
        plot_points(ax, torch.zeros(5, 2))


def test_figure_prior_views(prior, tmp_path):
    rec = Recorder(prior.log_prob)
    path = tmp_path / "prior.png"
    figure_prior_views(rec, path, azims=(0, 90, 150), n=GRID, dtype=torch.float32)
    _png_ok(path)
    assert rec.shapes and all(s[1:] == (3, 1) for s in rec.shapes)


def test_figure_textures(prior, tmp_path):
    Y0 = prior.sample((200,), generator=torch.Generator().manual_seed(0))
    columns = [
        SphereColumn("Prior", data=Y0, log_prob_fn=prior.log_prob),
        {
            "title": "2 spirals",
            "data": sample_texture("2spirals", 200, seed=0),
            "generated": sample_texture("2spirals", 200, seed=1),
            "log_prob_fn": prior.log_prob,
        },
        {"title": "Target", "generated": sample_texture("target", 200, seed=2)},
    ]
    path = tmp_path / "sub" / "textures.png"
    figure_textures(columns, path, n=GRID, dtype=torch.float32)
    _png_ok(path)
    with pytest.raises(ValueError):
        figure_textures([], tmp_path / "empty.png")


def test_figure_antipodal(prior, tmp_path):
    Y0 = prior.sample((200,), generator=torch.Generator().manual_seed(0))
    generated = {name: -sample_texture(name, 200, seed=0) for name in ("2circles", "swissroll")}
    path = tmp_path / "antipodal.png"
    figure_antipodal(-Y0, generated, path)
    _png_ok(path)
