"""Texture presets: the paper-faithful one and the Fourier-feature one that resolves arms."""

import json

import pytest
import torch

from grassflow.manifolds import Grassmann
from grassflow.nn import GrassmannField, Potential
from grassflow.tasks import texture_runs as tx


def test_paper_preset_is_the_paper_model():
    # catches: the new options leaking into the default (paper) model
    exp = tx.preset("paper", "swissroll")
    assert exp == tx.TexturesExperiment(dataset="swissroll")
    pot = tx.build_model(exp).field.potential
    assert pot.fourier_scale is None
    assert pot.horp.weight.shape == (3, 1)
    assert pot.layers[0].linear.in_features == 3  # one 3-vector feature (HorP, k = 1)


def test_fourier_preset_builds_fourier_features():
    # catches: build_model ignoring horp_width / fourier_scale
    exp = tx.preset("fourier", "2sines")
    pot = tx.build_model(exp).field.potential
    assert exp.objective == "fm" and exp.dataset == "2sines"
    assert pot.horp.weight.shape == (3, 32)
    assert pot.layers[0].linear.in_features == 2 * 3 * 32  # sin and cos of each entry
    # the weight is drawn at the documented scale (N(0, 4^2): std ~ 4 over 96 entries)
    assert 3.0 < pot.horp.weight.std().item() < 5.0


def test_fourier_preset_round_trips_through_json():
    # catches: a field lost in to_dict/from_dict, so a resumed or evaluated run rebuilds
    # the paper's model instead of the trained one
    exp = tx.preset("fourier", "target")
    back = tx.TexturesExperiment.from_dict(json.loads(json.dumps(exp.to_dict())))
    assert back == exp
    a, b = tx.build_model(exp), tx.build_model(back)
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), n


def test_old_experiment_json_loads_as_paper_model():
    # catches: run directories written before the new fields failing to load
    d = tx.TexturesExperiment().to_dict()
    del d["horp_width"], d["fourier_scale"]
    assert tx.TexturesExperiment.from_dict(d) == tx.TexturesExperiment()


@pytest.mark.parametrize("bad", [{"horp_width": 0}, {"horp_width": 2.5}, {"fourier_scale": 0.0}])
def test_bad_options_are_rejected(bad):
    with pytest.raises(ValueError):
        tx.TexturesExperiment(**bad)


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="fourier"):
        tx.preset("nope")


def test_fourier_potential_is_invariant_and_its_jet_matches_autograd():
    # catches: features that depend on the representative's sign, or a wrong sin/cos jet
    # (the exact NLL uses the jet's Laplacian)
    torch.manual_seed(0)
    pot = Potential(3, 1, (16,), horp_width=4, fourier_scale=3.0).double()
    gr = Grassmann(1, 3)
    Y = torch.nn.functional.normalize(torch.randn(5, 3, 1, dtype=torch.float64), dim=1)
    gr.check_point(Y, name="Y")
    t = torch.tensor(0.3, dtype=torch.float64)
    assert torch.allclose(pot(t, Y), pot(t, -Y))
    field = GrassmannField(pot)
    assert field.path() == "forward"
    X_jet, div_jet = field.field_and_divergence(t, Y, create_graph=False)
    field.laplacian = "hvp"
    X_hvp, div_hvp = field.field_and_divergence(t, Y, create_graph=False)
    assert torch.allclose(X_jet, X_hvp, atol=1e-10)
    assert torch.allclose(div_jet, div_hvp, atol=1e-8)
    # the features really oscillate: a scale-3 potential is not the tanh one
    assert not torch.allclose(div_jet, torch.zeros_like(div_jet))


def test_describe_names_objective_and_features():
    assert "fm" in tx.describe(tx.DEMO) and "Fourier" in tx.describe(tx.DEMO)
    assert "mle" in tx.describe(tx.DEMO_PAPER) and "paper" in tx.describe(tx.DEMO_PAPER)
