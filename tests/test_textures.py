"""Artificial textures on Gr(1, 3) (paper Listing 1)."""

import numpy as np
import pytest
import torch

from grassflow.data.textures import (
    TEXTURES,
    TextureSampler,
    lift_to_grassmann,
    sample_texture,
    sample_texture_2d,
    texture_splits,
)
from grassflow.manifolds import Grassmann
from grassflow.tasks.texture_runs import PAPER_TEXTURES

GR = Grassmann(1, 3)


@pytest.mark.parametrize("name", TEXTURES)
@pytest.mark.parametrize("n", [1, 2, 257])
def test_shape_orthonormal_hemisphere(name, n):
    Y = sample_texture(name, n, seed=0, dtype=torch.float64)
    assert Y.shape == (n, 3, 1) and Y.dtype == torch.float64
    GR.check_point(Y, atol=1e-12)
    # the lift (1, x, y) / norm with |(x, y)| <= 1 puts every point at y_1 >= 1/sqrt(2)
    assert (Y[:, 0, 0] >= 2**-0.5 - 1e-12).all()


@pytest.mark.parametrize("name", TEXTURES)
def test_float32_default_is_orthonormal(name):
    Y = sample_texture(name, 100, seed=1)
    assert Y.dtype == torch.float32
    GR.check_point(Y)


@pytest.mark.parametrize("name", TEXTURES)
def test_batch_max_norm_hits_the_rim(name):
    # Listing 1 divides by the largest norm in the batch, so one point sits at 45 degrees
    Y = sample_texture(name, 50, seed=2, dtype=torch.float64)
    assert Y[:, 0, 0].min().item() == pytest.approx(2**-0.5, abs=1e-12)


@pytest.mark.parametrize("name", TEXTURES)
def test_reproducible(name):
    a = sample_texture(name, 64, seed=3)
    b = sample_texture(name, 64, seed=3)
    c = sample_texture(name, 64, seed=4)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    g1, g2 = np.random.default_rng(5), np.random.default_rng(5)
    torch.testing.assert_close(
        sample_texture(name, 64, generator=g1), sample_texture(name, 64, generator=g2)
    )


def _hist(name, seed, n=4000, bins=8):
    """Histogram of the planar cloud recovered from the lift, (y_2, y_3) / y_1."""
    Y = sample_texture(name, n, seed=seed, dtype=torch.float64)[..., 0].numpy()
    p = Y[:, 1:] / Y[:, :1]
    h, _, _ = np.histogram2d(p[:, 0], p[:, 1], bins=bins, range=[[-1, 1], [-1, 1]])
    return h / n


def test_datasets_differ():
    # total variation between 8x8 histograms: about 0.05-0.08 between two draws of one
    # texture (sampling noise, 64 bins / 4000 points), 0.33 or more between textures
    hists = {name: _hist(name, seed=0) for name in TEXTURES}
    for name in TEXTURES:
        assert 0.5 * np.abs(_hist(name, seed=1) - hists[name]).sum() < 0.15, name
    names = list(TEXTURES)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert 0.5 * np.abs(hists[a] - hists[b]).sum() > 0.2, (a, b)


def test_two_d_clouds_match_listing():
    rng = np.random.default_rng(0)
    n = 20000
    # swiss roll: radius t/5 with t in [1.5 pi, 4.5 pi], before noise
    r = np.linalg.norm(sample_texture_2d("swissroll", n, rng), axis=1)
    assert 1.5 * np.pi / 5 - 0.3 < r.min() and r.max() < 4.5 * np.pi / 5 + 0.3
    # 2 circles: half the points at radius 3, half at 1.5
    r = np.linalg.norm(sample_texture_2d("2circles", n, rng), axis=1)
    assert np.mean(r > 2.25) == pytest.approx(0.5, abs=1e-3)
    # 2 spirals and target are symmetric about the origin
    for name in ("2spirals", "target"):
        xy = sample_texture_2d(name, n, rng)
        assert np.abs(xy.mean(0)).max() < 5 * xy.std(0).max() / np.sqrt(n)


def test_errors():
    with pytest.raises(ValueError, match="2spirals, swissroll, 2circles, 2sines, target"):
        sample_texture("moons", 10)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            sample_texture("target", bad)
    with pytest.raises(ValueError, match="either seed or generator"):
        sample_texture("target", 4, seed=0, generator=np.random.default_rng(0))
    with pytest.raises(ValueError, match="floating"):
        sample_texture("target", 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="unknown texture"):
        TextureSampler("nope")
    with pytest.raises(ValueError, match="unknown texture"):
        texture_splits("nope")


def test_splits_fixed_and_distinct():
    a, b = texture_splits("2sines", 100, 50, seed=0), texture_splits("2sines", 100, 50, seed=0)
    assert a["val"].shape == (100, 3, 1) and a["test"].shape == (50, 3, 1)
    for key in ("val", "test"):
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert not torch.equal(a["val"][:50], a["test"])
    train = TextureSampler("2sines", seed=0).sample(100)
    assert not torch.equal(train, a["val"])
    assert not torch.equal(texture_splits("2sines", 100, 50, seed=1)["val"], a["val"])


def test_sampler_stream_and_resume():
    s = TextureSampler("2circles", seed=7)
    first, second = s.sample(32), s.sample(32)
    assert first.shape == (32, 3, 1) and not torch.equal(first, second)
    again = TextureSampler("2circles", seed=7)
    torch.testing.assert_close(again.sample(32), first, rtol=0, atol=0)
    state = s.state_dict()
    nxt = s.sample(16)
    resumed = TextureSampler("2circles", seed=123)
    resumed.load_state_dict(state)
    torch.testing.assert_close(resumed.sample(16), nxt, rtol=0, atol=0)
    with pytest.raises(ValueError, match="not 'target'"):
        TextureSampler("target").load_state_dict(state)


def test_lift_is_scale_free_and_batchwise():
    xy = np.random.default_rng(0).standard_normal((30, 2))
    y = lift_to_grassmann(xy)
    np.testing.assert_allclose(lift_to_grassmann(7.5 * xy), y, atol=1e-14)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, atol=1e-14)
    # the normalizer is the batch max: adding a far point squeezes the others
    far = np.concatenate([xy, [[100.0, 0.0]]])
    assert (lift_to_grassmann(far)[:-1, 0] > y[:, 0]).all()


def test_model_initialization_depends_on_the_seed_only():
    # torch seeds its default generator randomly per process; build_model must not depend on it
    from grassflow.tasks.texture_runs import TexturesExperiment, build_model

    def params(seed):
        exp = TexturesExperiment(train=PAPER_TEXTURES.replace(seed=seed))
        return torch.cat([p.detach().flatten() for p in build_model(exp).parameters()])

    torch.manual_seed(123)
    a = params(0)
    torch.manual_seed(456)
    assert torch.equal(a, params(0))
    assert not torch.equal(a, params(1))
    torch.manual_seed(7)  # and building a model leaves the global stream alone
    params(0)
    after = torch.rand(1)
    torch.manual_seed(7)
    assert torch.equal(torch.rand(1), after)
