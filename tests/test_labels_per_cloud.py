"""Atom types given per cloud: the conditional shape model ``p(x | a)`` (QM9's molecules differ
in composition), its coupling, and the positional bound of its QM9 rows."""

import itertools
import math

import pytest
import torch

from grassflow.flows import ShapeFlow, ShapeFlowConfig
from grassflow.flows.shape_flow import pack_labels
from grassflow.manifolds.alignment import align_pairs
from grassflow.training.shape_matching import cfm_objective
from grassflow_paper.efm import QM9_TYPES, EFMExperiment, load_splits, positional_bound

N, K = 5, 3


def _models(labels: torch.Tensor, chunk_size: int = 2) -> tuple[ShapeFlow, ShapeFlow]:
    """A model with labels per cloud and one with the fixed ``labels``, same parameters."""
    torch.manual_seed(0)
    free = ShapeFlow(N, 3, hidden=8, layers=2, n_labels=K, chunk_size=chunk_size).double()
    with torch.no_grad():  # the coordinate heads start near zero: make the field count
        for p in free.parameters():
            p.add_(0.05 * torch.randn_like(p))
    fixed = ShapeFlow(N, 3, hidden=8, layers=2, labels=labels, n_labels=K).double()
    fixed.load_state_dict(free.state_dict(), strict=False)  # fixed adds the labels buffer
    return free, fixed


def test_each_cloud_is_scored_with_its_own_labels():
    # catches labels misaligned with the chunks of a solve, a wrong one-hot, labels ignored
    L = torch.tensor([[0, 0, 1, 2, 1], [2, 2, 2, 0, 1], [1, 0, 0, 0, 0], [0, 1, 2, 0, 1],
                      [2, 1, 0, 1, 2]])  # fmt: skip
    P = torch.randn(5, N, 3, dtype=torch.float64)
    free, _ = _models(L[0], chunk_size=1)  # one cloud per solve: the same steps as alone
    lp = free.log_prob(P, L)
    for b in range(5):
        _, fixed = _models(L[b])
        assert torch.allclose(lp[b], fixed.log_prob(P[b : b + 1])[0], atol=1e-8)
    free.chunk_size = 2
    assert torch.allclose(lp, free.log_prob(pack_labels(P, L)), atol=1e-3)
    assert (lp - free.log_prob(P, L[0])).abs().max() > 1e-3  # the labels matter


def test_conditional_density_is_invariant_to_relabelling_points_with_their_labels():
    # catches a field that permutes points but not their labels (or the reverse)
    L = torch.tensor([[0, 0, 1, 2, 1], [2, 2, 2, 0, 1]])
    P = torch.randn(2, N, 3, dtype=torch.float64)
    free, _ = _models(L[0])
    perm = torch.tensor([3, 0, 4, 1, 2])
    lp = free.log_prob(P, L)
    assert torch.allclose(free.log_prob(P[:, perm], L[:, perm]), lp, atol=1e-8)
    assert (free.log_prob(P[:, perm], L) - lp).abs().max() > 1e-3


def test_samples_follow_their_labels():
    # catches a sampler that drops the labels (its solve would not be log_prob's flow)
    L = torch.tensor([[0, 0, 1, 2, 1], [2, 2, 2, 0, 1], [1, 0, 0, 0, 0]])
    free, _ = _models(L[0])
    free.atol = free.rtol = 1e-9  # forward and backward solves then agree to ~1e-7
    X, lp = free.sample_with_log_prob(3, torch.Generator().manual_seed(1), labels=L)
    assert torch.allclose(free.log_prob(X, L), lp, atol=1e-5)
    assert (free.log_prob(X, L[[1, 2, 0]]) - lp).abs().min() > 1e-2
    g = torch.Generator().manual_seed(1)
    assert torch.allclose(free.sample(3, g, labels=L), X, atol=1e-8)


def test_bad_labels_are_refused_by_name():
    # catches silently wrong answers from labels a model cannot read
    free, fixed = _models(torch.zeros(N, dtype=torch.long))
    P = torch.randn(2, N, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="takes each cloud's labels"):
        free.log_prob(P)
    with pytest.raises(ValueError, match=r"lie in 0\.\.2"):
        free.log_prob(P, torch.full((2, N), 3))
    with pytest.raises(ValueError, match="must be integers"):
        free.log_prob(torch.cat([P, torch.full((2, N, 1), 0.5, dtype=P.dtype)], -1))
    with pytest.raises(ValueError, match=r"must be \(2, 5\)"):
        free.log_prob(P, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="samples given labels"):
        free.sample(2)
    with pytest.raises(ValueError, match="no per-cloud labels"):
        fixed.log_prob(P, torch.zeros(2, N, dtype=torch.long))
    with pytest.raises(ValueError, match="cannot have one molecule's bonds"):
        ShapeFlowConfig(N, 3, n_labels=K, bonds=((0, 1),))
    config = ShapeFlowConfig(N, 3, n_labels=K)  # and it survives the JSON round trip
    assert ShapeFlow.from_config(config.to_dict()).labels_per_cloud


