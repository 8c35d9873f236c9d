"""Every option of a SAPO node and of the commands that run nodes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from swarmlm.config import NamedSection, StrictModel, parse_list
from swarmlm.sapo.records import RecordLimits
from swarmlm.sapo.selection import SelectionPolicy
from swarmlm.tasks import TaskConfig


class ModelSection(NamedSection):
    name: str = Field("tiny-qwen2", description="preset name, local directory, .gguf file or Hugging Face hub id")
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N or mps")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weights' dtype")
    warmstart: Literal["auto", "always", "train", "never"] = Field(
        "auto", description="supervised format warm start before RL. auto: a built-in preset gets its warm start "
        "(warmstart_* below): the one shipped with swarmlm for the default settings, else trained here; any other "
        "model is probed (sampled completions of training questions in the node's prompt) and, when under 0.95 of "
        "them hold <answer>…</answer>, gets the format warm-up (format_warmup_* below); both cached. always: the "
        "same as auto. train: as auto, but a preset's warm start is trained on this machine even where one is "
        "shipped. never: the model as it is")
    warmstart_steps: int = Field(600, ge=0, description="optimizer steps of the warm start")
    warmstart_seed: int = Field(1, ge=0, description="seed of the warm start (shared by all nodes and run seeds; 1, "
                                "whose warm start ships with swarmlm)")
    warmstart_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="the warm start's learning rate after its warm-up: constant, or a cosine decay to a tenth")
    warmstart_families: list[str] = Field(default_factory=list, description=(
        "families of the task mix the warm start learns (an expert node, which knows only these); empty = the "
        "whole mix. The node still draws, evaluates on and accepts every family of tasks"))
    format_warmup_steps: int = Field(
        16, ge=0, description="most supervised steps (8 training questions each) of a non-preset model's format "
        "warm-up; it stops at the first probe (every 2 steps) where 0.95 of sampled completions hold the format")
    format_warmup_lr: float = Field(5e-5, gt=0, description="AdamW learning rate of the format warm-up")

    _families = field_validator("warmstart_families", mode="before")(parse_list)


class GenerationSection(StrictModel):
    group_size: int = Field(8, ge=2, description="completions per question (L)")
    max_new_tokens: int = Field(32, ge=1, description="longest completion, in tokens")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (plain sampling: no top-k or top-p)")
    max_prompt_tokens: int = Field(512, ge=8, description="longest prompt, in tokens (longer ones keep their end)")
    max_batch: int = Field(64, ge=1, description="most sequences generated at once")
    prompt_style: Literal["auto", "plain", "chat"] = Field("auto", description="chat = the tokenizer's chat template")
    engine: Literal["hf", "vllm"] = Field(
        "hf", description="hf = batched decoding with the training model; vllm = a vLLM engine (GPU, optional install)")
    precision: Literal["float32", "bfloat16", "auto"] = Field(
        "float32", description="the hf engine's decoding: with the model as it is, or with a bf16 copy of its weights "
        "refreshed after every update (half the bytes per decode step); auto = bfloat16 where the device computes in "
        "bf16 natively. Not yet shown to leave learning unchanged, so not the default")
    vllm_gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1, description="share of GPU memory the vLLM engine may take (the policy's training shares the GPU)")


ExternalWeight = Literal["none", "truncated"]  # how external completions are weighted in the loss
RewardMode = Literal["task", "correct"]  # what a completion's task score becomes as a reward


class GRPOSection(StrictModel):
    """The policy update: GRPO (DeepSeekMath, arXiv 2402.03300) with DAPO's clip-higher and token-level loss
    (arXiv 2503.14476); see :mod:`swarmlm.sapo.grpo`."""

    lr: float | None = Field(None, gt=0, description="Adam learning rate; None = 1e-4 for presets and directories "
                             "holding their warm starts, 1e-5 otherwise")
    warmup_rounds: int = Field(20, ge=0, description="linear learning-rate warm-up: round r (1-based) steps at "
                               "lr * min(1, r / warmup_rounds); 0 = none. Adam's first steps move every weight by "
                               "about lr whatever the gradient's size, which a noisy small-batch gradient turns into drift")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "cosine", description="after the warm-up: cosine decay to lr / 10 at the last round ('rounds'), or constant. "
        "At a constant rate the held-out pass@1 of the default run kept moving by +-0.03 between evaluations, and the "
        "last one is what a run ends with")
    eps_low: float = Field(0.2, ge=0, lt=1, description="lower clip range of the probability ratio: it is clipped "
                           "below at 1 - eps_low")
    eps_high: float = Field(0.28, ge=0, description="upper clip range of the probability ratio: it is clipped above "
                            "at 1 + eps_high (DAPO's clip-higher, arXiv 2503.14476, 0.28)")
    beta: float = Field(0.0, ge=0, description="KL weight; > 0 creates a frozen reference model")
    ppo_epochs: int = Field(1, ge=1, description="passes over the round's samples")
    num_minibatches: int = Field(1, ge=1, description="optimizer steps per pass")
    micro_batch_size: int = Field(32, ge=1, description="sequences per forward/backward (memory only)")
    max_grad_norm: float = Field(1.0, gt=0, description="clip the gradient's global norm to this before each "
                                 "optimizer step")
    precision: Literal["float32", "bfloat16", "auto"] = Field(
        "float32", description="the update's forward and backward passes: float32, or bf16 autocast (weights, "
        "gradients and optimizer state stay in model.dtype; log-probs are taken in float32); auto = bfloat16 where the "
        "device computes in bf16 natively (a CUDA GPU that supports it, a CPU with AVX512-BF16 or AMX), float32 "
        "elsewhere. Off by default: no change in learning measured on SmolLM2-135M (20 rounds, 3 seeds), but a "
        "processor-dependent default would give different results on different machines")
    format_reward: float = Field(0.1, ge=0, description="bonus added to the training reward of completions with an "
                                 "<answer>…</answer> span, never part of reward_own; 0 = off, as in the paper. Without "
                                 "it a group whose replies are all wrong has no advantage, however many lost the format")
    external_format_reward: bool = Field(
        False, description="add format_reward to external completions too. Off: a peer's completions earn their task "
        "rewards alone, so a peer's group that is all wrong has no advantage however its replies are formatted, and a "
        "peer cannot teach a wrong answer by wrapping it in an <answer> span beside unwrapped ones (the node's own "
        "completions keep the bonus)")
    external_weight: ExternalWeight = Field(
        "truncated", description="importance weight for external completions: truncated = min(1, their likelihood "
        "under this node relative to its own completions'), or none (the reference behaviour). With none, a sharing "
        "node lost the answer format within 50 rounds at the default learning rate")
    truncated_reward: Literal["task", "zero"] = Field(
        "task", description="training reward of a completion that reached --generation.max-new-tokens without "
        "ending: task = what its answer earns, like any other; zero = 0 and no format bonus, and it is trained "
        "without an appended EOS (a reply has to end to count). Never part of reward_own")
    external_advantage: Literal["group", "own_baseline"] = Field(
        "group", description="advantage of an external completion: group = GRPO's, normalised within the peer's group "
        "(the paper; a group the peer got all right, or all wrong, teaches nothing); own_baseline = its training reward "
        "minus this node's mean training reward this round on the question's family (on all its own completions when "
        "it drew none of that family), not normalised (as in Dr. GRPO, arXiv 2503.20783), so that a peer's right "
        "answers on a family this node fails at count however many of the peer's were right")
    shuffle_advantages: bool = Field(
        False, description="control experiment, not training: permute each group's advantages among its completions "
        "before the update (own and external groups alike). The update then sees the same advantages with no link to "
        "what each completion says, so what such a run gains, the reward did not cause")
    reward: RewardMode = Field(
        "correct", description="correct = 1 for a reply the task scores in full, else 0; task = the task's score, "
        "partial credit included. Reasoning-gym's arithmetic families give len(answer)/len(reply) to a wrong reply "
        "that contains the answer, which a weak policy is rewarded for more often than for correct answers")


FinalCheckpoint = Literal["resumable", "weights", "none"]
FINAL_CHECKPOINT_HELP = (
    "what a node keeps once every round is done: resumable = its last checkpoint (model and Adam state: a larger "
    "--rounds continues it); weights = the model only (safetensors, NODE_DIR/final-model); none = its metrics only. "
    "Until then, and after Ctrl+C or a crash, it keeps its newest resumable checkpoint whatever this says")


class SharingSection(StrictModel):
    selection: SelectionPolicy = Field("uniform", description="how J external groups are chosen")
    collect_timeout: float = Field(30.0, ge=0, description="seconds to wait for other nodes' records")
    staleness_rounds: int = Field(0, ge=0, description="also accept records up to this many rounds old (asynchronous swarms)")
    limits: RecordLimits = Field(default_factory=RecordLimits)


class SAPOSettings(StrictModel):
    """What every SAPO run shares: the model, generation, update, sharing rules, tasks and schedule."""

    rounds: int = Field(100, ge=1, description="rounds to train")
    eval_every: int = Field(10, ge=0, description="held-out pass@1 every E rounds (0 = only at the end)")
    checkpoint_every: int = Field(10, ge=1, description="checkpoint every C rounds (and at the end and on Ctrl+C)")
    keep_checkpoints: int = Field(1, ge=0, description=(
        "checkpoints kept per node, the newest (0 = all). An older one is deleted only once the next is complete, "
        "and a node resumes from its newest, so 1 loses nothing; each holds the model and its Adam state"))
    final_checkpoint: FinalCheckpoint = Field("resumable", description=FINAL_CHECKPOINT_HELP)
    out: str = Field("runs/sapo", description="output directory")
    model: ModelSection = Field(default_factory=ModelSection)
    generation: GenerationSection = Field(default_factory=GenerationSection)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    sharing: SharingSection = Field(default_factory=SharingSection)
    tasks: TaskConfig = Field(default_factory=TaskConfig)

    @model_validator(mode="after")
    def _warmstart_families_in_mix(self) -> "SAPOSettings":
        mix = [f.name for f in self.tasks.resolved_families()]
        unknown = [f for f in self.model.warmstart_families if f not in mix]
        if unknown:
            raise ValueError(f"model.warmstart_families: '{unknown[0]}' is not in the task mix; allowed: {', '.join(mix)}")
        return self


class SAPOConfig(SAPOSettings):
    """One SAPO node's settings."""

    local: int = Field(4, ge=1, description="I: groups from the node's own questions per round")
    external: int = Field(4, ge=0, description="J: groups taken from other nodes per round")
    seed: int = Field(0, ge=0, description="base seed; node k uses its own stream derived from it")


