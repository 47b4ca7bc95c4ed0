"""The library's shape model (grassflow.flows.ShapeFlow; with geometry="cartesian", the EFM
baseline): exact density, symmetries, normalization, CFM (grassflow.training.shape_matching;
the alignment's own tests are test_alignment.py's)."""

import itertools
import math

import pytest
import torch

from conftest import mc_tolerance, random_orthogonal
from grassflow.flows import ShapeFlow
from grassflow.manifolds.alignment import procrustes
from grassflow.nn.egnn import EGNNField
from grassflow.training import TrainConfig, fit_shape_flow, load_shape_flow
from grassflow.training.shape_matching import cfm_losses, cfm_objective


def _model(n=4, d=2, gain=0.1, **kw) -> ShapeFlow:
    """A model whose untrained field moves mass (the default init starts near zero): a few
    nats of log-density at gain 0.1."""
    torch.manual_seed(1)
    m = ShapeFlow(n, d, hidden=16, layers=2, atol=1e-7, rtol=1e-7, **kw)
    for mlp in m.field.coord:
        torch.nn.init.normal_(mlp[-1].weight, std=gain)
    return m


def _clouds(B, n, d, scale=1.5, seed=None):
    g = None if seed is None else torch.Generator().manual_seed(seed)
    return scale * torch.randn(B, n, d, generator=g) + 3.0  # any translation


def test_zero_field_gives_the_normalized_prior_in_closed_form():
    # bug caught: a wrong normalizer (n d instead of (n - 1) d dims, a missing 2 pi or scale)
    m = ShapeFlow(5, 3, prior_std=1.7)
    for mlp in m.field.coord:
        torch.nn.init.zeros_(mlp[-1].weight)
    P = _clouds(7, 5, 3)
    X = P - P.mean(1, keepdim=True)
    D = 4 * 3
    expected = -0.5 * D * math.log(2 * math.pi * 1.7**2) - X.square().sum((1, 2)) / (2 * 1.7**2)
    with torch.no_grad():
        torch.testing.assert_close(m.log_prob(P), expected)


def test_fit_prior_is_the_maximum_likelihood_scale():
    # bug caught: a scale fitted over n d (not (n - 1) d) coordinates or to uncentred clouds
    P = _clouds(50, 6, 2)
    m = ShapeFlow(6, 2)
    s = m.fit_prior(P)
    X = P - P.mean(1, keepdim=True)
    assert s == pytest.approx((X.square().sum() / (50 * 5 * 2)).sqrt().item(), rel=1e-12)
    assert m.prior_std.item() == s


def test_divergence_is_the_trace_of_the_full_jacobian():
    # bug caught: a missing or doubled basis direction, a trace over the CoM directions too
    m = _model(5, 3)
    z = m.helmert(_clouds(3, 5, 3))
    t = torch.tensor(0.37)
    v, div = m._velocity_and_divergence(t, z)
    J = torch.autograd.functional.jacobian(lambda y: m.velocity(t, y).sum(0), z)
    traces = torch.stack([J[..., b, :, :].reshape(12, 12).trace() for b in range(3)])
    torch.testing.assert_close(div, traces)
    torch.testing.assert_close(v, m.velocity(t, z))


def test_field_is_equivariant_to_rotation_reflection_translation_and_relabelling():
    # bug caught: absolute positions entering the messages, an uncentred output, a pair
    # index that breaks when the points are relabelled
    f = _model(6, 3).field
    x = _clouds(4, 6, 3)
    Q, perm, c = random_orthogonal(3), torch.randperm(6), torch.randn(1, 1, 3)
    t = torch.rand(4)
    v = f(t, x)
    torch.testing.assert_close(f(t, (x @ Q)[:, perm] + c), (v @ Q)[:, perm])
    torch.testing.assert_close(v.sum(1), torch.zeros(4, 3), atol=1e-12, rtol=0)


def test_log_prob_is_invariant():
    # bug caught: a density that depends on the frame, the labels or the centre of mass
    m = _model(4, 2)
    P = _clouds(5, 4, 2)
    Q, perm = random_orthogonal(2), torch.randperm(4)
    with torch.no_grad():
        torch.testing.assert_close(m.log_prob((P @ Q)[:, perm] - 5.0), m.log_prob(P), atol=1e-5,
                                   rtol=0)  # fmt: skip


