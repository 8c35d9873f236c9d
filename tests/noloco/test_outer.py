"""NoLoCo's and DiLoCo's outer steps: a hand-computed case, the β = γ fast path, and the reduction to DiLoCo."""

from __future__ import annotations

import pytest
import torch

from swarmlm.noloco.outer import DiLoCoOuter, group_means, noloco_step, noloco_step_fast


def _pair():
    phi_i = torch.tensor([1.0, 2.0])
    theta_i = torch.tensor([0.5, 2.5])
    delta_i = torch.tensor([0.2, -0.4])
    phi_j = torch.tensor([3.0, 0.0])
    theta_j = torch.tensor([2.0, 1.0])
    return phi_i, theta_i, delta_i, phi_j, theta_j


# Worked by hand for α = 0.5, β = 0.7, γ = 0.3:
#   mean(φ − θ) = ((0.5, −0.5) + (1, −1)) / 2 = (0.75, −0.75);  mean φ = (2, 1);  φ_i − mean φ = (−1, 1)
#   u = −0.7·(0.75, −0.75) − 0.3·(−1, 1) = (−0.225, 0.225)
#   Δ = 0.5·(0.2, −0.4) + u = (−0.125, 0.025)
#   heavy-ball: φ = φ_i + Δ = (0.875, 2.025)
#   look-ahead: φ = φ_i + 0.5·Δ + u = (0.7125, 2.2375)
@pytest.mark.parametrize("momentum, expected_phi", [("heavy_ball", [0.875, 2.025]), ("lookahead", [0.7125, 2.2375])])
def test_outer_step_matches_hand_computed_case(momentum, expected_phi):
    phi_i, theta_i, delta_i, phi_j, theta_j = _pair()
    # Through the same path the trainer uses: the partner's message is [θ_j, φ_j].
    mean_pseudo, mean_phi = group_means(theta_i, phi_i, [torch.cat([theta_j, phi_j])], fast=False)
    torch.testing.assert_close(mean_pseudo, torch.tensor([0.75, -0.75]))
    torch.testing.assert_close(mean_phi, torch.tensor([2.0, 1.0]))
    phi, delta = phi_i.clone(), delta_i.clone()
    noloco_step(phi, delta, mean_pseudo_grad=mean_pseudo, mean_phi=mean_phi, alpha=0.5, beta=0.7, gamma=0.3, momentum=momentum)
    torch.testing.assert_close(delta, torch.tensor([-0.125, 0.025]))
    torch.testing.assert_close(phi, torch.tensor(expected_phi))


def test_fast_path_hand_computed():
    phi_i, theta_i, delta_i, phi_j, theta_j = _pair()
    mean_theta, _ = group_means(theta_i, None, [theta_j], fast=True)
    torch.testing.assert_close(mean_theta, torch.tensor([1.25, 1.75]))
    phi, delta = phi_i.clone(), delta_i.clone()
    noloco_step_fast(phi, delta, mean_theta=mean_theta, alpha=0.5, beta=0.7)
    # Δ = 0.5·(0.2, −0.4) + 0.7·((1.25, 1.75) − (1, 2)) = (0.275, −0.375)
    torch.testing.assert_close(delta, torch.tensor([0.275, -0.375]))
    torch.testing.assert_close(phi, torch.tensor([1.275, 1.625]))


@pytest.mark.parametrize("momentum", ["heavy_ball", "lookahead"])
@pytest.mark.parametrize("group", [2, 3, 5])
def test_fast_path_equals_general_form_when_beta_equals_gamma(momentum, group):
    gen = torch.Generator().manual_seed(group)
    size = 1000
    phis = [torch.randn(size, generator=gen) for _ in range(group)]
    thetas = [p + 0.1 * torch.randn(size, generator=gen) for p in phis]
    delta0 = 0.05 * torch.randn(size, generator=gen)
    for beta in (0.7, 0.3):
        general_phi, general_delta = phis[0].clone(), delta0.clone()
        mean_pseudo, mean_phi = group_means(thetas[0], phis[0], [torch.cat([t, p]) for t, p in zip(thetas[1:], phis[1:])],
                                            fast=False)
        noloco_step(general_phi, general_delta, mean_pseudo_grad=mean_pseudo, mean_phi=mean_phi, alpha=0.5, beta=beta,
                    gamma=beta, momentum=momentum)
        fast_phi, fast_delta = phis[0].clone(), delta0.clone()
        mean_theta, _ = group_means(thetas[0], None, thetas[1:], fast=True)
        noloco_step_fast(fast_phi, fast_delta, mean_theta=mean_theta, alpha=0.5, beta=beta, momentum=momentum)
        torch.testing.assert_close(fast_phi, general_phi, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fast_delta, general_delta, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(fast_phi, phis[0])  # the step did something


@pytest.mark.parametrize("momentum, nesterov", [("heavy_ball", False), ("lookahead", True)])
def test_all_replicas_and_gamma_zero_is_diloco(momentum, nesterov):
    """G = all M replicas and γ = 0: NoLoCo's step is DiLoCo's SGD step (torch.optim.SGD), α = momentum, β = lr."""
    gen = torch.Generator().manual_seed(7)
    replicas, size, lr, mu = 4, 500, 0.7, 0.9
    phi0 = torch.randn(size, generator=gen)
    noloco_phis = [phi0.clone() for _ in range(replicas)]
    noloco_deltas = [torch.zeros(size) for _ in range(replicas)]
    diloco = DiLoCoOuter(phi0.clone(), lr=lr, momentum=mu, nesterov=nesterov)
    for _ in range(6):
        # every replica trains from the (shared) slow weights to its own fast weights
        thetas = [diloco.phi.data - 0.05 * torch.randn(size, generator=gen) for _ in range(replicas)]
        pseudo = torch.stack([diloco.phi.data - t for t in thetas]).mean(0)
        expected = diloco.step(pseudo).clone()
        messages = [torch.cat([thetas[j], noloco_phis[j]]) for j in range(replicas)]  # sent before anyone updates
        for i in range(replicas):
            others = [messages[j] for j in range(replicas) if j != i]
            mean_pseudo, mean_phi = group_means(thetas[i], noloco_phis[i], others, fast=False)
            noloco_step(noloco_phis[i], noloco_deltas[i], mean_pseudo_grad=mean_pseudo, mean_phi=mean_phi,
                        alpha=mu, beta=lr, gamma=0.0, momentum=momentum)
        for i in range(replicas):
            torch.testing.assert_close(noloco_phis[i], expected, rtol=1e-5, atol=1e-5)
        # and Δ is −lr times SGD's momentum buffer
        torch.testing.assert_close(noloco_deltas[0], -lr * diloco.momentum_buffer(), rtol=1e-5, atol=1e-5)


def test_heavy_ball_and_lookahead_differ():
    phi_i, theta_i, delta_i, _, theta_j = _pair()
    mean_theta, _ = group_means(theta_i, None, [theta_j], fast=True)
    a, b = phi_i.clone(), phi_i.clone()
    noloco_step_fast(a, delta_i.clone(), mean_theta=mean_theta, alpha=0.5, beta=0.7, momentum="heavy_ball")
    noloco_step_fast(b, delta_i.clone(), mean_theta=mean_theta, alpha=0.5, beta=0.7, momentum="lookahead")
    assert not torch.allclose(a, b)
