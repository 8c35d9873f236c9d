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
