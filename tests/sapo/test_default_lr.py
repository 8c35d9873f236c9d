"""A node's learning rate without ``--grpo.lr`` follows what its weights are: a preset, or a directory that holds a
preset's warm start, trains at the presets' rate; any other model (a pretrained directory, a hub id) at the
pretrained models' rate."""

from __future__ import annotations

from swarmlm.models import build_preset
from swarmlm.sapo.config import SAPOConfig
from swarmlm.sapo.node import PRESET_LR, PRETRAINED_LR, SAPONode, default_lr
from swarmlm.sapo.transports.in_process import InProcessHub
from swarmlm.sapo.warmstart import WarmstartConfig, warmstart


def test_a_presets_warm_start_directory_trains_at_the_presets_rate(tmp_path):
    warm = warmstart(WarmstartConfig(model="tiny-qwen2", steps=2, batch_size=2), progress=False)
    plain = tmp_path / "plain"
    built = build_preset("tiny-qwen2")
    built.model.save_pretrained(plain)
    built.tokenizer.save_pretrained(plain)
    assert default_lr("tiny-qwen2") == PRESET_LR
    assert default_lr(str(warm)) == PRESET_LR  # the same weights as the preset's warm start
    assert default_lr(str(plain)) == PRETRAINED_LR  # no warm-start record: not known to be a preset's
    assert default_lr("someone/some-model") == PRETRAINED_LR
    assert default_lr(str(tmp_path / "model.gguf")) == PRETRAINED_LR
    (plain / "warmstart.json").write_text('{"config": {"model": "not-a-preset"}}')
    assert default_lr(str(plain)) == PRETRAINED_LR
    (plain / "warmstart.json").write_text("not json")
    assert default_lr(str(plain)) == PRETRAINED_LR

    (plain / "warmstart.json").unlink()
    cases = ((str(warm), None, PRESET_LR), (str(plain), None, PRETRAINED_LR), (str(warm), 3e-5, 3e-5))
    hub = InProcessHub(len(cases))
    for k, (name, given, expected) in enumerate(cases):
        config = SAPOConfig(model={"name": name, "warmstart": "never"}, tasks={"eval_size": 2},
                            grpo={"lr": given}, rounds=1)
        node = SAPONode(config, k, hub.endpoint(f"node-{k}"), tmp_path / f"node-{k}", name, resume=False,
                        tensorboard=False)
        try:
            assert node.lr == expected, (name, given)
        finally:
            node.close()
