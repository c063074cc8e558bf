"""LAMB and LARS against their published update rules, computed by hand for two-element tensors."""

from __future__ import annotations

import math

import pytest
import torch

from phalanx_trainer.optim import Lamb, Lars

pytestmark = pytest.mark.unit


def norm(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values))


def test_lamb_first_step_follows_algorithm_2() -> None:
    # You et al. 2019: m, v as Adam with bias correction; r = m^ / (sqrt(v^) + eps); u = r + wd w;
    # w <- w - lr * (||w|| / ||u||) * u.
    w, g = [1.0, -2.0], [0.5, 0.5]
    lr, b1, b2, eps, wd = 0.1, 0.9, 0.999, 1e-6, 0.01
    m_hat = [(1 - b1) * x / (1 - b1) for x in g]
    v_hat = [(1 - b2) * x * x / (1 - b2) for x in g]
    u = [m / (math.sqrt(v) + eps) + wd * p for m, v, p in zip(m_hat, v_hat, w, strict=True)]
    trust = norm(w) / norm(u)
    expected = [p - lr * trust * x for p, x in zip(w, u, strict=True)]
    assert expected == pytest.approx([0.8395207, -2.1557126], abs=1e-6)  # the same numbers by calculator

    param = torch.nn.Parameter(torch.tensor(w, dtype=torch.float64))
    param.grad = torch.tensor(g, dtype=torch.float64)
    Lamb([param], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd).step()
    assert param.detach().tolist() == pytest.approx(expected, abs=1e-12)


def test_lamb_second_step_uses_bias_corrected_moments() -> None:
    lr, b1, b2, eps = 0.05, 0.9, 0.99, 1e-8
    w, grads = [0.3, 0.4], ([1.0, 0.0], [0.0, 2.0])
    m, v = [0.0, 0.0], [0.0, 0.0]
    for t, g in enumerate(grads, start=1):
        m = [b1 * a + (1 - b1) * x for a, x in zip(m, g, strict=True)]
        v = [b2 * a + (1 - b2) * x * x for a, x in zip(v, g, strict=True)]
        u = [(a / (1 - b1**t)) / (math.sqrt(b / (1 - b2**t)) + eps) for a, b in zip(m, v, strict=True)]
        trust = norm(w) / norm(u)
        w = [p - lr * trust * x for p, x in zip(w, u, strict=True)]

    param = torch.nn.Parameter(torch.tensor([0.3, 0.4], dtype=torch.float64))
    optimizer = Lamb([param], lr=lr, betas=(b1, b2), eps=eps)
    for g in grads:
        param.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
    assert param.detach().tolist() == pytest.approx(w, abs=1e-12)


def test_lars_follows_algorithm_1_for_two_steps() -> None:
    # You et al. 2017: local_lr = eta ||w|| / (||g|| + wd ||w||); v <- m v + lr local_lr (g + wd w); w <- w - v.
    lr, momentum, wd, eta = 0.1, 0.9, 0.01, 0.001
    w, g = [3.0, 4.0], [0.6, 0.8]
    first_local = eta * 5.0 / (1.0 + wd * 5.0)
    assert first_local == pytest.approx(0.0047619, abs=1e-7)
    velocity = [0.0, 0.0]
    for _ in range(2):
        local = eta * norm(w) / (norm(g) + wd * norm(w))
        velocity = [momentum * a + lr * local * (x + wd * p) for a, x, p in zip(velocity, g, w, strict=True)]
        w = [p - a for p, a in zip(w, velocity, strict=True)]

    param = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    optimizer = Lars([param], lr=lr, momentum=momentum, weight_decay=wd, trust_coefficient=eta)
    for _ in range(2):
        param.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
    assert param.detach().tolist() == pytest.approx(w, abs=1e-12)
    assert param.detach().tolist()[0] < 3.0 - 0.0003  # two steps moved it beyond the first step's 3e-4


def test_zero_weights_fall_back_to_a_trust_ratio_of_one() -> None:
    param = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    param.grad = torch.tensor([1.0, -1.0], dtype=torch.float64)
    Lars([param], lr=0.5, momentum=0.0).step()
    assert param.detach().tolist() == pytest.approx([-0.5, 0.5])
