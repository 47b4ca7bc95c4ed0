"""Tests for the quadrature helper of the normalization tests (tests/quadrature.py)."""

from __future__ import annotations

import math

import pytest
import torch

from quadrature import grassmann_rule, log_volume_grassmann


@pytest.mark.parametrize("k,D,order", [(1, 3, 17), (2, 3, 17), (1, 4, 11), (3, 4, 11),
                                       (2, 4, 11)])  # fmt: skip
def test_rules_have_the_moments_of_the_uniform_law(k, D, order):
    # catches: a rule that is not the uniform law (a wrong map from S^2 / S^3 / S^2 x S^2, a
    # wrong Chebyshev weight, weights not doubled for the halved antipodal pairs): for the
    # projector P = Y Y^T of a uniform [Y], E[P] = (k / D) I and
    # E[P_ij P_kl] = a d_ij d_kl + b (d_ik d_jl + d_il d_jk) with tr P = tr P^2 = k
    Y, w = grassmann_rule(k, D, order)
    assert Y.shape == (len(w), D, k) and Y.dtype == torch.float64
    torch.testing.assert_close(Y.mT @ Y, torch.eye(k).expand(len(w), k, k), atol=1e-12, rtol=0)
    assert (w > 0).all() and abs(w.sum().item() - 1.0) < 1e-13
    P = Y @ Y.mT
    torch.testing.assert_close(torch.einsum("n,nij->ij", w, P), k / D * torch.eye(D),
                               atol=1e-13, rtol=0)  # fmt: skip
    b = (k - k * k / D) / (D * D + D - 2)
    a = (k * k - 2 * b * D) / D**2
    eye = torch.eye(D)
    ref = a * torch.einsum("ij,kl->ijkl", eye, eye) + b * (
        torch.einsum("ik,jl->ijkl", eye, eye) + torch.einsum("il,jk->ijkl", eye, eye)
    )
    torch.testing.assert_close(torch.einsum("n,nij,nkl->ijkl", w, P, P), ref, atol=1e-13, rtol=0)


def test_grassmann_volumes():
    # catches: a wrong volume in the normalization tests: V_Gr(1, 3) = 2 pi (half the sphere),
    # V_Gr(1, 4) = pi^2 (half of S^3), and Gr(k, D) = Gr(D - k, D)
    assert log_volume_grassmann(1, 3) == pytest.approx(math.log(2 * math.pi), abs=1e-13)
    assert log_volume_grassmann(1, 4) == pytest.approx(math.log(math.pi**2), abs=1e-13)
    assert log_volume_grassmann(2, 3) == pytest.approx(log_volume_grassmann(1, 3), abs=1e-13)
    assert log_volume_grassmann(3, 4) == pytest.approx(log_volume_grassmann(1, 4), abs=1e-13)
