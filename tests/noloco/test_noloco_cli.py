"""The ``swarmlm noloco train`` command line: flags from the config, readable errors, the learning-rate schedule."""

from __future__ import annotations

import math

import pytest

from swarmlm.cli import build_parser, main
from swarmlm.config import config_from_args
from swarmlm.noloco.config import TrainConfig
from swarmlm.noloco.replica import lr_factor


def test_flags_reach_the_config():
    args = build_parser().parse_args(["noloco", "train", "--method", "diloco", "--replicas", "8", "--out", "x", "--inner.lr", "1e-3",
                                      "--noloco.momentum", "lookahead", "--exchange.timeout-s", "5", "--resume", "40",
                                      "--faults.stall-outer-steps", "[1, 3]"])
    config = config_from_args(TrainConfig, args)
    assert (config.method, config.replicas, config.out, config.inner.lr) == ("diloco", 8, "x", 1e-3)
    assert config.noloco.momentum == "lookahead" and config.exchange.timeout_s == 5 and config.resume == 40
    assert config.faults.stall_outer_steps == [1, 3]
    defaults = TrainConfig()
    assert (defaults.noloco.alpha, defaults.noloco.beta, defaults.noloco.gamma, defaults.noloco.group_size) == (0.5, 0.7, 0.7, 2)
    assert (defaults.diloco.lr, defaults.diloco.momentum, defaults.diloco.nesterov) == (0.7, 0.9, True)


@pytest.mark.parametrize("argv, message", [
    (["--method", "allreduce"], "allowed values: 'noloco', 'diloco', 'ddp'"),
    (["--noloco.momentum", "nesterov"], "allowed values: 'heavy_ball', 'lookahead'"),
    (["--noloco.leftover", "drop"], "allowed values: 'join', 'wait'"),
    (["--steps", "10", "--stop-after", "20"], "stop_after"),
    (["--replicas", "2", "--noloco.group-size", "3"], "group_size"),
    (["--inner.lr", "0"], "inner.lr"),
])
def test_mistakes_are_reported_by_name(capsys, argv, message):
    assert main(["noloco", "train", *argv]) == 2
    assert message in capsys.readouterr().err


def test_warmup_then_cosine():
    factors = [lr_factor(s, warmup=10, total=110, min_ratio=0.1) for s in range(111)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0) and factors[60] == pytest.approx(0.1 + 0.9 * 0.5)
    assert factors[110] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:]))
    assert math.isclose(lr_factor(5, warmup=0, total=10, min_ratio=0.0), 0.5)
