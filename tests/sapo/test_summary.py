"""The run summary's provenance line: the machine of the run and of its warm start."""

from __future__ import annotations

from swarmlm.sapo.summary import provenance_line


def test_provenance_line_names_the_run_machine_and_the_warm_starts():
    summary = {"environment": {"cpu": "AMD EPYC", "torch": "2.13.0", "torch_threads": 2},
               "warmstart": {"final_loss": 0.100558, "environment": {"cpu": "Intel Xeon"}}}
    assert provenance_line(summary) == ("machine: AMD EPYC, torch 2.13.0, 2 thread(s); "
                                        "warm start: final loss 0.1006, trained on Intel Xeon")


def test_provenance_line_without_a_warm_start_or_with_one_that_predates_the_record():
    base = {"environment": {"cpu": "AMD EPYC", "torch": "2.13.0", "torch_threads": 1}}
    assert provenance_line({**base, "warmstart": None}) == "machine: AMD EPYC, torch 2.13.0, 1 thread(s)"
    old = provenance_line({**base, "warmstart": {"final_loss": 0.2}})
    assert old.endswith("warm start: final loss 0.2000, trained on an unrecorded machine")


def test_a_run_names_its_warm_start_and_its_schedule(tmp_path, monkeypatch):
    """``--model.warmstart-schedule`` reaches the warm start the nodes begin from (its own cache entry), and the run's
    provenance reads back that warm start's settings and the machine it was trained on."""
    from swarmlm.runtime.environment import cpu_model
    from swarmlm.sapo.config import SimulateConfig
    from swarmlm.sapo.node import initial_model_path
    from swarmlm.sapo.summary import provenance

    monkeypatch.setenv("SWARMLM_CACHE", str(tmp_path))
    base = {"model": {"warmstart_steps": 2}, "tasks": {"eval_size": 2}}
    constant = initial_model_path(SimulateConfig.model_validate(base), progress=False)
    cosine = initial_model_path(SimulateConfig.model_validate({**base, "model": {"warmstart_steps": 2, "warmstart_schedule": "cosine"}}),
                                progress=False)
    assert constant != cosine
    for path, schedule in ((constant, "constant"), (cosine, "cosine")):
        record = provenance(path)
        assert record["initial_model"] == path
        assert record["warmstart"]["config"]["schedule"] == schedule and record["warmstart"]["config"]["steps"] == 2
        assert record["warmstart"]["environment"]["cpu"] == cpu_model() == record["environment"]["cpu"]
    assert provenance(str(tmp_path / "not-a-warm-start"))["warmstart"] is None
