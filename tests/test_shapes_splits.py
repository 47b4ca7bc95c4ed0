"""Users' own clouds, quick checks: the split, what training is fed, the arithmetic of
``shapes.evaluate``, and the refusal of the removed two-part model's runs. No real training:
spies and a stub model stand in for it (the end-to-end run is in test_shapes_experiment.py,
marked slow). The two-part model's own split check (`two_part.train_shape_flow`, the paper's)
is here too."""

import json
import re

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon, pdist

from grassflow.tasks import shape_runs as shapes
from grassflow.training import TrainConfig
from grassflow_paper import two_part


def clouds(N=40, n=4, d=2, scale=1.0, seed=0):
    """N distinct random clouds (N, n, d), translated at random."""
    rng = np.random.default_rng(seed)
    return scale * rng.standard_normal((N, n, d)) + rng.standard_normal((N, 1, d))


def rows(X) -> list[bytes]:
    return [np.ascontiguousarray(x, dtype=np.float64).tobytes() for x in np.asarray(X)]


@pytest.fixture
def data_file(tmp_path):
    X = clouds()
    path = tmp_path / "clouds.npy"
    np.save(path, X)
    return path, X


def test_split_is_disjoint_seeded_and_covers_the_data(data_file):
    # catches: test clouds in the training (or validation) split, clouds dropped or repeated
    path, X = data_file
    exp = shapes.ShapeExperiment(data=str(path))
    s = shapes.load_clouds(exp)
    assert [len(s[k]) for k in ("train", "val", "test")] == [32, 4, 4]
    assert all(s[k].dtype == torch.float64 for k in ("train", "val", "test"))
    train, val, test = (set(rows(s[k])) for k in ("train", "val", "test"))
    assert len(train) == 32 and len(val) == 4 and len(test) == 4
    assert not train & test and not train & val and not val & test
    assert sorted(rows(torch.cat([s["train"], s["val"], s["test"]]))) == sorted(rows(X))
    # the same seed gives the same split; another seed another one
    again = shapes.load_clouds(exp)
    assert all(torch.equal(again[k], s[k]) for k in ("train", "val", "test"))
    other = shapes.load_clouds(shapes.ShapeExperiment(data=str(path), split_seed=1))
    assert set(rows(other["test"])) != test


def test_run_trains_on_train_and_validates_on_val(data_file, tmp_path, monkeypatch):
    # catches: `run` handing the test (or training) clouds to training as train or val data
    path, X = data_file
    calls = []

    def spy(model, train_clouds, val_clouds, run_dir, config, **kw):
        calls.append((train_clouds.clone(), val_clouds.clone(), run_dir))

    monkeypatch.setattr(shapes, "fit_shape_flow", spy)
    exp = shapes.ShapeExperiment(data=str(path), n_val_flow=3)
    shapes.run(exp, tmp_path / "run", progress=False)
    (train, val, run_dir), = calls  # fmt: skip
    s = shapes.load_clouds(exp)
    assert torch.equal(train, s["train"]) and torch.equal(val, s["val"][:3])
    assert run_dir == tmp_path / "run" / "flow"
    test = set(rows(s["test"]))
    assert not set(rows(train)) & test and not set(rows(val)) & test
    assert not set(rows(train)) & set(rows(val))


def test_train_shape_flow_feeds_each_part_its_split(monkeypatch, tmp_path):
    # catches: a part validated (best.pt picked) on training clouds; gram.initialize skipped
    calls = []

    def spy(module, data, config, run_dir, *, val_data=None, **kw):
        calls.append({"module": module, "data": data.clone(), "val": val_data.clone(),
                      "dir": run_dir.name})  # fmt: skip

    monkeypatch.setattr(two_part, "train", spy)
    X = torch.as_tensor(clouds(N=30, scale=100.0))
    train_clouds, val_clouds = X[:20], X[20:]
    model = two_part.TwoPartShapeFlow(4, 2).double()
    cfg = TrainConfig(iterations=1, batch_size=8, dtype="float64")
    two_part.train_shape_flow(model, train_clouds, val_clouds, tmp_path, cfg, cfg, n_val_flow=6,
                              progress=False)  # fmt: skip
    flow, gram = calls
    assert (flow["dir"], gram["dir"]) == ("flow", "gram")
    assert flow["module"] is model.flow
    assert torch.allclose(flow["data"], model.factor(train_clouds)[0])
    assert torch.allclose(flow["val"], model.factor(val_clouds[:6])[0])
    assert torch.equal(gram["data"], train_clouds) and torch.equal(gram["val"], val_clouds)
    # the Gram density's E[tr S] is the training clouds' mean trace (Monte Carlo); without
    # initialize it keeps its default scale, ~1e4 x too small for these clouds
    Y, S = model.factor(train_clouds)
    data_trace = torch.diagonal(S, dim1=-2, dim2=-1).sum(-1).mean()
    with torch.no_grad():
        draws = model.gram.sample(Y.repeat(50, 1, 1), torch.Generator().manual_seed(0))
    model_trace = torch.diagonal(draws, dim1=-2, dim2=-1).sum(-1).mean()
    assert model_trace.item() == pytest.approx(data_trace.item(), rel=0.1)


