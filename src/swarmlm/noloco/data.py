"""Pre-training text: an offline default corpus, local files, or Hugging Face datasets streaming.

Sources (``data.source``):

- ``builtin``: real English text that every Python installation carries, so nothing is downloaded:
  the docstrings of the standard library's modules, classes and functions (one document per
  module) and the language-reference topics of ``pydoc_data`` (one document per topic), about
  2.3 MB with Python 3.11.
- local files: ``.txt`` (a file is a document), ``.jsonl`` (a line is a document, its ``text_field``),
  ``.parquet`` (a row is a document); a path, a directory, a glob, or several comma-separated.
- ``hf:NAME[:CONFIG]``: ``datasets.load_dataset(..., streaming=True)``, for example ``hf:allenai/c4:en``
  (imported only then, and needs network access).

Local sources are tokenized once, with EOS after every document, and cached as ``.npy`` under
``$SWARMLM_CACHE/noloco-data/<key>/`` (key: the source's files, the tokenizer, the split). Documents
are assigned to the held-out validation split by a hash of their name, so the split is stable and no
document is in both. Each replica trains on its own contiguous shard of the training tokens, read in
an order drawn from (seed, replica, epoch): a batch is a pure function of its position, so resuming
needs only the position. Streaming sources give every replica its own share of the documents
(``split_dataset_by_node``) and resume from the ``datasets`` iterator state.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import logging
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from swarmlm.noloco.config import DataSection
from swarmlm.runtime.cache import cache_root, file_lock

log = logging.getLogger(__name__)


DATA_VERSION = 1  # bump when tokenization or the builtin corpus changes, so old caches are not reused
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


# ----- documents

def builtin_documents() -> Iterator[tuple[str, str]]:
    """(name, text) of the builtin corpus: stdlib docstrings per module, then pydoc topics."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_DIRS.intersection(rel.parts):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        parts = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    parts.append(doc)
        if parts:
            module = ".".join(rel.with_suffix("").parts)
            yield f"stdlib:{module}", module + "\n\n" + "\n\n".join(parts)
    try:
        from pydoc_data import topics
    except ImportError:  # pragma: no cover - some distributions strip it
        return
    for name in sorted(topics.topics):
        yield f"pydoc:{name}", topics.topics[name]


def builtin_fingerprint() -> str:
    return f"python-{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"


def local_files(source: str) -> list[Path]:
    """The data files named by ``source`` (files, directories, globs; comma-separated)."""
    found: list[Path] = []
    for item in (s.strip() for s in source.split(",")):
        if not item:
            continue
        path = Path(item).expanduser()
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl", ".parquet")))
        elif any(c in item for c in "*?["):
            found.extend(sorted(Path(p) for p in glob.glob(str(path), recursive=True)))
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"data source '{item}' is not a file, directory or glob that matches anything")
    bad = [p for p in found if p.suffix not in (".txt", ".jsonl", ".parquet")]
    if bad:
        raise ValueError(f"unsupported data file type: {bad[0]} (use .txt, .jsonl or .parquet)")
    if not found:
        raise FileNotFoundError(f"data source '{source}' matched no .txt, .jsonl or .parquet file")
    return found


def file_documents(files: list[Path], text_field: str) -> Iterator[tuple[str, str]]:
    for path in files:
        if path.suffix == ".txt":
            yield str(path), path.read_text(errors="replace")
        elif path.suffix == ".jsonl":
            with open(path, errors="replace") as fh:
                for i, line in enumerate(fh):
                    if line.strip():
                        record = json.loads(line)
                        if text_field not in record:
                            raise KeyError(f"{path}:{i + 1} has no field '{text_field}' (set data.text_field)")
                        yield f"{path}:{i}", str(record[text_field])
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(path, columns=[text_field])
            for i, text in enumerate(table.column(text_field).to_pylist()):
                if text:
                    yield f"{path}:{i}", str(text)


def is_validation(name: str, val_fraction: float) -> bool:
    digest = int(hashlib.sha1(name.encode()).hexdigest()[:8], 16)
    return digest % 100_000 < val_fraction * 100_000


# ----- tokenization and cache

def tokenizer_fingerprint(tokenizer: Any) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    blob = json.dumps([type(tokenizer).__name__, vocab, tokenizer.eos_token_id])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _dtype_for(tokenizer: Any) -> np.dtype:
    return np.dtype(np.uint16) if len(tokenizer) <= np.iinfo(np.uint16).max else np.dtype(np.uint32)


