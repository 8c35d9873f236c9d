"""A SAPO node: its own policy, task stream and verifier, and one round of SAPO (Swarm sAmpling Policy
Optimization, arXiv 2509.08721).

A round has two halves so that a driver can interleave many nodes:

* :meth:`SAPONode.play` samples I questions, generates L completions each, scores them with the
  node's verifier and publishes the records;
* :meth:`SAPONode.learn` collects the other nodes' records, validates and re-scores them, picks J
  external groups, takes one GRPO update on the I + J groups (:mod:`swarmlm.sapo.update`), evaluates,
  logs and checkpoints.

The node owns its I/O (transport, metrics, checkpoints) and its evaluation; the update is
:class:`~swarmlm.sapo.update.GRPOUpdate`'s.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarmlm.models import PRESETS, load_model
from swarmlm.runtime.checkpoints import latest_checkpoint, load_optimizer_state, save_checkpoint
from swarmlm.runtime.devices import DTYPES, resolve_device
from swarmlm.runtime.metrics import MetricsWriter
from swarmlm.sapo.batching import TrainSample, with_eos
from swarmlm.sapo.config import SAPOConfig
from swarmlm.sapo.engines import make_engine
from swarmlm.sapo.engines.base import Generated, GenerationEngine, tokenize_prompts
from swarmlm.sapo.grpo import group_advantages
from swarmlm.sapo.records import DropCounter, RolloutRecord, decode_message, encode_message
from swarmlm.sapo.selection import ScoredGroup, select_external
from swarmlm.sapo.transports.base import RolloutTransport
from swarmlm.sapo.update import GRPOUpdate
from swarmlm.sapo.warmstart import WarmstartConfig, warmstart
from swarmlm.tasks import TaskSource, build_prompt, eval_questions, extract_answer

log = logging.getLogger(__name__)

PRESET_LR = 5e-5
PRETRAINED_LR = 1e-6


def initial_model_path(config: SAPOConfig, progress: bool = True) -> str:
    """What the node loads at round 0: the warm-started preset, or the configured model as is."""
    m = config.model
    if m.warmstart == "never" or (m.warmstart == "auto" and m.name not in PRESETS):
        return m.name
    ws = WarmstartConfig(model=m.name, tasks=config.tasks, steps=m.warmstart_steps, seed=m.warmstart_seed)
    return str(warmstart(ws, progress=progress))


def node_seed(base_seed: int, node_index: int) -> int:
    return base_seed * 1_000 + node_index


@dataclass
class OwnRollouts:
    """What a node generated in :meth:`SAPONode.play`, kept for :meth:`SAPONode.learn`."""

    round: int
    generated: list[Generated]
    rewards: list[list[float]]
    gen_seconds: float
    gen_tokens: int
    transport_seconds: float = 0.0
    global_round: int | None = None  # the swarm-wide round its records were published under


class SAPONode:
    """One node of the swarm. ``out_dir`` holds its metrics and checkpoints; it resumes from them."""

    def __init__(self, config: SAPOConfig, node_index: int, transport: RolloutTransport, out_dir: str | Path,
                 initial_model: str, *, resume: bool = True, tensorboard: bool = True):
        self.config = config
        self.index = node_index
        self.transport = transport
        self.node_id = transport.node_id
        self.out_dir = Path(out_dir)
        self.ckpt_dir = self.out_dir / "checkpoints"
        self.device = resolve_device(config.model.device)
        self.seed = node_seed(config.seed, node_index)
        checkpoint = latest_checkpoint(self.ckpt_dir) if resume else None
        source = str(checkpoint.model_dir) if checkpoint else initial_model
        loaded = load_model(source, seed=self.seed, dtype=DTYPES[config.model.dtype])
        self.model = loaded.model.to(self.device)
        self.model.train()
        self.tokenizer = loaded.tokenizer
        # what peers see in the records' ``model`` field: a short name, never a long local path
        self.model_name = Path(config.model.name.rstrip("/")).name[-64:] or "model"
        lr = config.grpo.lr or (PRESET_LR if config.model.name in PRESETS else PRETRAINED_LR)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.ref_model = None
        if config.grpo.beta > 0:
            self.ref_model = load_model(initial_model, seed=self.seed, dtype=DTYPES[config.model.dtype]).model.to(self.device)
            self.ref_model.eval().requires_grad_(False)
        self.tasks = TaskSource(config.tasks, node_seed=self.seed)
        self.eval_set = eval_questions(config.tasks)
        self.rng = random.Random(self.seed)
        self.drops = DropCounter()
        self.round = 0  # last completed round
        self.cumulative_reward_own = 0.0
        if checkpoint is not None:
            load_optimizer_state(checkpoint, self.optimizer)
            st = checkpoint.state
            self.round = checkpoint.step
            self.cumulative_reward_own = st.get("cumulative_reward_own", 0.0)
            self.tasks.load_state(st["tasks"])
            self.rng.setstate((st["rng"][0], tuple(st["rng"][1]), st["rng"][2]))
            self.drops.counts.update(st.get("drops", {}))
            log.info("%s resumed from %s (round %d)", self.node_id, checkpoint.path, self.round)
        self.updater = GRPOUpdate(self.model, self.optimizer, config.grpo, self.tokenizer.pad_token_id, self.ref_model)
        # generates the rollouts; an engine holding its own copy of the weights (vLLM) is synced after each update
        self.engine: GenerationEngine = make_engine(config.generation, self.model, self.tokenizer)
        self.metrics = MetricsWriter(self.out_dir, step_key="round", resume_from=self.round, tensorboard=tensorboard)

    # ------------------------------------------------------------------ helpers
    def _prompt_ids(self, questions: list[str]) -> list[list[int]]:
        style = self.config.generation.prompt_style
        prompts = [build_prompt(q, self.tokenizer, style) for q in questions]
        return tokenize_prompts(self.tokenizer, prompts, self.config.generation.max_prompt_tokens)

    def _score_texts(self, family: str, entry: dict[str, Any], texts: list[str]) -> list[float]:
        scores = [self.tasks.score(family, extract_answer(t), entry) for t in texts]
        return [s if math.isfinite(s) else 0.0 for s in scores]  # a NaN would poison the whole update

    def _training_rewards(self, texts: list[str], scores: list[float]) -> list[float]:
        """The rewards the update sees: the task scores, plus ``grpo.format_reward`` for a well-formed answer."""
        bonus = self.config.grpo.format_reward
        if bonus == 0:
            return scores
        return [s + bonus * (extract_answer(t) is not None) for t, s in zip(texts, scores)]

    def _strip_special(self, text: str) -> str:
        """Peer text with this tokenizer's special-token strings removed, so that no peer can inject
        control tokens (EOS, padding, chat-template markers) into what this node trains on."""
        for special in self.tokenizer.all_special_tokens:
            text = text.replace(special, "")
        return text

    # ------------------------------------------------------------------ round, first half
    def play(self, round: int) -> OwnRollouts:
        """Sample I questions, generate L completions each, score them, publish them."""
        g = self.config.generation
        questions = self.tasks.sample(self.config.local)
        torch.manual_seed(self.seed * 100_003 + round)  # the round's samples do not depend on other nodes' work
        started = time.perf_counter()
        generated = self.engine.generate(
            self._prompt_ids([q.question for q in questions]),
            num_completions=g.group_size, max_new_tokens=g.max_new_tokens, temperature=g.temperature, max_batch=g.max_batch)
        gen_seconds = time.perf_counter() - started
        rewards = [self._score_texts(q.family, q.entry, gen.texts) for q, gen in zip(questions, generated)]
        own = OwnRollouts(round, generated, rewards, gen_seconds,
                          gen_tokens=sum(len(c) + f for gen in generated for c, f in zip(gen.completion_ids, gen.finished)))
        own.global_round = self.transport.global_round(round)  # records are keyed by the swarm's round, not a local count
        records = [RolloutRecord(self.node_id, own.global_round, q.family, q.question, q.answer, q.metadata, gen.texts,
                                 self.model_name) for q, gen in zip(questions, generated)]
        started = time.perf_counter()
        self.transport.publish(own.global_round, encode_message(records))
        own.transport_seconds = time.perf_counter() - started
        return own

    # ------------------------------------------------------------------ round, second half
    def collect_external(self, round: int) -> tuple[list[ScoredGroup], dict[str, Any]]:
        """Other nodes' valid records for ``round``, re-scored with this node's verifier."""
        round = self.transport.global_round(round)
        before = self.drops.total()  # the transport may count drops of its own while collecting
        started = time.perf_counter()
        messages = self.transport.collect(round, self.config.sharing.collect_timeout)
        seconds = time.perf_counter() - started
        pool: list[ScoredGroup] = []
        received = 0
        for msg in messages:
            records = decode_message(msg.payload, self.config.sharing.limits, sender=msg.sender, rounds=(round - self.config.sharing.staleness_rounds, round + self.transport.future_rounds),
                                     known_family=self.tasks.can_score, drops=self.drops)
            received += len(records)
            for rec in records:
                try:
                    scores = self._score_texts(rec.family, rec.entry, rec.completions)
                except Exception as err:  # a peer's metadata our verifier cannot use
                    self.drops.drop("unscorable", msg.sender, f"{type(err).__name__}: {str(err)[:60]}")
                    continue
                pool.append(ScoredGroup(rec, self._training_rewards(rec.completions, scores), scores))
        info = {"peers_heard": len({m.sender for m in messages}), "records_accepted": len(pool),
                "accepted_sources": dict(Counter(g.record.node_id for g in pool)),
                "records_dropped": self.drops.total() - before, "transport_seconds": seconds, "records_received": received}
        return pool, info

    def _samples(self, own: OwnRollouts, external: list[ScoredGroup]) -> list[TrainSample]:
        eos, max_new = self.tokenizer.eos_token_id, self.config.generation.max_new_tokens
        samples = []
        own_rewards = [self._training_rewards(gen.texts, r) for gen, r in zip(own.generated, own.rewards)]
        own_adv = group_advantages(torch.tensor(own_rewards, dtype=torch.float64)).tolist() if own_rewards else []
        for gen, advs in zip(own.generated, own_adv):
            for ids, a in zip(gen.completion_ids, advs):
                samples.append(TrainSample(gen.prompt_ids, with_eos(ids, eos, max_new), a))
        if external:
            prompt_ids = self._prompt_ids([self._strip_special(grp.record.question) for grp in external])
            for grp, p_ids in zip(external, prompt_ids):
                advs = group_advantages(torch.tensor([grp.rewards], dtype=torch.float64))[0].tolist()
                texts = [self._strip_special(c) for c in grp.record.completions]
                comp = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
                for ids, a in zip(comp, advs):
                    samples.append(TrainSample(p_ids, with_eos(ids, eos, max_new), a, external=True))
        return samples

    def update(self, samples: list[TrainSample]) -> dict[str, float]:
        """One GRPO update on ``samples`` (:class:`~swarmlm.sapo.update.GRPOUpdate`), then the engine's weights."""
        stats = self.updater.update(samples, self.rng)
        if samples:
            self.engine.sync_weights()  # an engine with its own copy of the weights generates with the new policy
        return stats

    @torch.no_grad()
    def evaluate(self) -> float:
        """pass@1 on the fixed held-out set, with greedy decoding."""
        g = self.config.generation
        generated = self.engine.generate(self._prompt_ids([q.question for q in self.eval_set]),
                                         num_completions=1, max_new_tokens=g.max_new_tokens, max_batch=g.max_batch, greedy=True)
        scores = [self.tasks.score(q.family, extract_answer(gen.texts[0]), q.entry) for q, gen in zip(self.eval_set, generated)]
        return sum(scores) / len(scores)

    def learn(self, own: OwnRollouts, round_started: float) -> dict[str, Any]:
        """Collect, select, update, evaluate, log; returns the round's metrics."""
        round = own.round
        if self.config.external > 0:
            pool, info = self.collect_external(round)
        else:
            pool, info = [], {"peers_heard": 0, "records_accepted": 0, "records_dropped": 0, "transport_seconds": 0.0,
                              "records_received": 0, "accepted_sources": {}}
        chosen = select_external(pool, self.config.external, self.config.sharing.selection, self.rng)
        samples = self._samples(own, chosen)
        started = time.perf_counter()
        train_stats = self.update(samples)
        train_seconds = time.perf_counter() - started
        reward_own = sum(map(sum, own.rewards)) / max(1, sum(map(len, own.rewards)))
        self.cumulative_reward_own += reward_own
        self.round = round
        cfg = self.config
        is_last = round == cfg.rounds
        do_eval = is_last or (cfg.eval_every > 0 and round % cfg.eval_every == 0)
        eval_pass1 = self.evaluate() if do_eval else None
        all_completions = [c for gen in own.generated for c in gen.completion_ids]
        record = {
            "round": round,
            "node": self.node_id,
            "reward_own": reward_own,
            "reward_external": (sum(g.mean_score for g in chosen) / len(chosen)) if chosen else None,
            "reward_external_pool": (sum(g.mean_score for g in pool) / len(pool)) if pool else None,
            "eval_pass1": eval_pass1,
            **train_stats,
            "external_used": len(chosen),
            "external_sources": dict(Counter(g.record.node_id for g in chosen)),
            "global_round": own.global_round,
            "external_pool": len(pool),
            **info,
            "transport_seconds": info["transport_seconds"] + own.transport_seconds,
            "drops": dict(self.drops.counts),
            "format_rate": sum(extract_answer(t) is not None for gen in own.generated for t in gen.texts) / max(1, len(all_completions)),
            "completion_tokens": sum(map(len, all_completions)) / max(1, len(all_completions)),
            "tokens_per_s": own.gen_tokens / own.gen_seconds if own.gen_seconds > 0 else None,
            "gen_seconds": own.gen_seconds,
            "train_seconds": train_seconds,
            "round_seconds": time.perf_counter() - round_started,
            "cumulative_reward_own": self.cumulative_reward_own,
            **self.transport.stats(),
        }
        self.metrics.log(record)
        if round % cfg.checkpoint_every == 0 or is_last:
            self.checkpoint()
        return record

    def run_round(self, round: int) -> dict[str, Any]:
        started = time.perf_counter()
        return self.learn(self.play(round), started)

    # ------------------------------------------------------------------ persistence
    def checkpoint(self) -> Path:
        state = {"node_id": self.node_id, "cumulative_reward_own": self.cumulative_reward_own,
                 "tasks": self.tasks.state(), "rng": self.rng.getstate(), "drops": dict(self.drops.counts)}
        return save_checkpoint(self.ckpt_dir, self.round, model=self.model, tokenizer=self.tokenizer,
                               optimizer=self.optimizer, state=state)

    def close(self) -> None:
        self.metrics.close()
        self.engine.close()