def test_per_pair_alignment_equals_aligning_each_pair_alone():
    # catches pair b aligned within another pair's labels (an index slip over the starts)
    torch.manual_seed(3)
    x0, x1 = torch.randn(2, 4, 6, 3, dtype=torch.float64)
    x0, x1 = x0 - x0.mean(-2, keepdim=True), x1 - x1.mean(-2, keepdim=True)
    L = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 1, 0, 1, 0, 1], [1, 1, 1, 1, 1, 0],
                      [0, 1, 1, 0, 0, 0]])  # fmt: skip
    together = align_pairs(x0, x1, labels=L)
    for b in range(4):
        alone = align_pairs(x0[b : b + 1], x1[b : b + 1], labels=L[b])
        assert torch.allclose(together[b], alone[0], atol=1e-10)
        for k in (0, 1):  # only points of one label swap: their norms, as a set, are kept
            keep = L[b] == k
            a, c = (x[keep].norm(dim=-1).sort().values for x in (together[b], x1[b]))
            assert torch.allclose(a, c, atol=1e-10)
    assert not torch.allclose(together, align_pairs(x0, x1))  # the labels constrain it


def test_flow_matching_trains_a_conditional_model():
    # catches a packed label column that leaks into the positions, or labels lost in the loss
    L = torch.randint(0, K, (8, N))
    P = torch.randn(8, N, 3, dtype=torch.float64)
    free, _ = _models(L[0])
    torch.manual_seed(5)
    loss, _ = cfm_objective(free, pack_labels(P, L))
    torch.manual_seed(5)
    again, _ = cfm_objective(free, pack_labels(P, L))
    torch.manual_seed(5)
    other, _ = cfm_objective(free, pack_labels(P, (L + 1) % K))
    assert torch.isfinite(loss) and loss == again and abs(loss - other) > 1e-6
    loss.backward()
    assert free.field.embed.weight.grad[:, 1:].abs().sum() > 0  # the one-hot columns learn


def test_positional_bound_against_enumeration():
    # catches a wrong count of compositions (p(c) not normalized) or of labellings M(c)
    n, k = 4, 3
    train = torch.tensor([[0, 0, 1, 2], [0, 1, 0, 2], [2, 2, 2, 2], [1, 1, 0, 0]])
    labellings = torch.tensor(list(itertools.product(range(k), repeat=n)))
    b = positional_bound(torch.zeros(len(labellings)), labellings, train, n_types=k)
    # q(a) = p(c(a)) / M(c(a)) must sum to one over every labelling
    assert math.isclose(torch.exp(-b).sum().item(), 1.0, rel_tol=1e-12)
    # M(c) by enumeration, and p(c) of a seen composition: (2 + 1) / (4 + C(6, 2))
    a = torch.tensor([[2, 0, 1, 0]])
    same = sum(sorted(x) == [0, 0, 1, 2] for x in labellings.tolist())
    expected = -math.log(3 / (4 + 15)) + math.log(same)
    assert math.isclose(positional_bound(torch.zeros(1), a, train, k).item(), expected)
    assert torch.allclose(positional_bound(torch.tensor([2.0]), a, train, k), torch.tensor(
        expected - 2.0, dtype=torch.float64))  # fmt: skip


def test_qm9_atom_types_are_the_molecules_elements(tmp_path):
    # catches atom types misaligned with their atoms or their molecules
    from grassflow.data.qm9 import load_qm9_positional, qm9pack_data_dir

    try:
        qm9pack_data_dir()
    except ImportError:
        pytest.skip("qm9pack is not installed (pip install -e '.[qm9]')")

    data = load_splits("qm9", 50, str(tmp_path), atom_types=True)
    raw = load_qm9_positional(tmp_path, progress=False)
    for split, key in (("train", "train"), ("val", "valid"), ("test", "test")):
        X = data[split]
        m = len(X)
        assert X.shape[1:] == (19, 4)
        charges = torch.tensor(QM9_TYPES)[X[..., 3].long()]
        assert torch.equal(charges, torch.as_tensor(raw[f"{key}_charges"][:m]))
        P = torch.as_tensor(raw[key][:m])
        assert torch.allclose(X[..., :3], P - P.mean(-2, keepdim=True))
    with pytest.raises(ValueError, match="atom_types is for QM9"):
        EFMExperiment(system="dw4", atom_types=True).shape_config()
    assert "--atom-types" in EFMExperiment(system="qm9", atom_types=True).command()


def test_equivariant_ot_swaps_atoms_only_within_each_pairs_own_labels(monkeypatch):
    # bug caught (issue 42's audit): the objective's equivariant OT aligning a model with
    # labels per cloud without the pairs' labels, matching atoms across elements; training
    # runs and the density stays normalized, only worse, so only the pairs show it
    import grassflow.training.shape_matching as sm

    seen = {}
    real = sm.cfm_losses

    def spy(model, x0, x1, t, geometry, labels):
        seen.update(x1=x1, labels=labels)
        return real(model, x0, x1, t, geometry, labels)

    monkeypatch.setattr(sm, "cfm_losses", spy)
    free, _ = _models(torch.zeros(N, dtype=torch.long))
    torch.manual_seed(7)
    L = torch.stack([torch.randperm(N) % K for _ in range(16)])
    P = torch.randn(16, N, 3, dtype=torch.float64)
    cfm_objective(free, pack_labels(P, L), coupling="equivariant-ot")
    assert torch.equal(seen["labels"], L)
    x1, P = seen["x1"], P - P.mean(-2, keepdim=True)
    swapped = 0
    for b in range(16):
        for k in range(K):  # rotated and relabelled within label k: its norms, as a set, kept
            a, c = (x[L[b] == k].norm(dim=-1).sort().values for x in (x1[b], P[b]))
            assert torch.allclose(a, c, atol=1e-10), (b, k)
        swapped += not torch.allclose(x1[b].norm(dim=-1), P[b].norm(dim=-1), atol=1e-10)
    assert swapped > 0  # power: the alignment did relabel some pairs