def tokenize_documents(docs: list[str], tokenizer: Any, dtype: np.dtype) -> np.ndarray:
    """Concatenate the documents' tokens, EOS after each."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token")
    chunks: list[np.ndarray] = []
    for start in range(0, len(docs), 256):
        batch = docs[start:start + 256]
        for ids in tokenizer(batch, add_special_tokens=False, verbose=False)["input_ids"]:
            chunks.append(np.asarray(ids + [eos], dtype=dtype))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)


def _cache_key(config: DataSection, tokenizer: Any) -> tuple[str, list[Path] | None]:
    if config.source == "builtin":
        files, sources = None, builtin_fingerprint()
    else:
        files = local_files(config.source)
        sources = [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    blob = json.dumps({"v": DATA_VERSION, "source": config.source, "files": sources, "field": config.text_field,
                       "val": config.val_fraction, "tok": tokenizer_fingerprint(tokenizer)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16], files


def prepare_local(config: DataSection, tokenizer: Any) -> Path:
    """Tokenize a local source (or the builtin corpus) once; return its cache directory."""
    key, files = _cache_key(config, tokenizer)
    directory = cache_root() / "noloco-data" / key
    if (directory / "meta.json").exists():
        return directory
    with file_lock(cache_root() / "noloco-data" / f".{key}.lock"):
        if (directory / "meta.json").exists():
            return directory
        docs = builtin_documents() if files is None else file_documents(files, config.text_field)
        train_docs: list[str] = []
        val_docs: list[str] = []
        for name, text in docs:
            (val_docs if is_validation(name, config.val_fraction) else train_docs).append(text)
        if not val_docs and len(train_docs) > 1:
            val_docs.append(train_docs.pop())
        if not train_docs or not val_docs:
            raise ValueError(f"data source '{config.source}' needs at least two documents (one is held out)")
        dtype = _dtype_for(tokenizer)
        train = tokenize_documents(train_docs, tokenizer, dtype)
        val = tokenize_documents(val_docs, tokenizer, dtype)
        tmp = directory.with_name(directory.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        np.save(tmp / "train.npy", train)
        np.save(tmp / "val.npy", val)
        meta = {"source": config.source, "train_docs": len(train_docs), "val_docs": len(val_docs),
                "train_tokens": int(train.size), "val_tokens": int(val.size), "dtype": dtype.name}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if directory.exists():
            import shutil

            shutil.rmtree(directory)
        os.replace(tmp, directory)
        log.info("tokenized %s: %d train tokens, %d validation tokens -> %s", config.source, train.size, val.size, directory)
    return directory


# ----- samplers

class ShardSampler:
    """Batches of ``seq_len`` tokens from this replica's contiguous shard of ``tokens``.

    Sequences start at multiples of ``seq_len`` within the shard; each epoch visits all of them in an
    order drawn from (seed, replica, epoch). ``position`` counts sequences handed out so far.
    """

    def __init__(self, tokens: np.ndarray, *, replica: int, num_replicas: int, seq_len: int, batch_size: int, seed: int):
        start = len(tokens) * replica // num_replicas
        stop = len(tokens) * (replica + 1) // num_replicas
        self.shard = tokens[start:stop]
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.replica = replica
        self.num_sequences = len(self.shard) // seq_len
        if self.num_sequences < 1:
            raise ValueError(f"replica {replica}'s shard has {len(self.shard)} tokens, fewer than one sequence of {seq_len}: "
                             "use more data, fewer replicas or a shorter seq_len")
        self.position = 0
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.replica, epoch, 0xDA7A]))
            self._orders = {epoch: rng.permutation(self.num_sequences)}
        return self._orders[epoch]

    def next_batch(self) -> torch.Tensor:
        rows = []
        for _ in range(self.batch_size):
            epoch, index = divmod(self.position, self.num_sequences)
            begin = int(self._order(epoch)[index]) * self.seq_len
            rows.append(np.asarray(self.shard[begin:begin + self.seq_len], dtype=np.int64))
            self.position += 1
        return torch.from_numpy(np.stack(rows))

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class StreamSampler:
    """Batches packed from a streaming dataset's documents: this replica's share, in stream order.

    The position is the ``datasets`` iterator state (``IterableDataset.state_dict``) plus the tokens
    already read but not yet used, so a resumed replica continues with exactly the next tokens.
    """

    def __init__(self, config: DataSection, tokenizer: Any, *, replica: int, num_replicas: int, seq_len: int, batch_size: int):
        self.config = config
        self.tokenizer = tokenizer
        self.replica = replica
        self.num_replicas = num_replicas
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.epoch = 0
        self.buffer: list[int] = []
        self._stream_state: dict | None = None
        self._dataset = None
        self._iter: Iterator[dict] | None = None

    def _open(self) -> Iterator[dict]:
        from datasets.distributed import split_dataset_by_node

        ds = hf_stream(self.config, self.config.hf_split)
        if self.config.hf_val_split is None:
            ds = ds.skip(self.config.hf_val_docs)
        ds = split_dataset_by_node(ds, rank=self.replica, world_size=self.num_replicas)
        if self._stream_state is not None:
            ds.load_state_dict(self._stream_state)
        self._dataset = ds
        return iter(ds)

    def next_batch(self) -> torch.Tensor:
        need = self.batch_size * self.seq_len
        empty_epochs = 0
        while len(self.buffer) < need:
            if self._iter is None:
                self._iter = self._open()
            try:
                record = next(self._iter)
            except StopIteration:  # another epoch over this replica's share
                empty_epochs += 1
                if empty_epochs > 1:
                    raise ValueError(f"stream '{self.config.source}' gave replica {self.replica} no text") from None
                self.epoch += 1
                self._stream_state = None
                self._iter = None
                continue
            text = record.get(self.config.text_field)
            if text:
                empty_epochs = 0
                self.buffer.extend(self.tokenizer(str(text), add_special_tokens=False, verbose=False)["input_ids"])
                self.buffer.append(self.tokenizer.eos_token_id)
        batch, self.buffer = self.buffer[:need], self.buffer[need:]
        return torch.tensor(batch, dtype=torch.long).view(self.batch_size, self.seq_len)

    def state_dict(self) -> dict[str, Any]:
        stream = self._dataset.state_dict() if self._dataset is not None and self._iter is not None else self._stream_state
        return {"epoch": self.epoch, "stream": stream, "buffer": list(self.buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self._stream_state = state["stream"]
        self.buffer = [int(t) for t in state["buffer"]]
        self._iter = None
        self._dataset = None


def hf_stream(config: DataSection, split: str):
    try:
        import datasets
    except ImportError:  # pragma: no cover
        raise ImportError("hf: data sources need the 'datasets' package: pip install datasets") from None
    name, _, subset = config.source[len("hf:"):].partition(":")
    return datasets.load_dataset(name, subset or None, split=split, streaming=True, data_files=config.hf_data_files)


def hf_validation_tokens(config: DataSection, tokenizer: Any) -> np.ndarray:
    """The held-out validation text of a streaming source, tokenized (the same on every replica)."""
    ds = hf_stream(config, config.hf_val_split or config.hf_split)
    docs = [str(r[config.text_field]) for r in ds.take(config.hf_val_docs) if r.get(config.text_field)]
    if not docs:
        raise ValueError(f"stream '{config.source}' has no validation documents")
    return tokenize_documents(docs, tokenizer, _dtype_for(tokenizer))


# ----- what the trainer uses

@dataclass
class ReplicaData:
    sampler: ShardSampler | StreamSampler
    val_tokens: np.ndarray
    description: str


def prepare(config: DataSection, tokenizer: Any) -> None:
    """Build the cache (call once before starting workers; workers also call it, under a lock)."""
    if not config.source.startswith("hf:"):
        prepare_local(config, tokenizer)


def replica_data(config: DataSection, tokenizer: Any, *, replica: int, num_replicas: int, seq_len: int,
                 batch_size: int, seed: int) -> ReplicaData:
    if config.source.startswith("hf:"):
        sampler = StreamSampler(config, tokenizer, replica=replica, num_replicas=num_replicas, seq_len=seq_len,
                                batch_size=batch_size)
        return ReplicaData(sampler, hf_validation_tokens(config, tokenizer), f"{config.source} (streaming)")
    directory = prepare_local(config, tokenizer)
    train = np.load(directory / "train.npy", mmap_mode="r")
    val = np.load(directory / "val.npy", mmap_mode="r")
    sampler = ShardSampler(train, replica=replica, num_replicas=num_replicas, seq_len=seq_len, batch_size=batch_size, seed=seed)
    meta = json.loads((directory / "meta.json").read_text())
    return ReplicaData(sampler, val, f"{config.source}: {meta['train_tokens']} train / {meta['val_tokens']} val tokens")


def validation_batches(val_tokens: np.ndarray, *, seq_len: int, batch_size: int, num_batches: int) -> list[torch.Tensor]:
    """Fixed validation batches: consecutive ``seq_len`` windows from the start of the held-out tokens."""
    windows = len(val_tokens) // seq_len
    if windows < 1:
        raise ValueError(f"validation split has {len(val_tokens)} tokens, fewer than one sequence of {seq_len}")
    count = min(windows, batch_size * num_batches)
    rows = np.asarray(val_tokens[:count * seq_len], dtype=np.int64).reshape(count, seq_len)
    return [torch.from_numpy(rows[i:i + batch_size].copy()) for i in range(0, count, batch_size)]
