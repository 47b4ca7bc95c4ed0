"""DW4/LJ13 experiment presets, the Table 1 sweep and its CLI, on small synthetic files."""

import json
import math

import numpy as np
import pytest

from grassflow.cli import main
from grassflow.tasks import particle_runs as px
from grassflow.tasks.run_dir import training_status
from grassflow_paper import table1

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def fake_data(path, system="dw4", n=2100, seed=0):
    """A `data make`-layout file of random (not Boltzmann) configurations."""
    width = {"dw4": 8, "lj13": 39}[system]
    path.mkdir(parents=True, exist_ok=True)
    rows = 2.0 * np.random.default_rng(seed).standard_normal((n, width))
    np.save(path / f"{system}.npy", rows.astype(np.float32))
    return path


def test_paper_presets():
    cfg = px.paper_train_config("dw4", 1000)
    assert (cfg.lr, cfg.weight_decay, cfg.batch_size, cfg.iterations) == (1e-4, 1e-12, 100, 3000)
    cfg = px.paper_train_config("lj13", 10)  # 500 epochs of one batch of 10
    assert (cfg.batch_size, cfg.iterations) == (10, 500)
    assert px.paper_train_config("dw4", 100_000).iterations == 6 * 1000
    assert px.paper_train_config("dw4", 1000, "fm").iterations == 10**7  # stopped by budget
    shapes = {(s, p): px.ParticleExperiment(system=s, protocol=p).shape
              for s in ("dw4", "lj13") for p in ("com-free", "paper")}  # fmt: skip
    assert shapes == {("dw4", "com-free"): (3, 2), ("dw4", "paper"): (4, 2),
                      ("lj13", "com-free"): (12, 3), ("lj13", "paper"): (13, 3)}  # fmt: skip
    # the sanity rows: log V_Gr
    volumes = {s: px.build_model(px.ParticleExperiment(system=s[0], protocol=s[1]))
               .manifold.log_volume() for s in shapes}  # fmt: skip
    expected = {("dw4", "paper"): 2.983, ("dw4", "com-free"): 1.838,
                ("lj13", "paper"): 3.215, ("lj13", "com-free"): 3.982}  # fmt: skip
    for key, value in expected.items():
        assert volumes[key] == pytest.approx(value, abs=5e-4)
    with pytest.raises(ValueError, match="protocol"):
        px.ParticleExperiment(protocol="centred")
    with pytest.raises(ValueError, match="system|dw5"):
        px.ParticleExperiment(system="dw5")


def _iterations(runs):
    return {d.name: json.loads((d / "eval.json").read_text())["iterations"]
            for d in sorted(runs.iterdir())}  # fmt: skip


@pytest.mark.slow
def test_reproduce_table1_end_to_end_and_resume(tmp_path, fixed_pace):
    fixed_pace(0.4)  # a 3 s budget: 7 steps, 2.8 s
    data = fake_data(tmp_path / "data")
    out, runs = tmp_path / "out", tmp_path / "runs"
    args = ["reproduce", "table1", "--system", "dw4", "--sizes", "20", "--seeds", "0", "1",
            "--budget", "0.05", "--data-dir", str(data), "--out", str(out), "--runs", str(runs),
            "--no-progress"]  # fmt: skip
    assert main(args) == 0
    result = json.loads((out / "table1.json").read_text())
    assert len(result["runs"]) == 4  # 2 protocols x 1 size x 2 seeds
    for r in result["runs"]:
        assert math.isfinite(r["test_nll"]) and r["n_test"] == 1000
        assert (r["protocol"] == "paper") == (r["manifold"] == "Gr(2,4)")
        assert r["iterations"] == 7 and r["trained_minutes"] == pytest.approx(2.8 / 60)
        assert training_status(r["run_dir"])["spent_total_budget"] == 0.05
    md = (out / "table1.md").read_text()
    assert "-12.53 ± 0.92" not in md  # no paper column for a size the paper did not run
    assert "GrCNF here, com-free, Gr(2,3)" in md and "1.838" in md
    assert (out / "table1_val.png").stat().st_size > 10_000
    first = _iterations(runs)
    assert all(name.endswith(("-generated-n20-s0", "-generated-n20-s1")) for name in first)

    # catches: a rerun with the same budget training again, or re-evaluating
    stamps = {d.name: (d / "eval.json").stat().st_mtime_ns for d in runs.iterdir()}
    assert main(args) == 0
    assert json.loads((out / "table1.json").read_text()) == result
    assert {d.name: (d / "eval.json").stat().st_mtime_ns for d in runs.iterdir()} == stamps

    # catches: a larger budget returning the cached eval.json instead of continuing
    bigger = [*args[:-1], "--budget", "0.1", "--no-progress"]
    assert main(bigger) == 0
    second = _iterations(runs)
    assert all(second[name] > first[name] for name in first)
    rows = json.loads((out / "table1.json").read_text())["runs"]
    assert sorted(r["iterations"] for r in rows) == sorted(second.values())
    # ... and a smaller one is refused: the runs have trained longer than it
    with pytest.raises(table1.RunMismatch, match="total_budget_minutes: 0.1 -> 0.05"):
        table1.reproduce(out, runs, systems=("dw4",), sizes={"dw4": (20,)}, seeds=(0,),
                         minutes=0.05, data_dir=data, progress=False)  # fmt: skip


