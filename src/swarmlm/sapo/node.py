"""A SAPO node: its own policy, task stream and verifier, and one round of SAPO (Swarm sAmpling Policy
Optimization, arXiv 2509.08721).

A round has two halves so that a driver can interleave many nodes:

* :meth:`SAPONode.play` samples I questions, generates L completions each, scores them with the
  node's verifier and publishes the records;
* :meth:`SAPONode.learn` collects the other nodes' records, checks, regenerates and re-scores them
  (:class:`~swarmlm.sapo.intake.PeerIntake`), picks J external groups, takes one GRPO update on the I + J
  groups (:mod:`swarmlm.sapo.update`) and checkpoints; its hooks (:mod:`swarmlm.sapo.hooks`) hear of each part,
  and its observer evaluates and logs.

Every score, the node's own completions' included, comes from the node's
:class:`~swarmlm.verify.verifier.Verifier`: safe scorers in bounded worker processes. The node owns its I/O
(transport, checkpoints) and its evaluation; the update is :class:`~swarmlm.sapo.update.GRPOUpdate`'s, the
measurements :class:`~swarmlm.sapo.observer.NodeObserver`'s.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections import Counter
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from swarmlm.config import ConfigError
from swarmlm.models import PRESETS, load_model
from swarmlm.runtime.checkpoints import latest_checkpoint, load_optimizer_state, remove_checkpoints, save_checkpoint, save_model
from swarmlm.runtime.devices import DTYPES, resolve_device
from swarmlm.sapo.batching import TrainSample, with_eos
from swarmlm.sapo.config import SAPOConfig
from swarmlm.sapo.engines import make_engine
from swarmlm.sapo.engines.base import GenerationEngine, tokenize_prompts
from swarmlm.sapo.grpo import (
    baseline_advantages,
    family_baselines,
    group_advantages,
    permuted_within_groups,
)
from swarmlm.sapo.hooks import NodeHook
from swarmlm.sapo.intake import PeerIntake, question_stream
from swarmlm.sapo.observer import NodeObserver
from swarmlm.sapo.records import DropCounter, RolloutRecord, round_message
from swarmlm.sapo.rollouts import OwnRollouts
from swarmlm.sapo.round_metrics import RoundOutcome, mean_reward
from swarmlm.sapo.selection import ScoredGroup, select_external
from swarmlm.sapo.transports.base import RolloutTransport
from swarmlm.sapo.update import GRPOUpdate
from swarmlm.sapo.warmstart import FormatWarmupConfig, WarmstartConfig, format_warmup, warmstart, warmstart_info
from swarmlm.tasks import Question, TaskSource, build_prompt, eval_questions, extract_answer
from swarmlm.verify import Verifier

FULL_MARKS = 1.0 - 1e-9


def is_correct(score: float) -> bool:
    """Whether a task score is full marks (a correct answer, not partial credit)."""
    return score >= FULL_MARKS

log = logging.getLogger(__name__)

PRESET_LR = 1e-4  # measured on the warm-started tiny-qwen2: at 2e-4 a lone node lost the answer format (docs/results/sapo-history.md)
PRETRAINED_LR = 1e-5  # measured on SmolLM2-135M: held-out pass@1 rose at 1e-5, barely at 1e-6 (docs/results/smollm2_lr.json)


def default_lr(model_name: str) -> float:
    """The learning rate a node takes without ``--grpo.lr``: the preset's for a preset and for a directory holding a
    preset's warm start (``warmstart.json``: the same weights, whatever they are called), the pretrained models'
    otherwise."""
    if model_name in PRESETS:
        return PRESET_LR
    info = warmstart_info(model_name)
    settings = info.get("config") if isinstance(info, dict) else None
    if isinstance(settings, dict) and settings.get("model") in PRESETS:
        return PRESET_LR
    return PRETRAINED_LR


def round_lr(lr: float, round: int, warmup_rounds: int, *, schedule: str = "constant", rounds: int = 0) -> float:
    """The learning rate of round ``round`` (1-based): a linear warm-up over ``warmup_rounds`` rounds, then constant,
    or (``schedule="cosine"``) a cosine decay from ``lr`` after the warm-up to ``lr / 10`` at round ``rounds``. A pure
    function of the round, so a resumed node continues the schedule exactly."""
    round = max(1, round)
    if warmup_rounds > 0 and round < warmup_rounds:
        return lr * round / warmup_rounds
    if schedule == "constant" or rounds <= warmup_rounds:
        return lr
    progress = min(1.0, (round - max(warmup_rounds, 1)) / max(1, rounds - max(warmup_rounds, 1)))
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def initial_model_path(config: SAPOConfig, progress: bool = True) -> str:
    """What the node loads at round 0: a preset's warm start; for any other model, its format warm-up when the model
    lacks the answer format (:func:`~swarmlm.sapo.warmstart.format_warmup`), else the model as it is."""
    m = config.model
    if m.warmstart == "never":
        return m.name
    # the warm start learns model.warmstart_families (empty = the whole mix), not what the node draws: a specialist
    # node (tasks.draw_families) starts where every node does, an expert knows only its families
    tasks = config.tasks.model_copy(update={"draw_families": list(m.warmstart_families)})
    if m.name not in PRESETS:
        g = config.generation
        return format_warmup(FormatWarmupConfig(
            model=m.name, tasks=tasks, prompt_style=g.prompt_style, max_prompt_tokens=g.max_prompt_tokens,
            max_new_tokens=g.max_new_tokens, temperature=g.temperature, max_steps=m.format_warmup_steps,
            lr=m.format_warmup_lr, seed=m.warmstart_seed, device=m.device), progress=progress)
    ws = WarmstartConfig(model=m.name, tasks=tasks, steps=m.warmstart_steps, seed=m.warmstart_seed,
                         schedule=m.warmstart_schedule, train=m.warmstart == "train")
    return str(warmstart(ws, progress=progress))


def initial_model_paths(configs: list[SAPOConfig], progress: bool = True) -> list[str]:
    """:func:`initial_model_path` of each node's settings (a heterogeneous run's), each distinct model section
    warmed up once."""
    done: dict[str, str] = {}
    for c in configs:
        key = c.model.model_dump_json()
        if key not in done:
            done[key] = initial_model_path(c, progress=progress)
    return [done[c.model.model_dump_json()] for c in configs]


FINISHED = "finished.json"  # a finished node's last round, where its checkpoints were not kept
FINAL_MODEL = "final-model"  # a finished node's weights (final_checkpoint: weights)


def finished_round(out_dir: Path, config: SAPOConfig) -> int | None:
    """The last round of the finished run in ``out_dir`` that kept no checkpoint, or None. A config asking for more
    rounds than it played cannot continue it: that is an error naming the field."""
    try:
        done = json.loads((out_dir / FINISHED).read_text())
    except (OSError, ValueError):
        return None
    round = done.get("round") if isinstance(done, dict) else None
    if not isinstance(round, int):
        return None
    if config.rounds > round:
        raise ConfigError(f"rounds: {out_dir} holds a run finished at round {round} that kept no checkpoint "
                         f"(final_checkpoint: {done.get('final_checkpoint')}), so it cannot continue to round "
                         f"{config.rounds}; give another --out, or --final-checkpoint resumable next time")
    return round


def node_seed(base_seed: int, node_index: int) -> int:
    return base_seed * 1_000 + node_index


class SAPONode:
    """One node of the swarm. ``out_dir`` holds its metrics and checkpoints; it resumes from them.

    ``swarm`` names the swarm (the same on every node of it): with the node id it names the node's question
    stream, which receivers check records against. ``verifier`` may be shared by nodes of one process with the
    same task config (the node starts its own otherwise, and closes only that one). Its hooks
    (:mod:`swarmlm.sapo.hooks`) hear of each round; the first is always its :class:`~swarmlm.sapo.observer.NodeObserver`
    (evaluations, timings, ``metrics.jsonl``), then any given."""

    def __init__(self, config: SAPOConfig, node_index: int, transport: RolloutTransport, out_dir: str | Path,
                 initial_model: str, *, resume: bool = True, tensorboard: bool = True, swarm: str | None = None,
                 verifier: Verifier | None = None, hooks: Iterable[NodeHook] = ()):
        self.config = config
        self.index = node_index
        self.transport = transport
        self.node_id = transport.node_id
        self.out_dir = Path(out_dir)
        self.ckpt_dir = self.out_dir / "checkpoints"
        self.device = resolve_device(config.model.device)
        self.seed = node_seed(config.seed, node_index)
        checkpoint = latest_checkpoint(self.ckpt_dir) if resume else None
        finished = finished_round(self.out_dir, config) if resume and checkpoint is None else None
        source = str(checkpoint.model_dir) if checkpoint else initial_model
        loaded = load_model(source, seed=self.seed, dtype=DTYPES[config.model.dtype])
        self.model = loaded.model.to(self.device)
        self.model.train()
        self.tokenizer = loaded.tokenizer
        # what peers see in the records' ``model`` field: a short name, never a long local path
        self.model_name = Path(config.model.name.rstrip("/")).name[-64:] or "model"
        self.lr = config.grpo.lr or default_lr(config.model.name)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        self.ref_model = None
        if config.grpo.beta > 0:
            self.ref_model = load_model(initial_model, seed=self.seed, dtype=DTYPES[config.model.dtype]).model.to(self.device)
            self.ref_model.eval().requires_grad_(False)
        self.swarm = swarm if swarm is not None else f"seed-{config.seed}"
        self.tasks = TaskSource(config.tasks, stream=question_stream(self.swarm, self.node_id))
        self.eval_set = eval_questions(config.tasks)
        self._owns_verifier = verifier is None
        self.verifier = verifier if verifier is not None else Verifier(config.tasks)
        self.rng = random.Random(self.seed)
        self.drops = DropCounter()
        self.own_unscored: Counter = Counter()  # own groups the verifier refused (over its limits), by reason
        self.round = 0  # last completed round
        self.cumulative_reward_own = 0.0
        self._slots = (-1, 0)  # (global round, next free slot): several steps within one global round draw new questions
        self._round_records: tuple[int, list[RolloutRecord]] = (-1, [])  # the records published in that global round
        if checkpoint is not None:
            load_optimizer_state(checkpoint, self.optimizer)
            st = checkpoint.state
            self.round = checkpoint.step
            self.cumulative_reward_own = st.get("cumulative_reward_own", 0.0)
            self._slots = tuple(st.get("slots", self._slots))
            self.rng.setstate((st["rng"][0], tuple(st["rng"][1]), st["rng"][2]))
            self.drops.counts.update(st.get("drops", {}))
            log.info("%s resumed from %s (round %d)", self.node_id, checkpoint.path, self.round)
        elif finished is not None:
            self.round = finished  # a finished run, kept without its checkpoints: nothing left to play
        self._finished = finished is not None
        self.updater = GRPOUpdate(self.model, self.optimizer, config.grpo, self.tokenizer.pad_token_id, self.ref_model)
        # generates the rollouts; an engine holding its own copy of the weights (vLLM) is synced after each update
        self.engine: GenerationEngine = make_engine(config.generation, self.model, self.tokenizer)
        self.intake = PeerIntake(
            swarm=self.swarm, node_id=self.node_id, limits=config.sharing.limits, verifier=self.verifier,
            tokenizer=self.tokenizer, max_new_tokens=config.generation.max_new_tokens,
            staleness_rounds=config.sharing.staleness_rounds, future_rounds=transport.future_rounds,
            round_seconds=config.tasks.verifier.round_seconds, drops=self.drops, rng=self.rng)
        self.observer = NodeObserver(self.out_dir, resume_from=self.round, eval_every=config.eval_every,
                                     rounds=config.rounds, tensorboard=tensorboard)
        self.hooks: list[NodeHook] = [self.observer, *hooks]

    # ------------------------------------------------------------------ helpers
    def _prompt_ids(self, questions: list[str]) -> list[list[int]]:
        style = self.config.generation.prompt_style
        prompts = [build_prompt(q, self.tokenizer, style) for q in questions]
        return tokenize_prompts(self.tokenizer, prompts, self.config.generation.max_prompt_tokens)

    def _score_own(self, questions: list[Question], texts: list[list[str]]) -> list[list[float]]:
        """This node's scores of its own completions (or of its greedy answers), through its verifier: a group
        the verifier cannot score (over its limits) scores 0 and is counted in ``own_unscored`` by reason."""
        out = []
        for group, res in zip(texts, self.verifier.score_completions(questions, texts)):
            if not res.ok:
                self.own_unscored[res.drop] += 1
                log.warning("%s: an own group was not scored: %s (%s)", self.node_id, res.drop, res.detail[:80])
            out.append(res.scores_or_zeros(len(group)))
        return out

    def task_rewards(self, scores: list[float]) -> list[float]:
        """What the task's scores are worth as rewards (``grpo.reward``): the scores, or 1 for full marks, else 0."""
        if self.config.grpo.reward == "correct":
            return [1.0 if is_correct(s) else 0.0 for s in scores]
        return list(scores)

    def _cut_at_limit(self, length: int) -> bool:
        """Whether a completion of ``length`` tokens (without EOS) ran to ``generation.max_new_tokens`` unended
        under ``grpo.truncated_reward zero`` (always False under ``task``)."""
        return self.config.grpo.truncated_reward == "zero" and length >= self.config.generation.max_new_tokens

    def _training_rewards(self, texts: list[str], scores: list[float], lengths: list[int],
                          external: bool = False) -> list[float]:
        """The rewards the update sees: the task rewards, plus ``grpo.format_reward`` for a well-formed answer (in
        ``external`` completions only under ``grpo.external_format_reward``); under ``grpo.truncated_reward zero``,
        0 for a completion of ``lengths`` at the token limit."""
        grpo = self.config.grpo
        bonus = grpo.format_reward if grpo.external_format_reward or not external else 0.0
        return [0.0 if self._cut_at_limit(n) else r + (bonus if bonus and extract_answer(t) is not None else 0.0)
                for t, r, n in zip(texts, self.task_rewards(scores), lengths)]

    def _external_training_rewards(self, texts: list[str], scores: list[float], lengths: list[int]) -> list[float]:
        """:meth:`_training_rewards` of a peer's completions (the intake's reward callback)."""
        return self._training_rewards(texts, scores, lengths, external=True)

    def _own_training_rewards(self, own: OwnRollouts, external: bool = False) -> list[list[float]]:
        """The training rewards of this node's own completions (as if they were a peer's, with ``external``)."""
        return [self._training_rewards(gen.texts, s, [len(c) for c in gen.completion_ids], external)
                for gen, s in zip(own.generated, own.scores)]

    def _trained_ids(self, ids: list[int]) -> list[int]:
        """A completion as it is trained: ended by EOS (:func:`with_eos`), except one cut at the limit under
        ``grpo.truncated_reward zero``, which is trained as sampled."""
        max_new = self.config.generation.max_new_tokens
        return list(ids[:max_new]) if self._cut_at_limit(len(ids)) else with_eos(ids, self.tokenizer.eos_token_id, max_new)

    def _next_slots(self, global_round: int, n: int) -> int:
        """The first of ``n`` unused question slots of ``global_round``."""
        first = self._slots[1] if self._slots[0] == global_round else 0
        if first + n > self.config.sharing.limits.max_slot:
            first = 0  # more steps in one global round than slots: questions repeat (receivers count them once)
        self._slots = (global_round, first + n)
        return first

    # ------------------------------------------------------------------ round, first half
    def play(self, round: int) -> OwnRollouts:
        """Sample I questions, generate L completions each, score them, publish them."""
        g = self.config.generation
        global_round = self.transport.global_round(round)  # records are keyed by the swarm's round, not a local count
        first_slot = self._next_slots(global_round, self.config.local)
        questions = self.tasks.sample(self.config.local, round=global_round, first_slot=first_slot)
        # the round's samples depend on neither other nodes' work nor the timing: on the node's seed and its local
        # and global rounds (a node resumed from a checkpoint replays local rounds, but in new global rounds)
        torch.manual_seed((self.seed * 100_003 + round) * 1_000_003 + global_round % 1_000_003)
        for hook in self.hooks:
            hook.round_begins(round)
        with self._phase("generate"):
            generated = self.engine.generate(
                self._prompt_ids([q.question for q in questions]), num_completions=g.group_size,
                max_new_tokens=g.max_new_tokens, temperature=g.temperature, max_batch=g.max_batch)
        # gen.texts decode exactly the ids that are trained (cut at EOS and max_new_tokens): they are what is scored
        scores = self._score_own(questions, [gen.texts for gen in generated])
        own = OwnRollouts(round, generated, scores, global_round=global_round, families=[q.family for q in questions])
        for q, gen in zip(questions, generated):
            self.intake.remember_own(q.provenance, gen.texts, global_round)
        records = [RolloutRecord(self.node_id, global_round, first_slot + k, q.family, q.question, q.provenance,
                                 gen.texts, self.model_name) for k, (q, gen) in enumerate(zip(questions, generated))]
        if self._round_records[0] != global_round:
            self._round_records = (global_round, [])
        kept = self._round_records[1]
        kept.extend(records)  # the round's message grows with each step taken within it
        del kept[:-self.config.sharing.limits.max_records_per_message]
        with self._phase("publish"):
            self.transport.publish(own.global_round, round_message(self._round_records[1], self.config.sharing.limits))
        return own

    def _phase(self, name: str) -> ExitStack:
        """Every hook's :meth:`~swarmlm.sapo.hooks.NodeHook.phase` around a part of the round."""
        stack = ExitStack()
        for hook in self.hooks:
            stack.enter_context(hook.phase(name))
        return stack

    # ------------------------------------------------------------------ round, second half
    def collect_external(self, round: int) -> tuple[list[ScoredGroup], dict[str, Any]]:
        """Other nodes' valid records for ``round``, checked and re-scored by this node (:class:`PeerIntake`)."""
        round = self.transport.global_round(round)
        before = self.drops.total()  # the transport may count drops of its own while collecting
        with self._phase("collect"):
            messages = self.transport.collect(round, self.config.sharing.collect_timeout)
        with self._phase("intake"):
            candidates = self.intake.candidates(messages, round)
        with self._phase("verify"):
            pool = self.intake.verify(candidates, round, self._external_training_rewards)
        info = {"peers_heard": len({m.sender for m in messages}), "records_accepted": len(pool),
                "accepted_sources": dict(Counter(g.record.node_id for g in pool)),
                "records_dropped": self.drops.total() - before, "records_received": self.intake.last_received}
        return pool, info

    def _external_advantages(self, own: OwnRollouts):
        """How external groups' advantages are computed: None for GRPO's within-group ones (``grpo.external_advantage
        group``), else a function of a group giving its rewards minus this node's own mean reward on its family
        this round, the own rewards counted as a peer's are (``own_baseline``;
        :func:`~swarmlm.sapo.grpo.baseline_advantages`)."""
        if self.config.grpo.external_advantage == "group":
            return None
        baselines = family_baselines(own.families, self._own_training_rewards(own, external=True))
        return lambda grp: baseline_advantages(grp.rewards, baselines, grp.record.family)

    def _samples(self, own: OwnRollouts, own_rewards: list[list[float]], external: list[ScoredGroup],
                 measured=None) -> list[TrainSample]:
        """The update's samples: own groups with ``own_rewards`` (:meth:`_own_training_rewards`), then ``external``
        with GRPO's within-group advantages, or ``measured``'s (:meth:`_external_advantages`) where given."""
        samples = []
        own_adv = group_advantages(torch.tensor(own_rewards, dtype=torch.float64)).tolist() if own_rewards else []
        # grpo.shuffle_advantages (a control): its own stream, so that the run's other draws match an ordinary run's
        control = random.Random(f"shuffle-advantages/{self.seed}/{own.round}") if self.config.grpo.shuffle_advantages else None
        if control is not None:
            own_adv = permuted_within_groups(own_adv, control)
        for gen, advs in zip(own.generated, own_adv):
            for ids, a in zip(gen.completion_ids, advs):
                samples.append(TrainSample(gen.prompt_ids, self._trained_ids(ids), a))
        if external:  # the receiver's own question text, and the completions exactly as they were scored
            prompt_ids = self._prompt_ids([grp.prompt for grp in external])
            for grp, p_ids in zip(external, prompt_ids):
                advs = (group_advantages(torch.tensor([grp.rewards], dtype=torch.float64))[0].tolist() if measured is None
                        else measured(grp))
                if control is not None:
                    advs = permuted_within_groups([advs], control)[0]
                for ids, a in zip(grp.completion_ids, advs):
                    samples.append(TrainSample(p_ids, self._trained_ids(ids), a, external=True))
        return samples

    def update(self, samples: list[TrainSample], round: int | None = None) -> dict[str, float]:
        """One GRPO update on ``samples`` (:class:`~swarmlm.sapo.update.GRPOUpdate`), then the engine's weights.
        With ``round`` (1-based) the learning rate follows the warm-up (``grpo.warmup_rounds``); without, the
        optimizer's learning rate is left as it is."""
        g = self.config.grpo
        if round is not None and (g.warmup_rounds > 0 or g.lr_schedule != "constant"):
            lr = round_lr(self.lr, round, g.warmup_rounds, schedule=g.lr_schedule, rounds=self.config.rounds)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        stats = self.updater.update(samples, self.rng)
        if samples:
            self.engine.sync_weights()  # an engine with its own copy of the weights generates with the new policy
        return stats

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """pass@1 on the fixed held-out set, with greedy decoding: the share of questions answered correctly (full
        marks from the task's scorer; partial credit counts as wrong), as ``eval_pass1``, and per task family as
        ``eval_by_family`` (what a specialist node knows of the families it does not draw)."""
        g = self.config.generation
        generated = self.engine.generate(self._prompt_ids([q.question for q in self.eval_set]),
                                         num_completions=1, max_new_tokens=g.max_new_tokens, max_batch=g.max_batch, greedy=True)
        scores = self._score_own(self.eval_set, [gen.texts for gen in generated])
        right: dict[str, list[bool]] = {}
        for q, s in zip(self.eval_set, scores):
            right.setdefault(q.family, []).append(is_correct(s[0]))
        return {"eval_pass1": sum(map(sum, right.values())) / len(scores),
                "eval_by_family": {f: sum(v) / len(v) for f, v in sorted(right.items())}}

    def start(self) -> None:
        """Tell the hooks the node is about to play (its observer logs held-out pass@1 before any update as the
        ``round: 0`` line, once: a resumed run has it already)."""
        for hook in self.hooks:
            hook.started(self)

    def learn(self, own: OwnRollouts) -> dict[str, Any]:
        """Collect, select, update, checkpoint; returns the round's metrics line (the observer's)."""
        round = own.round
        if self.config.external > 0:
            pool, info = self.collect_external(round)
        else:
            pool, info = [], {"peers_heard": 0, "records_accepted": 0, "records_dropped": 0, "records_received": 0,
                              "accepted_sources": {}}
        own_training_rewards = self._own_training_rewards(own)
        measured = self._external_advantages(own)
        chosen = select_external(pool, self.config.external, self.config.sharing.selection, self.rng, measured)
        samples = self._samples(own, own_training_rewards, chosen, measured)
        with self._phase("update"):
            train_stats = self.update(samples, round)
        own_rewards = [self.task_rewards(s) for s in own.scores]
        self.cumulative_reward_own += mean_reward(own_rewards)
        self.round = round
        outcome = RoundOutcome(
            node_id=self.node_id, own=own, own_rewards=own_rewards, own_training_rewards=own_training_rewards,
            pool=pool, chosen=chosen, intake=info, train=train_stats, lr=self.optimizer.param_groups[0]["lr"],
            drops=dict(self.drops.counts), own_unscored=dict(self.own_unscored), transport=self.transport.stats(),
            cumulative_reward_own=self.cumulative_reward_own, task_rewards=self.task_rewards)
        for hook in self.hooks:
            hook.round_done(self, outcome)
        if round % self.config.checkpoint_every == 0 or round == self.config.rounds:
            self.checkpoint()
        return self.observer.last

    def run_round(self, round: int) -> dict[str, Any]:
        return self.learn(self.play(round))

    # ------------------------------------------------------------------ persistence
    def checkpoint(self) -> Path:
        state = {"node_id": self.node_id, "cumulative_reward_own": self.cumulative_reward_own, "slots": list(self._slots),
                 "rng": self.rng.getstate(), "drops": dict(self.drops.counts)}
        return save_checkpoint(self.ckpt_dir, self.round, model=self.model, tokenizer=self.tokenizer,
                               optimizer=self.optimizer, state=state, keep=self.config.keep_checkpoints)

    def finish(self) -> None:
        """Once every round is done: keep what ``config.final_checkpoint`` says (the resumable checkpoint, the model
        alone in ``final-model/``, or neither) and, without the checkpoint, note the last round in ``finished.json``
        so that the same command later finds the run complete."""
        mode = self.config.final_checkpoint
        if mode == "resumable" or self._finished:
            return
        self._finished = True
        if mode == "weights":
            target = self.out_dir / FINAL_MODEL
            save_model(self.model, target)  # on every rank, as a checkpoint is
            self.tokenizer.save_pretrained(target)
        (self.out_dir / FINISHED).write_text(json.dumps({"round": self.round, "final_checkpoint": mode}))
        remove_checkpoints(self.ckpt_dir)

    def close(self) -> None:
        for hook in self.hooks:
            hook.close()
        self.engine.close()
        if self._owns_verifier:
            self.verifier.close()