class StubModel:
    """Stands in for a trained model in ``evaluate``: known per-cloud log-probs and known
    samples, so its numbers can be recomputed independently."""

    def __init__(self, n, d):
        self.n, self.d, self.seen, self.samples = n, d, [], []

    def parameters(self):
        return iter([torch.zeros(2)])

    def log_prob(self, P):
        self.seen.append(P.clone())
        return -P.pow(2).sum((1, 2)) + 0.5 * P[:, 0, 0] - 2.0

    def sample(self, m, generator=None):
        X = 2.0 * torch.randn(m, self.n, self.d, generator=generator, dtype=torch.float64)
        self.samples.append(X)
        return X


def test_evaluate_numbers_recomputed_independently(data_file, tmp_path, monkeypatch):
    # catches: the test SEM as std/N, not std/sqrt(N); the NLL or JSD of other clouds or bins
    path, _ = data_file
    exp = shapes.ShapeExperiment(data=str(path), n_points=4, dim=2)
    stub = StubModel(4, 2)
    monkeypatch.setattr(shapes, "load_run", lambda run_dir: (exp, stub))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    r = shapes.evaluate(run_dir, n_samples=300)
    test = shapes.load_clouds(exp)["test"]
    (seen,) = stub.seen
    assert torch.equal(seen, test) and r["n_test"] == len(test) == 4
    lp = -(test.numpy() ** 2).sum((1, 2)) + 0.5 * test.numpy()[:, 0, 0] - 2.0
    assert r["test_nll"] == pytest.approx(-lp.mean(), rel=1e-12)
    assert r["test_nll_sem"] == pytest.approx(lp.std(ddof=1) / np.sqrt(4), rel=1e-10)
    assert "test_nll_gram" not in r and r["model"] == "equivariant-cnf"
    # the project's JSD is in nats: the square of scipy's Jensen-Shannon distance (base e)
    (X,) = stub.samples
    a = np.concatenate([pdist(x) for x in X.numpy()])
    b = np.concatenate([pdist(x) for x in test.numpy()])
    hi = 1.5 * np.quantile(b, 0.999)
    p = np.histogram(np.clip(a, 0.0, hi), bins=100, range=(0.0, hi))[0]
    q = np.histogram(b, bins=100, range=(0.0, hi))[0]
    assert a.max() > hi  # some sample distances fall past the range: counted in the last bin
    assert r["distance_jsd"] == pytest.approx(jensenshannon(p, q) ** 2, rel=1e-6)
    assert 0 < r["distance_jsd"] < np.log(2)


@pytest.mark.parametrize("model", ["shapeflow", None])
def test_a_shapeflow_run_is_refused_with_its_last_commit(data_file, tmp_path, model, capsys):
    # catches: a run of the two-part ShapeFlow (removed in issue 34; a preset without `model`
    # is one) read as the baseline's, whose checkpoint it is not, or refused without saying
    # why and where the model still is (3531f93), by `eval`, `sample`, `train` or Python
    from grassflow.cli import main
    from grassflow.tasks.run_dir import read_preset

    path, _ = data_file
    old = {"kind": "shapes", "data": str(path), "model": model, "potential": "egnn",
           "prior": "uniform", "objective": "fm", "gram_density": "distance",
           "gram_components": 1, "gram": {"iterations": 2000}, "n_points": 4, "dim": 2}  # fmt: skip
    if model is None:  # saved before the option existed: a ShapeFlow
        del old["model"], old["kind"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "experiment.json").write_text(json.dumps(old))
    why = "removed from grassflow in issue 34; the last commit that has it is 3531f93"
    with pytest.raises(ValueError, match=why):
        read_preset(run, shapes.ShapeExperiment.from_dict, "shape")
    with pytest.raises(ValueError, match=re.escape(f"{run} is a run of the two-part ShapeFlow")):
        shapes.load_run(run)
    with pytest.raises(ValueError, match=why):
        shapes.ShapeExperiment(data=str(path), model="shapeflow")
    for argv in (["eval", str(run)], ["sample", str(run), "--out", str(tmp_path / "s")],
                 ["train", "--data", str(path), "--run-dir", str(run), "--resume"]):  # fmt: skip
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert why in err and "'shapeflow'" in err and "equivariant-cnf" in err, (argv, err)
    assert not (run / "flow").exists()  # nothing trained over it


