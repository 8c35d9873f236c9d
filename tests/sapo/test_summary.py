"""What a run prints at its end: the per-node table, the sharing line, and the provenance line (the machine of
the run and of its warm start)."""

from __future__ import annotations

from swarmlm.sapo.summary import provenance_line, sharing_line, summary_table


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
    # a format warm-up that found the format already there trained nothing, and records no loss
    lossless = provenance_line({**base, "warmstart": {"environment": {"cpu": "Intel Xeon"}}})
    assert lossless.endswith("warm start: no final loss recorded, trained on Intel Xeon")


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


def _node(start, end, reward, last, lowest):
    return {"first_eval_pass1": start, "final_eval_pass1": end, "cumulative_reward_own": reward,
            "final_format_rate": last, "min_format_rate": lowest}


def test_summary_table_has_a_row_per_node_and_their_mean():
    summary = {"nodes": {"node-0": _node(0.25, 0.375, 30.0, 1.0, 0.75), "node-1": _node(0.25, 0.3125, 28.5, 0.875, 0.5)},
               "total_cumulative_reward_own": 58.5}
    lines = summary_table(summary).splitlines()
    assert lines[2] == "| node-0 | 0.250 | 0.375 | +0.125 | 30.00 | 1.00 / 0.75 |"
    assert lines[3] == "| node-1 | 0.250 | 0.312 | +0.062 | 28.50 | 0.88 / 0.50 |"
    assert lines[4] == "| mean | 0.250 | 0.344 | +0.094 | 29.25 | |"
    # a lone node: its own row only; a node without evaluations: dashes
    lone = summary_table({"nodes": {"QmPeer": _node(None, None, 3.0, None, None)}, "total_cumulative_reward_own": 3.0})
    assert lone.splitlines()[2:] == ["| QmPeer | — | — | — | 3.00 | — / — |"]


def test_sharing_line_counts_records_by_reason_and_the_transport_share():
    summary = {"records_accepted": 120, "records_dropped": 7, "drops": {"bad_signature": 2, "duplicate": 5},
               "transport_fraction": 0.0125, "transport_wait_fraction": 0.01, "transport_io_fraction": 0.0025}
    assert sharing_line(summary) == ("records: 120 accepted, 7 dropped (duplicate 5, bad_signature 2); "
                                     "transport 1.2% of round time (waiting 1.0%, DHT work 0.2%)")
    assert sharing_line({"records_accepted": 0, "records_dropped": 0, "drops": {}}) == "records: 0 accepted, 0 dropped"
