"""Pre-training data: the offline builtin corpus, local files, streaming, shards and resumable order."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from swarmlm.models import build_byte_tokenizer
from swarmlm.noloco.config import DataSection
from swarmlm.noloco.data import (
    ShardSampler,
    StreamSampler,
    builtin_documents,
    hf_validation_tokens,
    is_validation,
    prepare_local,
    replica_data,
    validation_batches,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def test_builtin_corpus_is_real_text_cached_once(tokenizer):
    config = DataSection()
    directory = prepare_local(config, tokenizer)
    meta = json.loads((directory / "meta.json").read_text())
    assert meta["train_tokens"] > 1_000_000 and meta["val_tokens"] > 10_000
    stamp = (directory / "train.npy").stat().st_mtime_ns
    assert prepare_local(config, tokenizer) == directory  # cached: not rebuilt
    assert (directory / "train.npy").stat().st_mtime_ns == stamp
    train = np.load(directory / "train.npy", mmap_mode="r")
    text = tokenizer.decode(np.asarray(train[:20_000]).tolist())
    for word in (" the ", " of ", " return", " is "):
        assert word in text
    # held-out documents are decided by name, so no document is in both splits
    names = [name for name, _ in builtin_documents()]
    val = [n for n in names if is_validation(n, config.val_fraction)]
    assert 0 < len(val) < len(names) // 10
    assert train.dtype == np.uint16 and int(np.max(train[:100_000])) < len(tokenizer)


def test_local_txt_jsonl_parquet(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "txt").mkdir()
    for i in range(30):
        (tmp_path / "txt" / f"doc{i}.txt").write_text(f"plain text document number {i}. " * 20)
    with open(tmp_path / "a.jsonl", "w") as fh:
        for i in range(40):
            fh.write(json.dumps({"body": f"json line {i} " * 10, "id": i}) + "\n")
    pq.write_table(pa.table({"body": [f"parquet row {i} " * 10 for i in range(40)]}), tmp_path / "b.parquet")

    directory = prepare_local(DataSection(source=str(tmp_path / "txt"), val_fraction=0.2), tokenizer)
    meta = json.loads((directory / "meta.json").read_text())
    assert meta["train_docs"] + meta["val_docs"] == 30 and meta["val_docs"] >= 1
    both = DataSection(source=f"{tmp_path / 'a.jsonl'}, {tmp_path / '*.parquet'}", text_field="body", val_fraction=0.1)
    directory = prepare_local(both, tokenizer)
    meta = json.loads((directory / "meta.json").read_text())
    assert meta["train_docs"] + meta["val_docs"] == 80
    train = np.load(directory / "train.npy")
    decoded = tokenizer.decode(train.tolist())
    assert "json line" in decoded and "parquet row" in decoded
    assert int((train == tokenizer.eos_token_id).sum()) == meta["train_docs"]  # EOS after every document

    with pytest.raises(KeyError, match="text_field"):
        prepare_local(DataSection(source=str(tmp_path / "a.jsonl")), tokenizer)
    with pytest.raises(FileNotFoundError):
        prepare_local(DataSection(source=str(tmp_path / "missing.txt")), tokenizer)
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(ValueError, match="unsupported"):
        prepare_local(DataSection(source=str(tmp_path / "x.csv")), tokenizer)


def test_shard_sampler_is_deterministic_disjoint_and_resumable():
    tokens = np.arange(10_000, dtype=np.uint16)
    make = lambda replica, seed=0: ShardSampler(tokens, replica=replica, num_replicas=4, seq_len=16, batch_size=5, seed=seed)
    a, b = make(0), make(0)
    for _ in range(3):
        assert torch.equal(a.next_batch(), b.next_batch())
    # replicas read their own contiguous shard
    seen = [set(torch.cat([make(r).next_batch() for _ in range(40)]).flatten().tolist()) for r in range(4)]
    for r in range(4):
        assert min(seen[r]) >= r * 2500 and max(seen[r]) < (r + 1) * 2500
    # the order depends on the seed, and an epoch visits every sequence once
    assert not torch.equal(make(1, seed=0).next_batch(), make(1, seed=1).next_batch())
    sampler = make(2)
    starts = torch.cat([sampler.next_batch()[:, 0] for _ in range(sampler.num_sequences // 5)])
    assert len(set(starts.tolist())) == len(starts) == sampler.num_sequences // 5 * 5
    # resuming from a position gives the same next batches, across an epoch boundary too
    sampler = make(3)
    for _ in range(29):
        sampler.next_batch()
    state = sampler.state_dict()
    expected = [sampler.next_batch() for _ in range(4)]
    resumed = make(3)
    resumed.load_state_dict(state)
    for want in expected:
        assert torch.equal(resumed.next_batch(), want)


def test_validation_batches_are_fixed():
    val = np.arange(1000, dtype=np.uint16)
    batches = validation_batches(val, seq_len=10, batch_size=4, num_batches=3)
    assert [b.shape for b in batches] == [(4, 10)] * 3
    assert batches[0][0, 0] == 0 and batches[2][-1, -1] == 119
    with pytest.raises(ValueError):
        validation_batches(val[:5], seq_len=10, batch_size=4, num_batches=1)


def test_streaming_source_shares_documents_and_resumes(tmp_path, tokenizer):
    with open(tmp_path / "stream.jsonl", "w") as fh:
        for i in range(60):
            fh.write(json.dumps({"text": f"streamed document {i:03d} " + "word " * 30}) + "\n")
    config = DataSection(source="hf:json", hf_data_files=str(tmp_path / "stream.jsonl"), hf_val_docs=5)
    val = hf_validation_tokens(config, tokenizer)
    val_text = tokenizer.decode(val.tolist())
    assert "document 000" in val_text and "document 004" in val_text and "document 005" not in val_text

    def sampler(replica):
        return StreamSampler(config, tokenizer, replica=replica, num_replicas=2, seq_len=32, batch_size=4)

    first, second = sampler(0), sampler(1)
    text0 = tokenizer.decode(torch.cat([first.next_batch() for _ in range(3)]).flatten().tolist())
    text1 = tokenizer.decode(torch.cat([second.next_batch() for _ in range(3)]).flatten().tolist())
    docs0 = {int(x[:3]) for x in text0.split("document ")[1:] if x[:3].isdigit()}
    docs1 = {int(x[:3]) for x in text1.split("document ")[1:] if x[:3].isdigit()}
    assert docs0 and docs1 and not docs0 & docs1  # each replica reads its own documents
    assert min(docs0 | docs1) >= 5  # the held-out documents are not trained on
    state = first.state_dict()
    expected = [first.next_batch() for _ in range(3)]
    resumed = sampler(0)
    resumed.load_state_dict(state)
    for want in expected:
        assert torch.equal(resumed.next_batch(), want)
    data = replica_data(config, tokenizer, replica=1, num_replicas=2, seq_len=32, batch_size=4, seed=0)
    assert data.sampler.next_batch().shape == (4, 32) and len(data.val_tokens) == len(val)
