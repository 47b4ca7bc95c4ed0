"""Mutation audit: each bug below must fail the quick loop (``pytest -m "not slow"``).

Run from the repository root: ``python tests/mutation_audit.py [--only NAME ...]``. Each
mutation is applied to a copy of ``src/`` and ``tests/`` in a temporary folder (the working
tree is never touched), the quick tests of the files it concerns run there, and the script
prints which tests failed. It exits 1 if a mutation survives. The list holds the bugs of
the audits of issues 20, 33 and 42, bugs planted in issue 41's code (the Z-matrix, the
volume, the torus map, the symmetrization, ring closure, the reweighting) and in issue 42's
(the training loop's order, the data modules); add one whenever
a bug slips past the quick loop. The
two-part model's (``TwoPartShapeFlow``, the Gram densities) live in ``grassflow_paper`` since
issue 34.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (file under src/, text, replacement, test files)
MUTATIONS = {
    "gram: no initial scale spread between mixture components": (
        "grassflow_paper/gram_densities.py",
        "spread = torch.linspace(-1.0, 1.0, self.components) if self.components > 1 else 0.0",
        "spread = 0.0", ["tests/test_graph.py"]),
    "shapes: training split includes the test clouds": (
        "grassflow/tasks/shape_runs.py", '"train": X[perm[n_test + n_val:]]', '"train": X[perm]',
        ["tests/test_shapes_splits.py"]),
    "shapes: validated on training clouds": (
        "grassflow/tasks/shape_runs.py", 'splits["val"][: exp.n_val_flow]',
        'splits["train"][: exp.n_val_flow]', ["tests/test_shapes_splits.py"]),
    "two-part: flow validated on training clouds": (
        "grassflow_paper/two_part.py", "Y_val = model.factor(val_clouds[:n_val_flow])[0]",
        "Y_val = model.factor(train_clouds[:n_val_flow])[0]", ["tests/test_shapes_splits.py"]),
    "two-part: gram.initialize removed": (
        "grassflow_paper/two_part.py", "    model.gram.initialize(S_train, Y_train)\n", "",
        ["tests/test_shapes_splits.py"]),
    "shapes: SEM as std/N": (
        "grassflow/tasks/shape_runs.py", "log_prob.std() / len(test) ** 0.5",
        "log_prob.std() / len(test)", ["tests/test_shapes_splits.py"]),
    "vs_enf: eval cache all -> any": (
        "grassflow_paper/vs_enf.py", 'old.get("test_hash") == test_hash and all(',
        'old.get("test_hash") == test_hash and any(', ["tests/test_vs_enf.py"]),
    "TwoPartShapeFlow: n instead of n - 1 in the Jacobian": (
        "grassflow_paper/two_part.py",
        "log_s = self.gram.log_prob(S, Y)\n        jac = log_jacobian_gram(torch.diagonal(S, dim1=-2, dim2=-1), self.n_points - 1)",
        "log_s = self.gram.log_prob(S, Y)\n        jac = log_jacobian_gram(torch.diagonal(S, dim1=-2, dim2=-1), self.n_points)", ["tests/test_two_part.py"]),
    "TwoPartShapeFlow: Jacobian subtracted": (
        "grassflow_paper/two_part.py", '"log_prob": log_gr + log_s + jac',
        '"log_prob": log_gr + log_s - jac',
        ["tests/test_two_part.py"]),
    "TwoPartShapeFlow: eigenvalues of S reversed relative to Y": (
        "grassflow_paper/two_part.py", "return Y, torch.diag_embed(lam)",
        "return Y, torch.diag_embed(lam.flip(-1))", ["tests/test_two_part.py"]),
    "TwoPartShapeFlow: no Haar rotation in sampling": (
        "grassflow_paper/two_part.py", "(Y @ torch.linalg.cholesky(S) @ R)",
        "(Y @ torch.linalg.cholesky(S))",
        ["tests/test_two_part.py"]),
    "TwoPartShapeFlow: wrong sign of the log det S term": (
        "grassflow/distributions/cartesian.py", "return const - 0.5 * (n - k - 1) * torch.log(lam)",
        "return const + 0.5 * (n - k - 1) * torch.log(lam)", ["tests/test_two_part.py"]),
    "TwoPartShapeFlow: density 1 % too high everywhere": (
        "grassflow_paper/two_part.py", '"log_prob": log_gr + log_s + jac}',
        '"log_prob": log_gr + log_s + jac + 0.01}', ["tests/test_two_part.py"]),
    "GrCNF: density 1 % too high everywhere": (
        "grassflow/flows/grcnf.py", "return self._prior_log_prob(Y0) + a0",
        "return self._prior_log_prob(Y0) + a0 + 0.01", ["tests/test_flows.py"]),
    "ShapeFlow: divergence subtracted": (
        "grassflow/flows/shape_flow.py", "lp = self.prior_log_prob(z0) + a  #",
        "lp = self.prior_log_prob(z0) - a  #", ["tests/test_shape_flow.py"]),
    "ShapeFlow: prior normalized over n d dimensions": (
        "grassflow/flows/shape_flow.py", "lp = -0.5 * self.event_dim * torch.log(",
        "lp = -0.5 * self.n_points * self.dim * torch.log(", ["tests/test_shape_flow.py"]),
    "ShapeFlow: density 1 % too high everywhere": (
        "grassflow/flows/shape_flow.py", "lp = self.prior_log_prob(z0) + a  #",
        "lp = self.prior_log_prob(z0) + a + 0.01  #", ["tests/test_shape_flow.py"]),
    "ShapeFlow: half the divergence (a missing direction class)": (
        "grassflow/flows/shape_flow.py", "div = (Jv * basis).sum(dim=(0, -2, -1))",
        "div = (Jv * basis)[::2].sum(dim=(0, -2, -1))", ["tests/test_shape_flow.py"]),
    # issue 33's audit: eight bugs that survived the quick loop, and a 3 % density error
    "DistanceGram: metric_fit given the targets as weights and the weights as targets": (
        "grassflow_paper/gram_densities.py", "S = metric_fit(d, out[..., 0], out[..., 1])",
        "S = metric_fit(d, out[..., 1], out[..., 0])", ["tests/test_distance_gram.py"]),
    "DistanceGram: initialize takes targets from |d|^2, ignoring S": (
        "grassflow_paper/gram_densities.py",
        'sq = torch.einsum("...pa,...ab,...pb->...p", d, S.to(d), d)',
        "sq = (d * d).sum(-1)", ["tests/test_distance_gram.py"]),
    "DistanceGram: density 3 % too high everywhere": (
        "grassflow_paper/gram_densities.py", "return torch.logsumexp(log_pi + lp, -1)",
        "return torch.logsumexp(log_pi + lp, -1) + 0.03", ["tests/test_distance_gram.py"]),
    "ShapeFlow: the float64 re-solve only on NaN (+-inf passes through)": (
        "grassflow/flows/shape_flow.py", "if torch.isfinite(lp).all():",
        "if not torch.isnan(lp).any():", ["tests/test_shape_flow.py"]),
    "CFM: equivariant OT aligns but drops the minibatch assignment": (
        "grassflow/training/shape_matching.py",
        "            x0 = x0[assignment(orthogonal_cost(x0, x1)).argsort()]\n"
        "            if getattr(",
        "            if getattr(", ["tests/test_shape_flow.py"]),
    "CFM: equivariant OT pairs the x1 of each x0 (the assignment not inverted)": (
        "grassflow/training/shape_matching.py",
        "x0 = x0[assignment(orthogonal_cost(x0, x1)).argsort()]",
        "x0 = x0[assignment(orthogonal_cost(x0, x1))]", ["tests/test_shape_flow.py"]),
    "CFM: the flow-matching path reversed": (
        "grassflow/manifolds/shape_paths.py", "return (1 - tt) * x0 + tt * x1, x1 - x0",
        "return tt * x0 + (1 - tt) * x1, x1 - x0", ["tests/test_shape_flow.py"]),
    "alignment: Kabsch allows reflections under reflections=False": (
        "grassflow/manifolds/alignment.py",
        "    if not reflections:\n        sign = torch.sign",
        "    if False:\n        sign = torch.sign",
        ["tests/test_alignment.py"]),
    "bonds: matching refined across elements": (
        "grassflow/metrics/bonds.py", "perm = _refine(X[todo], perm, b, l0, groups, rounds)",
        "perm = _refine(X[todo], perm, b, l0, None, rounds)", ["tests/test_bonds.py"]),
    "training: the total budget left measured on the wall clock": (
        "grassflow/training/budget.py",
        "left_s = 0.0 if spent else 60.0 * total - charged_seconds(config, state)",
        'left_s = 0.0 if spent else 60.0 * total - state.train.seconds("wall")',
        ["tests/test_budgets.py"]),
    # issue 42's audit of issues 34-35's code: the five that had survived the quick loop
    "ShapeFlow: sample_with_log_prob does not reflect into the hand": (
        "grassflow/flows/shape_flow.py",
        "            X = self._to_hand(self.clouds(torch.cat(zs)))",
        "            X = self.clouds(torch.cat(zs))", ["tests/test_molecule_model.py"]),
    "CFM: equivariant OT ignores each pair's own labels": (
        "grassflow/training/shape_matching.py",
        "x1 = align_pairs(x0, x1, labels=fixed if labels is None else labels)",
        "x1 = align_pairs(x0, x1, labels=fixed)", ["tests/test_labels_per_cloud.py"]),
    "EGNN: torsion partners merged with farther atoms": (
        "grassflow/nn/egnn.py", "hops = graph_distances(bonds, n)[i, j].clamp_max(_MAX_HOPS) - 1",
        "hops = graph_distances(bonds, n)[i, j].clamp_max(_MAX_HOPS - 1) - 1",
        ["tests/test_molecule_model.py"]),
    "find_hand: the last qualifying centre": (
        "grassflow/data/molecule_files.py", "        if m >= best_margin:",
        "        if m >= margin:", ["tests/test_molecule_io.py"]),
    "malloc: the trim threshold never set": (
        "grassflow/_malloc.py", "    if not mallopt(_M_TRIM_THRESHOLD, trim):",
        "    if False:", ["tests/test_malloc.py"]),
    # issue 41's new code, planted
    "Z-matrix: duplicate (bond, angle, torsion) references allowed": (
        "grassflow/manifolds/zmatrix.py", "            if (j, k, l) not in used:",
        "            if True:", ["tests/test_zmatrix.py"]),
    "internal coordinates: sin(theta) dropped from the volume": (
        "grassflow/manifolds/internal.py",
        "2 * bonds.log().sum(-1) + theta.sin().log().sum(-1)", "2 * bonds.log().sum(-1)",
        ["tests/test_internal_coordinates.py", "tests/test_internal_flow.py"]),
    "internal coordinates: the centre of mass term dropped": (
        "grassflow/manifolds/internal.py", " - 1.5 * math.log(self.n_atoms)", "",
        ["tests/test_internal_coordinates.py", "tests/test_internal_flow.py"]),
    "InternalFlow: the torus map's span pi instead of 2 pi": (
        "grassflow/flows/internal_flow.py",
        "span = torch.where(self.half_turn, math.pi, TWO_PI)",
        "span = torch.where(self.half_turn, math.pi, math.pi)", ["tests/test_internal_flow.py"]),
    "InternalFlow: the symmetrization's 2^-s dropped": (
        "grassflow/flows/internal_flow.py",
        "                - (self.n_swaps + self.n_mirror) * math.log(2.0))",
        "                - 0.0)", ["tests/test_internal_flow.py"]),
    "InternalFlow: samples not swapped at random": (
        "grassflow/flows/internal_flow.py", "            return self._swapped(X, coins[:, :-1])",
        "            return X", ["tests/test_internal_flow.py"]),
    "InternalFlow: the fitted mixture trained whatever train_base says": (
        "grassflow/flows/internal_flow.py", "        if not config.train_base:",
        "        if False:", ["tests/test_internal_flow.py", "tests/test_shapes_experiment.py"]),
    "InternalFlow: ring closure without the whitening's correlations": (
        "grassflow/flows/internal_flow.py", "        cov = cov + 1e-8",
        "        cov = torch.diag_embed(cov.diagonal()) + 1e-8", ["tests/test_internal_flow.py"]),
    "reweighting: a failed energy keeps its weight": (
        "grassflow/metrics/boltzmann.py",
        "log_target = np.where(ok, -np.where(ok, E, 0.0) / kT, -np.inf)",
        "log_target = np.where(ok, -np.where(ok, E, 0.0) / kT, 0.0)", ["tests/test_reweight.py"]),
    "reweighting: the Boltzmann factor at 2 kT": (
        "grassflow/metrics/boltzmann.py",
        "log_target = np.where(ok, -np.where(ok, E, 0.0) / kT, -np.inf)",
        "log_target = np.where(ok, -np.where(ok, E, 0.0) / (2 * kT), -np.inf)",
        ["tests/test_reweight.py"]),
    # issue 42's data modules (data/cloud_chemistry.py), planted
    "bond table: orders not permuted with their sorted bonds": (
        "grassflow/data/cloud_chemistry.py", "return ij, None if o is None else o[perm]",
        "return ij, o", ["tests/test_molecule_io.py", "tests/test_point_clouds.py", "tests/test_user_data.py"]),
    "bond table: pairs not put in (i < j) order, so a reversed duplicate passes": (
        "grassflow/data/cloud_chemistry.py", "    ij = np.sort(ij, axis=1)\n", "", ["tests/test_molecule_io.py", "tests/test_point_clouds.py", "tests/test_user_data.py"]),
    # issue 42's loop as a short sequence (training/loop.py), planted
    "train: the final checkpoint written before the call's end is recorded": (
        "grassflow/training/loop.py",
        "            if final:\n                run.end(out_of_budget)\n"
        "            if done % config.checkpoint_every == 0 or final:\n                run.checkpoint()\n",
        "            if done % config.checkpoint_every == 0 or final:\n                run.checkpoint()\n"
        "            if final:\n                run.end(out_of_budget)\n",
        ["tests/test_training.py", "tests/test_loop_parts.py", "tests/test_budgets.py", "tests/test_validation.py"]),
    "train: a validation due between two log lines is skipped": (
        "grassflow/training/loop.py", "if done % config.log_every == 0 or final or val_due:",
        "if done % config.log_every == 0 or final:", ["tests/test_training.py", "tests/test_loop_parts.py", "tests/test_budgets.py", "tests/test_validation.py"]),
    "train: Ctrl-C during an update saves the half-updated model": (
        "grassflow/training/loop.py", "if not (self.updating or self.parallel):",
        "if not self.parallel:", ["tests/test_training.py", "tests/test_loop_parts.py", "tests/test_budgets.py", "tests/test_validation.py"]),
    "train: Ctrl-C saves the RNG after the step it cut short, not before": (
        "grassflow/training/loop.py", "self.checkpoint(self.step_rng)", "self.checkpoint()",
        ["tests/test_training.py", "tests/test_loop_parts.py", "tests/test_budgets.py", "tests/test_validation.py"]),
    "train: the learning-rate schedule never steps": (
        "grassflow/training/loop.py",
        "        if self.scheduler is not None:\n            self.scheduler.step()\n", "", ["tests/test_training.py", "tests/test_loop_parts.py", "tests/test_budgets.py", "tests/test_validation.py"]),
    "train: validation of the raw weights when an EMA is kept": (
        "grassflow/training/loop.py",
        "with nullcontext() if self.ema is None else self.ema.applied():",
        "with nullcontext():", ["tests/test_training.py", "tests/test_loop_parts.py", "tests/test_budgets.py", "tests/test_validation.py"]),
    "InternalFlow: the circle's standardization without its Jacobian": (
        "grassflow/flows/internal_flow.py",
        "-torch.cat([torch.zeros_like(theta), log_dg], -1)",
        "-torch.cat([torch.zeros_like(theta), 0 * log_dg], -1)", ["tests/test_internal_flow.py"]),
    "TorusSplineFlow: the uniform base on an arc of pi": (
        "grassflow/nn/torus_splines.py", "real - n_circ * math.log(TWO_PI)",
        "real - n_circ * math.log(math.pi)", ["tests/test_internal_flow.py"]),
    "TorusSplineFlow: the angles' half turn not undone when sampling": (
        "grassflow/nn/torus_splines.py",
        "out[..., self.moved_idx] = _shift(spline.inv(y[..., self.moved_idx]), self.moved_circ)",
        "out[..., self.moved_idx] = spline.inv(y[..., self.moved_idx])",
        ["tests/test_internal_flow.py"]),
}  # fmt: skip


def run(name: str, workdir: Path) -> list[str]:
    """Apply mutation ``name`` in ``workdir`` (a copy), run its quick tests; failed tests."""
    path, old, new, tests = MUTATIONS[name]
    target = workdir / "src" / path
    text = target.read_text()
    if text.count(old) != 1:
        raise RuntimeError(f"{name}: the text to mutate is not found once in {path}")
    target.write_text(text.replace(old, new))
    try:
        env = {**os.environ, "PYTHONPATH": str(workdir / "src")}
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
             "-rf", *tests], cwd=workdir, env=env, capture_output=True, text=True,
        )  # fmt: skip
    finally:
        target.write_text(text)
    return [line.split()[1] for line in out.stdout.splitlines() if line.startswith("FAILED")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=list(MUTATIONS), metavar="NAME")
    args = p.parse_args()
    survived = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "repo"
        for part in ("src", "tests", "pyproject.toml"):
            copy = shutil.copytree if (ROOT / part).is_dir() else shutil.copy
            copy(ROOT / part, work / part)
        (work.parent / "shared").symlink_to((ROOT / ".." / "shared").resolve())
        for name in args.only or MUTATIONS:
            failed = run(name, work)
            print(f"{'caught' if failed else 'SURVIVED'}: {name}", flush=True)
            for test in failed:
                print(f"    {test}")
            if not failed:
                survived.append(name)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
