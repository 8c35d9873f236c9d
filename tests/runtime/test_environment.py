"""What a result file records about the machine it was measured on."""

from __future__ import annotations

import os
import platform
from importlib import metadata

import torch

from swarmlm.runtime.environment import cpu_model, describe_environment


def test_cpu_model_reads_the_model_name_line_of_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu\n\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 9R14\n")
    assert cpu_model(info) == "AMD EPYC 9R14"


def test_cpu_model_falls_back_to_platform_without_cpuinfo(tmp_path):
    expected = platform.processor() or platform.machine() or "unknown"
    assert cpu_model(tmp_path / "missing") == expected
    empty = tmp_path / "empty"
    empty.write_text("processor\t: 0\nmodel name\t:   \n")
    assert cpu_model(empty) == expected


def test_environment_names_this_machine_and_the_installed_versions():
    env = describe_environment()
    assert env["cpu"] == cpu_model() and env["cpu_count"] == os.cpu_count()
    assert env["torch"] == metadata.version("torch") and torch.__version__.startswith(env["torch"])
    assert env["transformers"] == metadata.version("transformers")
    assert env["reasoning-gym"] == metadata.version("reasoning-gym")
    assert env["torch_threads"] == torch.get_num_threads()
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["python"] == platform.python_version()