class NodeModels(StrictModel):
    """The options of the commands that start several nodes: which model each begins from, and which families of
    the task mix each draws its own questions from."""

    node_models: list[str] = Field(default_factory=list, description=(
        "model of node k = node_models[k % len] (a heterogeneous swarm), each a preset, directory, .gguf file or hub "
        "id, warm-started as model.name would be; empty = model.name for all"))
    node_families: list[str] = Field(default_factory=list, description=(
        "families node k draws its own questions from = node_families[k % len], each one family of the task mix or "
        "several joined by '+' (specialist nodes; every node still evaluates on and accepts every family of the "
        "mix); empty = tasks.draw_families for all"))
    node_warmstart_families: list[str] = Field(default_factory=list, description=(
        "families node k's warm start learns = node_warmstart_families[k % len], joined by '+' as in node_families "
        "(expert nodes: each knows only its families at round 0, draws and is scored on the whole mix); empty = "
        "model.warmstart_families for all"))

    _node_lists = field_validator("node_models", "node_families", "node_warmstart_families", mode="before")(parse_list)

    @model_validator(mode="after")
    def _families_in_mix(self) -> "NodeModels":
        for k in range(len(self.node_families)):
            self.node_tasks(k)  # raises, naming the family and the mix, for a family the mix does not have
        for k in range(len(self.node_warmstart_families)):
            self.node_warmstart(k)
        return self

    def node_model(self, k: int) -> str:
        """The model node ``k`` begins from."""
        return self.node_models[k % len(self.node_models)] if self.node_models else self.model.name

    def node_family(self, k: int) -> str:
        """Node ``k``'s entry of ``node_families`` (families joined by '+'); only when ``node_families`` is set."""
        return self.node_families[k % len(self.node_families)]

    def node_tasks(self, k: int) -> TaskConfig:
        """Node ``k``'s task config: the run's, drawing its own questions from its ``node_families`` entry."""
        if not self.node_families:
            return self.tasks
        families = [f for f in self.node_family(k).split("+") if f]
        mix = [f.name for f in self.tasks.resolved_families()]
        unknown = [f for f in families if f not in mix]
        if unknown or not families:
            raise ValueError(f"node_families: '{self.node_family(k)}' names a family not "
                             f"in the task mix; allowed: {', '.join(mix)} (several joined by '+')")
        return self.tasks.model_copy(update={"draw_families": families})

    def node_warmstart(self, k: int) -> list[str]:
        """The families node ``k``'s warm start learns (empty = the whole mix)."""
        if not self.node_warmstart_families:
            return self.model.warmstart_families
        entry = self.node_warmstart_families[k % len(self.node_warmstart_families)]
        families = [f for f in entry.split("+") if f]
        mix = [f.name for f in self.tasks.resolved_families()]
        if not families or any(f not in mix for f in families):
            raise ValueError(f"node_warmstart_families: '{entry}' names a family not in the task mix; allowed: "
                             f"{', '.join(mix)} (several joined by '+')")
        return families

    def node_label(self, k: int) -> str:
        """Node ``k``'s model as a run's provenance names it: the model, and the families of an expert's warm start."""
        families = self.node_warmstart(k)
        return self.node_model(k) + (f" (warm start: {'+'.join(families)})" if families else "")

    def node_specialty(self, k: int) -> list[str]:
        """The families node ``k`` is set apart by: those it draws (``node_families``), else those its warm start
        learned (``node_warmstart_families``); empty = none, every family alike."""
        return self.node_tasks(k).draw_families if self.node_families else self.node_warmstart(k)

    def node_config(self, k: int):
        """This run's settings as node ``k`` sees them: its own model (:meth:`node_model`, warm-started on
        :meth:`node_warmstart`) and tasks (:meth:`node_tasks`)."""
        model = self.model.model_copy(update={"name": self.node_model(k), "warmstart_families": self.node_warmstart(k)})
        return self.model_copy(update={"model": model, "tasks": self.node_tasks(k)})


class SimulateConfig(NodeModels, SAPOConfig):
    """``swarmlm sapo simulate``: N nodes on this machine."""

    nodes: int = Field(4, ge=1, description="number of nodes")
    # the defaults are a first run: about 4 minutes on 2 CPU cores, and under 1 MB written (4 nodes' resumable
    # checkpoints of the 3M-parameter default would be 144 MB)
    rounds: int = Field(30, ge=1, description="rounds to train")
    eval_every: int = Field(15, ge=0, description="held-out pass@1 every E rounds (0 = only at the end)")
    final_checkpoint: FinalCheckpoint = Field("none", description=FINAL_CHECKPOINT_HELP)
    transport: Literal["in_process", "torch"] = Field(
        "in_process", description="in_process = all nodes in this process; torch = one process per node over torch.distributed")

    @model_validator(mode="after")
    def _sharing_needs_peers(self) -> "SimulateConfig":
        if self.external > 0 and self.nodes < 2:
            raise ValueError("external > 0 needs at least 2 nodes (set external: 0 for a lone node)")
        return self