def test_samples_and_their_log_prob_agree_with_log_prob():
    # bug caught: a sign error in the forward accumulation of the divergence, or a sampler
    # that integrates another field than the density
    m = _model(4, 2)
    X, logp = m.sample_with_log_prob(6, torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(m.log_prob(X), logp, atol=1e-4, rtol=0)
        torch.testing.assert_close(m.sample(6, torch.Generator().manual_seed(0)), X, atol=1e-5,
                                   rtol=0)  # fmt: skip
    torch.testing.assert_close(X.mean(1), torch.zeros(6, 2), atol=1e-12, rtol=0)


def test_density_integrates_to_one():
    # bug caught: any error in the change of variables (a missing or halved divergence, the
    # wrong time direction, a wrong normalizer) moves the mass by tens of percent.
    # Importance sampling from a Gaussian q on the 4 CoM-free coordinates of 3 points in 2-D.
    m = _model(3, 2, gain=0.05, chunk_size=8000)
    m.prior_std.fill_(1.0)
    s, N, D = 1.3, 8000, 4
    z = s * torch.randn(N, 2, 2, generator=torch.Generator().manual_seed(3))
    log_q = -0.5 * D * math.log(2 * math.pi * s**2) - z.square().sum((1, 2)) / (2 * s**2)
    with torch.no_grad():
        logp = m.log_prob(m.clouds(z))
    assert (logp - m.prior_log_prob(z)).abs().mean() > 0.3  # the flow moves mass
    w = (logp - log_q).exp()
    tol = mc_tolerance(w)
    assert tol < 0.06  # power: a missing divergence (about e^0.5) is far outside
    assert abs(w.mean().item() - 1.0) < tol


def _default_model(*args, **kw) -> ShapeFlow:
    """``ShapeFlow(*args, **kw)`` as a user builds it: under torch's default float32 (the
    tests run under float64, `conftest`)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        return ShapeFlow(*args, **kw)
    finally:
        torch.set_default_dtype(old)


def test_bad_input_is_named():
    # catches: the dtype checked against the float64 Helmert buffer instead of the
    # parameters, which refused float32 clouds and let float64 ones fail in the field
    m = _default_model(4, 2)
    assert (m.dtype, m.device, m.H.dtype) == (torch.float32, torch.device("cpu"), torch.float64)
    with pytest.raises(ValueError, match=r"\(B, 4, 2\)"):
        m.log_prob(torch.randn(3, 5, 2))
    with pytest.raises(ValueError, match=r"P is torch\.float64 .* the model is torch\.float32"):
        m.log_prob(torch.randn(3, 4, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"P is torch\.float32 .* the model is torch\.float64"):
        m.double().log_prob(torch.randn(3, 4, 2, dtype=torch.float32))
    m = ShapeFlow(4, 2)
    with pytest.raises(ValueError, match="finite"):
        m.log_prob(torch.full((2, 4, 2), float("nan")))
    with pytest.raises(ValueError, match="chunk_size"):
        ShapeFlow(4, 2, chunk_size=0)
    with pytest.raises(ValueError, match="n_points >= 2"):
        EGNNField(1, 2)
    with pytest.raises(ValueError, match="coupling"):
        cfm_objective(m, torch.randn(3, 4, 2), coupling="sinkhorn")


def test_a_default_model_scores_and_samples_float32_clouds():
    # catches: a default (float32) model refusing float32 clouds because its Helmert buffer
    # is float64, or sampling float64 clouds that its float32 field cannot take
    m = _default_model(4, 2, hidden=8, layers=1, atol=1e-4, rtol=1e-4)
    assert m.H.dtype == torch.float64 and m.dtype == torch.float32
    with torch.no_grad():
        lp = m.log_prob(_clouds(3, 4, 2).float())
        X = m.sample(2, torch.Generator().manual_seed(0))
        Y, lq = m.sample_with_log_prob(2, torch.Generator().manual_seed(0))
    assert lp.dtype == X.dtype == Y.dtype == lq.dtype == torch.float32
    assert lp.shape == (3,) and torch.isfinite(lp).all() and X.shape == (2, 4, 2)
    # the same numbers as the model cast to float32 (which casts H with it)
    m32 = ShapeFlow(4, 2, hidden=8, layers=1, atol=1e-4, rtol=1e-4).float()
    m32.load_state_dict(m.state_dict())
    with torch.no_grad():
        P = _clouds(3, 4, 2, seed=0).float()
        assert torch.equal(m32.log_prob(P), m.log_prob(P))


# ------------------------------------------------------------------ couplings


def test_equivariant_ot_lowers_the_regression_target():
    # bug caught: couplings that do not pair (the three losses would agree)
    torch.manual_seed(0)
    m = ShapeFlow(6, 2)
    for mlp in m.field.coord:
        torch.nn.init.zeros_(mlp[-1].weight)  # v = 0: the loss is E |x1 - x0|^2
    data = torch.randn(256, 6, 2) * torch.tensor([3.0, 0.5])
    m.fit_prior(data)
    loss = {c: cfm_objective(m, data, c)[0].item() for c in ("independent", "ot",
                                                            "equivariant-ot")}  # fmt: skip
    assert loss["equivariant-ot"] < loss["ot"] < loss["independent"]


class _Stub(torch.nn.Module):
    """What `cfm_objective` and `cfm_losses` use of a model: ``n_points``, ``dim``,
    ``scale_prior(eps)``, ``labels``, ``bonds``, ``clouds(z)`` (here: the fixed prior clouds
    ``x0``, whatever z) and ``field(t, x)`` (here: ``velocity(t, x)``)."""

    def __init__(self, x0, velocity):
        super().__init__()
        self.n_points, self.dim = x0.shape[1:]
        self.x0, self.velocity, self.labels, self.bonds = x0, velocity, None, None

    def scale_prior(self, eps):
        return eps

    def clouds(self, z):
        return self.x0.to(z)

    def field(self, t, x):
        return self.velocity(t, x)


def test_flow_matching_path_runs_from_the_prior_to_the_data():
    # catches: the path reversed (x_t = t x0 + (1 - t) x1 with target x1 - x0). Along the
    # straight path from x0 (t = 0) to x1 (t = 1), the field that steers every point to x1,
    # v(t, x) = (x1 - x) / (1 - t), is x1 - x0 exactly: its loss is 0; on the reversed path
    # it is t (x1 - x0) / (1 - t). And the field v(t, x) = (x - x0) / t (from x0) also gives 0.
    torch.manual_seed(3)
    x0, x1 = torch.randn(6, 5, 3), torch.randn(6, 5, 3)
    x0, x1 = x0 - x0.mean(1, keepdim=True), x1 - x1.mean(1, keepdim=True)
    t = torch.tensor([0.05, 0.2, 0.4, 0.6, 0.8, 0.9])
    tt = t[:, None, None]
    to_x1 = _Stub(x0, lambda t, x: (x1 - x) / (1 - tt))
    from_x0 = _Stub(x0, lambda t, x: (x - x0) / tt)
    for model in (to_x1, from_x0):
        torch.testing.assert_close(cfm_losses(model, x0, x1, t), torch.zeros(6), atol=1e-10,
                                   rtol=0)  # fmt: skip
    # and a zero field's loss is |x1 - x0|^2 (the target), whatever t
    zero = _Stub(x0, lambda t, x: torch.zeros_like(x))
    torch.testing.assert_close(cfm_losses(zero, x0, x1, t), (x1 - x0).square().sum((1, 2)))


def test_equivariant_ot_pairs_each_cloud_with_its_rotated_copy():
    # catches: equivariant OT keeping the alignment (Kabsch) but dropping the minibatch
    # assignment. The data are the prior clouds, shuffled across the batch and each rotated
    # or reflected: the optimal pairing (brute force over the 5! pairings of the
    # Procrustes costs: 0 only for the copies) and the alignment give x1 = x0 exactly, so a
    # zero field's loss, |x1 - x0|^2, is 0; without the assignment the aligned clouds are
    # other shapes.
    torch.manual_seed(4)
    B, n, d = 5, 6, 3
    x0 = torch.randn(B, n, d) * torch.tensor([2.0, 1.0, 0.5])
    x0 = x0 - x0.mean(1, keepdim=True)
    shuffle = torch.tensor([3, 0, 4, 1, 2])
    rotations = torch.stack([random_orthogonal(3, reflect=bool(i % 2)) for i in range(B)])
    data = x0[shuffle] @ rotations + torch.randn(B, 1, d)  # any translation
    cost = torch.stack([torch.stack([
        (x0[a] - (data[b] - data[b].mean(0)) @ procrustes(x0[a], data[b] - data[b].mean(0)))
        .square().sum() for b in range(B)]) for a in range(B)])  # fmt: skip
    best = min(itertools.permutations(range(B)), key=lambda p: sum(cost[p[i], i] for i in range(B)))
    assert list(best) == shuffle.tolist() and sum(cost[best[i], i] for i in range(B)) < 1e-9
    assert torch.stack([cost[i, i] for i in range(B)]).min() > 1.0  # the batch order is not it
    zero = _Stub(x0, lambda t, x: torch.zeros_like(x))
    loss, _ = cfm_objective(zero, data, "equivariant-ot")
    assert loss.item() < 1e-9


def test_fit_resumes_bit_exactly(tmp_path):
    # bug caught: noise (prior clouds, times) drawn from a generator the checkpoint misses
    torch.manual_seed(0)
    data, val = torch.randn(40, 4, 2), torch.randn(8, 4, 2)
    config = TrainConfig(iterations=6, batch_size=8, val_every=3, checkpoint_every=3,
                         dtype="float64", log_every=3)  # fmt: skip
    fit_shape_flow(_model(), data, val, tmp_path / "a", config, progress=False)
    fit_shape_flow(_model(), data, val, tmp_path / "b", config.replace(iterations=3),
                   progress=False)  # fmt: skip
    fit_shape_flow(_model(), data, val, tmp_path / "b", config, progress=False)
    a, b = (load_shape_flow(_model(), tmp_path / r, "last") for r in "ab")
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=0, rtol=0)
    assert a.prior_std.item() == pytest.approx(data.sub(data.mean(1, keepdim=True)).square()
                                               .sum().div(40 * 6).sqrt().item())  # fmt: skip


def test_train_data_with_the_baseline_end_to_end(tmp_path, capsys):
    # bug caught: the CLI training the two-part model instead, the baseline seeing the wrong
    # split, a prior fitted to other clouds, or eval/sample failing on a baseline run. After one
    # step of lr 1e-9 the field is still ~0, so the test NLL is the fitted CoM-free
    # Gaussian's, recomputed here.
    import json

    import numpy as np

    from grassflow.cli import main
    from grassflow.tasks import shape_runs as shapes
    from grassflow.tasks.run_dir import read_preset

    rng = np.random.default_rng(0)
    np.save(tmp_path / "c.npy", rng.standard_normal((60, 5, 2)) * [2.0, 0.5] + 1.0)
    run = tmp_path / "run"
    assert main(["train", "--data", str(tmp_path / "c.npy"), "--model", "equivariant-cnf",
                 "--run-dir", str(run), "--iterations", "1", "--lr", "1e-9", "--atol", "1e-4",
                 "--rtol", "1e-4", "--no-progress"]) == 0  # fmt: skip
    exp = json.loads((run / "experiment.json").read_text())
    assert (exp["model"], exp["layers"], exp["n_points"]) == ("equivariant-cnf", 3, 5)
    assert not (run / "gram").exists()
    assert main(["eval", str(run), "--n-samples", "20"]) == 0
    r = json.loads((run / "eval.json").read_text())
    splits = shapes.load_clouds(read_preset(run, shapes.ShapeExperiment.from_dict, "shape"))
    X = {k: splits[k] - splits[k].mean(1, keepdim=True) for k in ("train", "test")}
    var = X["train"].square().sum() / (len(X["train"]) * 4 * 2)
    nll = 4 * math.log(2 * math.pi * var) + X["test"].square().sum((1, 2)) / (2 * var)
    assert r["test_nll"] == pytest.approx(nll.mean().item(), abs=0.02)
    assert "test_nll_gram" not in r and r["params"] > 0
    assert main(["sample", str(run), "--n", "7", "--out", str(tmp_path / "s")]) == 0
    S = np.load(tmp_path / "s.npy")
    assert S.shape == (7, 5, 2) and np.abs(S.mean(1)).max() < 1e-10


def test_float32_evaluation_agrees_with_float64():
    # bug caught: a float64 buffer (H, the prior scale) silently mixed into a float32 solve,
    # or float32 rounding that would move reported NLLs (efm.EFMExperiment.eval_dtype)
    m64 = _model(5, 3, chunk_size=8)
    m64.atol = m64.rtol = 1e-4
    m32 = _model(5, 3, chunk_size=8).float()
    m32.atol = m32.rtol = 1e-4
    P = _clouds(16, 5, 3)
    with torch.no_grad():
        a, b = m64.log_prob(P), m32.log_prob(P.float()).double()
    assert b.dtype == torch.float64 and m32.H.dtype == torch.float32
    assert (a - b).mean().abs() < 1e-3 and (a - b).abs().max() < 1e-2


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_float32_solve_is_redone_in_float64(monkeypatch, bad):
    # bug caught: a NaN from one float32 solve (seen on QM9 after 20 CPU minutes) crashing
    # validation or entering a reported NLL, or the model left in float64 afterwards
    # catches: the float64 re-solve triggered only on NaN, so +-inf passes through
    m32 = _model(5, 3, chunk_size=4).float()
    m32.atol = m32.rtol = 1e-4
    P = _clouds(8, 5, 3).float()
    with torch.no_grad():
        want = m32.log_prob(P)
    real, calls = ShapeFlow._solve, []

    def flaky(self, z, *args, **kw):  # the second chunk's float32 solve fails
        calls.append(z.dtype)
        # catches: the user's module recast to float64 in the middle of the call
        assert next(m32.parameters()).dtype == torch.float32
        z0, a = real(self, z, *args, **kw)
        return (z0, a + bad) if len(calls) == 2 else (z0, a)

    monkeypatch.setattr(ShapeFlow, "_solve", flaky)
    with torch.no_grad(), pytest.warns(UserWarning, match="float64"):
        got = m32.log_prob(P)
    assert calls == [torch.float32, torch.float32, torch.float64]
    assert got.dtype == torch.float32 and next(m32.parameters()).dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-3, rtol=0)
    always = lambda self, z, *a, **k: (z, torch.full(z.shape[:1], bad))
    monkeypatch.setattr(ShapeFlow, "_solve", always)
    with torch.no_grad(), pytest.raises(FloatingPointError, match="not finite"):
        m32.log_prob(P)


# ------------------------------------------------------------------ point labels (atom types)

LABELS = torch.tensor([6, 6, 1, 1, 1, 8])  # two C, three H, one O


def _label_preserving_perm(labels: torch.Tensor) -> torch.Tensor:
    perm = torch.arange(len(labels))
    for v in labels.unique():
        g = (labels == v).nonzero().flatten()
        perm[g] = g[torch.randperm(len(g))]
    return perm


def test_labelled_field_is_equivariant_to_label_preserving_relabellings():
    # bug caught: the labels not following their points (e.g. one-hot indexed by position
    # after a permutation), or a label embedding that breaks E(3) equivariance
    f = _model(6, 3, labels=LABELS).field
    x, t = _clouds(4, 6, 3), torch.rand(4)
    Q, perm, c = random_orthogonal(3), _label_preserving_perm(LABELS), torch.randn(1, 1, 3)
    assert not torch.equal(perm, torch.arange(6))
    torch.testing.assert_close(f(t, (x @ Q)[:, perm] + c), (f(t, x) @ Q)[:, perm])
    m = _model(6, 3, labels=LABELS)
    with torch.no_grad():
        torch.testing.assert_close(m.log_prob((x @ Q)[:, perm] - 2.0), m.log_prob(x),
                                   atol=1e-5, rtol=0)  # fmt: skip


def test_labels_break_invariance_to_swapping_different_elements():
    # bug caught: labels accepted but never reaching the features (the density would stay
    # invariant to every relabelling, as the unlabelled model's is)
    swap = torch.tensor([2, 1, 0, 3, 4, 5])  # a C and an H trade places
    x = _clouds(6, 6, 3)
    labelled, plain = _model(6, 3, gain=0.3, labels=LABELS), _model(6, 3, gain=0.3)
    with torch.no_grad():
        torch.testing.assert_close(plain.log_prob(x[:, swap]), plain.log_prob(x), atol=1e-5,
                                   rtol=0)  # fmt: skip
        change = (labelled.log_prob(x[:, swap]) - labelled.log_prob(x)).abs()
    assert change.min() > 1e-3  # the ODE tolerance is 1e-7


def test_unlabelled_model_keeps_its_state_dict_and_numbers():
    # bug caught: a label embedding (or buffer) added to every model, so that checkpoints
    # saved before labels existed no longer load or give other numbers. The fingerprints are
    # of the code before labels (seeded init of EGNNField(5, 3, hidden=8, layers=2)).
    torch.manual_seed(3)
    f = EGNNField(5, 3, hidden=8, layers=2)
    keys = ["embed.weight", "embed.bias"] + [
        f"{m}.{k}.{p}" for m, ps in (("source", ("weight", "bias")), ("target", ("weight",)),
                                     ("distance", ("weight",))) for k in range(2) for p in ps
    ]  # fmt: skip
    assert list(f.state_dict())[: len(keys)] == keys and "labels" not in f.state_dict()
    assert len(f.state_dict()) == 34 and f.embed.weight.shape == (8, 1)
    assert sum(p.sum() for p in f.parameters()).item() == pytest.approx(-8.872553853609714,
                                                                        rel=1e-12)  # fmt: skip
    with torch.no_grad():
        for mlp in f.coord:
            mlp[-1].weight.fill_(0.05)
    torch.manual_seed(1)
    out = f(torch.tensor(0.3), torch.randn(2, 5, 3)).square().sum().item()
    assert out == pytest.approx(0.7654808599392411, rel=1e-10)
    m = ShapeFlow(5, 3, hidden=8, layers=2)
    m.load_state_dict({f"field.{k}": v for k, v in f.state_dict().items()}
                      | {"H": m.H, "prior_std": m.prior_std})  # strict  # fmt: skip


def test_labelled_state_dict_round_trip_and_bad_labels():
    # bug caught: labels not saved with the model (a reload would silently drop them)
    m = _model(6, 3, labels=LABELS)
    assert torch.equal(m.state_dict()["field.labels"], LABELS)
    other = ShapeFlow(6, 3, hidden=16, layers=2, labels=LABELS)
    other.load_state_dict(m.state_dict())
    x = _clouds(2, 6, 3)
    torch.testing.assert_close(other.field(0.5, x), m.field(0.5, x))
    with pytest.raises(RuntimeError):  # an unlabelled model cannot take it
        ShapeFlow(6, 3, hidden=16, layers=2).load_state_dict(m.state_dict())
    with pytest.raises(ValueError, match="6 non-negative integers"):
        EGNNField(6, 3, labels=torch.tensor([1.0] * 6))
    with pytest.raises(ValueError, match="n_labels"):
        EGNNField(6, 3, labels=LABELS, n_labels=5)


def test_equivariant_ot_aligns_within_the_models_labels(monkeypatch):
    # bug caught: the equivariant-OT coupling relabelling a labelled model's data clouds
    # across elements (`align_pairs` without the labels; its own test: test_alignment.py)
    seen = {}
    monkeypatch.setattr("grassflow.training.shape_matching.align_pairs",
                        lambda a, b, **kw: seen.update(kw) or b)  # fmt: skip
    cfm_objective(_model(6, 3, labels=LABELS), torch.randn(4, 6, 3))
    assert torch.equal(seen["labels"], LABELS)


def test_train_labelled_data_with_the_baseline_reloads_its_labels(tmp_path):
    # bug caught: build_model dropping the data's labels for the baseline, or a saved run
    # reloading without them; and a preset saved before labels (no efm_labels) must build
    # the unlabelled model its checkpoint holds
    import json

    import numpy as np

    from grassflow.tasks import shape_runs as shapes

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "m.npz", positions=rng.standard_normal((30, 6, 3)),
             labels=LABELS.numpy())  # fmt: skip
    exp = shapes.ShapeExperiment(data=str(tmp_path / "m.npz"), model="equivariant-cnf",
                                 hidden=8, layers=1, atol=1e-3, rtol=1e-3)  # fmt: skip
    exp.flow = exp.flow.replace(iterations=1, batch_size=8, val_every=1, checkpoint_every=1)
    resolved = shapes.run(exp, tmp_path / "run", progress=False)
    assert resolved.efm_labels is True and resolved.labels == tuple(LABELS.tolist())
    _, model = shapes.load_run(tmp_path / "run")
    assert torch.equal(model.labels, LABELS)
    old = json.loads((tmp_path / "run" / "experiment.json").read_text())
    del old["efm_labels"], old["kind"]  # as a preset saved before either
    assert shapes.build_model(shapes.ShapeExperiment.from_dict(old)).labels is None


def test_train_data_geometry_reaches_the_paths_and_the_preset(tmp_path, monkeypatch):
    # bug caught: --geometry parsed but not stored, or stored but the flow matching still on
    # straight lines (the model's config and the objective disagree)
    import json

    import numpy as np

    from grassflow.cli import main
    from grassflow.training import shape_matching

    seen = []
    real = shape_matching.shape_path
    monkeypatch.setattr(shape_matching, "shape_path",
                        lambda g, *a: seen.append(g) or real(g, *a))  # fmt: skip
    rng = np.random.default_rng(1)
    np.save(tmp_path / "c.npy", rng.standard_normal((40, 5, 2)))
    run = tmp_path / "run"
    assert main(["train", "--data", str(tmp_path / "c.npy"), "--geometry", "grassmann",
                 "--run-dir", str(run), "--iterations", "2", "--no-eval", "--val-every", "end",
                 "--no-progress"]) == 0  # fmt: skip
    assert json.loads((run / "experiment.json").read_text())["geometry"] == "grassmann"
    assert seen and set(seen) == {"grassmann"}
