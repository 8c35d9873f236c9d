"""The outer steps, as pure tensor maths on flat fp32 vectors (no communication here).

NoLoCo's outer step (No-all-reduce Low Communication, arXiv 2506.10911), for replica i in group G, with slow
weights φ, fast weights θ and momentum Δ:

    u  = −β·mean_{j∈G}(φ_j − θ_j) − γ·(φ_i − mean_{j∈G} φ_j)
    Δ ← α·Δ + u
    φ ← φ + Δ               (heavy-ball, the reference code's form and our default)
    φ ← φ + α·Δ + u         (look-ahead / Nesterov form, optional)
    θ ← φ

When β = γ the update term collapses to u = β·(mean_{j∈G} θ_j − φ_i), so only θ has to travel.

DiLoCo's (Douillard et al., arXiv 2311.08105) is SGD with momentum on φ, fed the all-reduced pseudo-gradient
mean(φ − θ):
:class:`DiLoCoOuter` wraps ``torch.optim.SGD`` so that it is the same optimizer the DiLoCo paper uses.
With G = all replicas and γ = 0, NoLoCo's step is DiLoCo's heavy-ball step with α = momentum and
β = lr (Δ = −lr·buf); the tests check this numerically.
"""

from __future__ import annotations

from typing import Literal

import torch

Momentum = Literal["heavy_ball", "lookahead"]


def _apply(phi: torch.Tensor, delta: torch.Tensor, update: torch.Tensor, alpha: float, momentum: Momentum) -> None:
    delta.mul_(alpha).add_(update)
    if momentum == "heavy_ball":
        phi.add_(delta)
    elif momentum == "lookahead":
        phi.add_(delta, alpha=alpha).add_(update)
    else:  # pragma: no cover - validated by the config
        raise ValueError(f"unknown momentum form {momentum!r}")


def noloco_step(phi: torch.Tensor, delta: torch.Tensor, *, mean_pseudo_grad: torch.Tensor, mean_phi: torch.Tensor,
                alpha: float, beta: float, gamma: float, momentum: Momentum = "heavy_ball") -> torch.Tensor:
    """NoLoCo's general outer step, in place on ``phi`` and ``delta``; returns ``phi``.

    ``mean_pseudo_grad`` is mean over the group of (φ_j − θ_j); ``mean_phi`` is the group's mean φ.
    """
    update = mean_pseudo_grad.mul(-beta)
    update.add_(phi - mean_phi, alpha=-gamma)
    _apply(phi, delta, update, alpha, momentum)
    return phi


def noloco_step_fast(phi: torch.Tensor, delta: torch.Tensor, *, mean_theta: torch.Tensor, alpha: float, beta: float,
                     momentum: Momentum = "heavy_ball") -> torch.Tensor:
    """The β = γ form: Δ ← αΔ + β(mean_{j∈G} θ_j − φ_i); only θ was exchanged. In place; returns ``phi``."""
    update = (mean_theta - phi).mul_(beta)
    _apply(phi, delta, update, alpha, momentum)
    return phi


def group_means(own_theta: torch.Tensor, own_phi: torch.Tensor | None, received: list[torch.Tensor], fast: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Means over the group that answered (this replica plus ``received``), in fp32.

    Fast path: each message is θ_j, and the result is (mean θ, None).
    General form: each message is [θ_j, φ_j] concatenated, and the result is (mean(φ − θ), mean φ).
    """
    n = own_theta.numel()
    if fast:
        total = own_theta.detach().to(torch.float32, copy=True)
        for message in received:
            total.add_(message.to(torch.float32))
        return total.div_(len(received) + 1), None
    assert own_phi is not None
    sum_theta = own_theta.detach().to(torch.float32, copy=True)
    sum_phi = own_phi.detach().to(torch.float32, copy=True)
    for message in received:
        sum_theta.add_(message[:n].to(torch.float32))
        sum_phi.add_(message[n:].to(torch.float32))
    count = len(received) + 1
    mean_phi = sum_phi.div_(count)
    return mean_phi - sum_theta.div_(count), mean_phi


class DiLoCoOuter:
    """DiLoCo's outer optimizer: SGD with (Nesterov or heavy-ball) momentum on the fp32 slow weights φ."""

    def __init__(self, phi: torch.Tensor, *, lr: float, momentum: float, nesterov: bool):
        self.phi = torch.nn.Parameter(phi, requires_grad=False)
        self.optimizer = torch.optim.SGD([self.phi], lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0)

    def step(self, mean_pseudo_grad: torch.Tensor) -> torch.Tensor:
        """One outer step with the all-reduced mean of (φ − θ) as the gradient; returns the new φ."""
        self.phi.grad = mean_pseudo_grad.to(self.phi.dtype)
        self.optimizer.step()
        self.phi.grad = None
        return self.phi.data

    def momentum_buffer(self) -> torch.Tensor | None:
        """SGD's momentum buffer (None before the first step): all the state a checkpoint needs besides φ."""
        state = self.optimizer.state.get(self.phi, {})
        return state.get("momentum_buffer")

    def load_momentum_buffer(self, buffer: torch.Tensor) -> None:
        """Restore the momentum buffer from a checkpoint (a copy of ``buffer``)."""
        self.optimizer.state[self.phi]["momentum_buffer"] = buffer.clone()
