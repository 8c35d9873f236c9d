"""matplotlib is optional for swarmlm (the ``plots`` extra; only the experiments import it): the commands that draw
plots say so at once when it is missing, before any training or measuring."""

from __future__ import annotations

import sys

import pytest

from swarmlm.cli import build_parser, main

PLOTTING = [["noloco", "sync-bench"], ["noloco", "compare"], ["sapo", "experiment"]]


@pytest.mark.parametrize("command", PLOTTING, ids=" ".join)
def test_a_missing_matplotlib_is_a_clear_error_before_anything_runs(command, tmp_path, monkeypatch, capsys):
    build_parser()  # the configs' imports first (reasoning-gym's own dependencies may use matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    out = tmp_path / "out"
    assert main([*command, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "pip install 'swarmlm[plots]'" in err
    assert not out.exists()