def test_grcnf_options_are_refused_with_data(data_file, tmp_path, capsys):
    # catches: --objective or --prior uniform (the GrCNF's, and the removed ShapeFlow's)
    # silently ignored by `train --data`, whose model trains by flow matching from its own
    # prior (gaussian or, for a molecule, harmonic: --prior takes those two)
    from grassflow.cli import main

    path, _ = data_file
    for flag, value, says in (("--objective", "mle", "3531f93"),
                              ("--prior", "uniform", "gaussian or harmonic")):  # fmt: skip
        argv = ["train", "--data", str(path), "--run-dir", str(tmp_path / "r"), flag, value]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert flag in err and says in err, err
    assert not (tmp_path / "r").exists()


def test_a_baseline_run_saved_with_the_shapeflow_options_still_loads(tmp_path):
    # catches: a baseline run made before issue 34 (its preset holds the removed ShapeFlow's
    # options, ignored by the baseline) no longer readable, or refused on resume as another run
    from grassflow.tasks.run_dir import RunMismatch, claim_run_dir

    new = shapes.ShapeExperiment(data="c.npy", n_points=4, dim=2)
    old = {**new.to_dict(), "potential": "egnn", "prior": "uniform", "objective": "fm",
           "gram_density": "distance", "gram_components": 1,
           "gram": {"iterations": 2000, "lr": 1e-3}}  # fmt: skip
    assert shapes.ShapeExperiment.from_dict(old) == new
    run = tmp_path / "run"
    run.mkdir()
    (run / "experiment.json").write_text(json.dumps({"kind": "shapes", **old}))
    kw = {"kind": "shapes", "added": shapes.ADDED_FIELDS, "removed": shapes.REMOVED_FIELDS}
    claim_run_dir(run, new.to_dict(), {}, **kw)  # the old run, continued
    assert "gram" not in json.loads((run / "experiment.json").read_text())
    other = shapes.ShapeExperiment(data="c.npy", n_points=4, dim=2, hidden=8)
    with pytest.raises(RunMismatch, match="hidden"):
        claim_run_dir(run, other.to_dict(), {}, **kw)


def test_split_option_parses_and_reaches_the_split(data_file, capsys):
    # catches: --split parsed as (test, val) instead of (val, test), not passed through
    # `_shape_experiment` (the default 10 %/10 % used anyway), or bad input accepted
    from grassflow.cli import build_parser, main
    from grassflow.cli.run_commands import _shape_experiment

    path, _ = data_file
    parser = build_parser()
    argv = ["train", "--run-dir", "r", "--data", str(path)]
    exp = _shape_experiment(parser.parse_args([*argv, "--split", "0.2,0.05"]))
    assert (exp.val_fraction, exp.test_fraction) == (0.2, 0.05)
    s = shapes.load_clouds(exp)
    assert [len(s[k]) for k in ("train", "val", "test")] == [30, 8, 2]
    default = _shape_experiment(parser.parse_args(argv))
    assert (default.val_fraction, default.test_fraction) == (0.1, 0.1)
    for bad, why in (("0.1", "VAL,TEST"), ("a,b", "VAL,TEST"), ("0.5,0.5", "sum < 1"),
                     ("0,0.1", "in \\(0, 1\\)"), ("0.1,0.1,0.1", "VAL,TEST")):  # fmt: skip
        with pytest.raises(SystemExit) as info:  # argparse's usage error
            main([*argv, "--split", bad])
        err = capsys.readouterr().err
        assert info.value.code == 2
        assert "--split" in err and why.replace("\\", "") in err, (bad, err)


def test_run_prints_the_split_and_the_labels(data_file, tmp_path, monkeypatch, capsys):
    # catches: a silent split (issue 33): counts, fractions and seed not printed when training
    # starts, or printed for other fractions than those used; labels of shapes_Z.npy unnamed
    path, _ = data_file
    monkeypatch.setattr(shapes, "fit_shape_flow", lambda *a, **k: None)
    exp = shapes.ShapeExperiment(data=str(path), val_fraction=0.25, test_fraction=0.125,
                                 split_seed=3)  # fmt: skip
    shapes.run(exp, tmp_path / "run", progress=False)
    out = capsys.readouterr().out
    assert "40 clouds of 4 points in 2-D" in out and "seed 3" in out
    assert "--split 0.25,0.125" in out and "25 train, 10 val, 5 test" in out
    assert "labels: none" in out and "clouds_Z.npy" in out  # how to give them
    np.save(path.with_name("clouds_Z.npy"), np.array([6, 1, 1, 8]))
    shapes.run(exp, tmp_path / "run2", progress=False)
    out = capsys.readouterr().out
    assert "C H2O, from clouds_Z.npy".replace(" ", "") in out.replace(" ", "")
    s = shapes.load_clouds(exp)
    assert s["labels"] == (6, 1, 1, 8) and s["labels_from"] == "clouds_Z.npy"