@pytest.mark.slow
def test_table1_refuses_runs_of_other_data(tmp_path, fixed_pace):
    # catches: runs trained on one data file being reused or resumed for another
    fixed_pace(0.4)
    data, out, runs = fake_data(tmp_path / "data"), tmp_path / "out", tmp_path / "runs"
    kw = dict(systems=("dw4",), protocols=("com-free",), sizes={"dw4": (20,)}, seeds=(0,),
              minutes=0.05, data_dir=data, progress=False)  # fmt: skip
    table1.reproduce(out, runs, **kw)
    fake_data(data, seed=1)  # same path and layout, other configurations
    with pytest.raises(table1.RunMismatch, match=r"data\.train: 'sha256:") as info:
        table1.reproduce(out, runs, **kw)
    assert "data.val" in str(info.value) and "--force" in str(info.value)
    # --force retrains on the new data
    result = table1.reproduce(out, runs, **kw, force=True)
    run_dir = runs / "dw4-com-free-fm-uniform-generated-n20-s0"
    assert result["runs"][0]["run_dir"] == str(run_dir)
    ident = json.loads((run_dir / "data.json").read_text())
    assert ident == px.data_identity_of(px.ParticleExperiment(
        n_train=20, data_dir=str(data), objective="fm", prior="uniform"), px.load_data(
        px.ParticleExperiment(n_train=20, data_dir=str(data))))


def test_table1_markdown_has_paper_columns():
    runs = [{"system": "lj13", "protocol": "com-free", "n_train": n, "manifold": "Gr(3,12)",
             "test_nll": v, "uniform_nll": 3.982, "trained_minutes": m, "iterations": i}
            for n, v, m, i in ((10, 1.0, 0.9, 900), (10, 3.0, 1.02, 1200), (100, 2.0, 1.0, 50))]
    md = table1.markdown_table({"objective": "fm", "prior": "uniform", "budget_minutes": 1,
                                "source": "generated", "runs": runs})  # fmt: skip
    assert "-23.64 ± 2.23" in md and "-12.86 ± 3.67" in md and "-15.75 ± 5.02" in md
    assert "2.00 ± 1.41" in md  # mean ± sample std over the seeds
    assert "| 2.00 |" in md  # a single seed has no std
    assert "trained 0.90–1.02 min, 50–1,200 iterations" in md  # what ran, not what was asked


@pytest.mark.slow
def test_train_and_eval_on_particles(tmp_path, capsys):
    data = fake_data(tmp_path / "data", "lj13", n=2050)
    run = tmp_path / "run"
    assert main(["train", "--dataset", "lj13", "--n-train", "30", "--data-dir", str(data),
                 "--objective", "fm", "--prior", "uniform", "--iterations", "5",
                 "--run-dir", str(run), "--no-progress"]) == 0  # fmt: skip
    exp = json.loads((run / "experiment.json").read_text())
    assert (exp["system"], exp["protocol"], exp["objective"]) == ("lj13", "com-free", "fm")
    assert main(["eval", str(run)]) == 0
    assert "Gr(3,12)" in capsys.readouterr().out
    assert main(["sample", str(run), "--n", "4", "--out", str(tmp_path / "s.npz")]) == 0
    assert np.load(tmp_path / "s.npz")["Y"].shape == (4, 12, 3)


def test_missing_data_is_a_clear_error(tmp_path, capsys):
    rc = main(["reproduce", "table1", "--system", "lj13", "--data-dir", str(tmp_path),
               "--no-progress"])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "lj13.npy" in err and "grassflow data make lj13" in err


def test_data_make_and_compare(tmp_path, capsys):
    args = ["data", "make", "dw4", "--n", "300", "--chains", "30", "--burn-in", "200",
            "--thin", "20", "--out", str(tmp_path / "data"), "--no-progress"]  # fmt: skip
    assert main(args) == 0
    rows = np.load(tmp_path / "data" / "dw4.npy")
    assert rows.shape == (300, 8) and rows.dtype == np.float32 and np.isfinite(rows).all()
    assert main(args) == 2  # refuses to overwrite
    assert "--overwrite" in capsys.readouterr().err
    # catches: a comparison that cannot tell distributions apart. The reference is our file
    # with every coordinate scaled by 1.1: pair distances grow by exactly 10 %.
    ref = tmp_path / "ref"
    ref.mkdir()
    np.save(ref / "test_split_DW4.npy", 1.1 * rows)
    assert main(["data", "compare", "--system", "dw4", "--data-dir", str(tmp_path / "data"),
                 "--reference", str(ref), "--out", str(tmp_path / "out")]) == 0  # fmt: skip
    result = json.loads((tmp_path / "out" / "sampler_check.json").read_text())
    d = result["dw4"]["pair_distance"]
    assert d["mean_reference"] == pytest.approx(1.1 * d["mean"], rel=1e-5)
    # 1,800 distances per side: the KS floor is about 1.36 sqrt(2 / 1800) = 0.045
    assert d["ks"] > 0.1 and d["ks"] > 2 * d["floor"]["ks"] and d["jsd"] > d["floor"]["jsd"]
    assert (tmp_path / "out" / "sampler_check.png").stat().st_size > 10_000
