"""Every option of ``swarmlm noloco train``.

The most used options sit at the top level (``--method noloco --replicas 4 --out DIR --steps 300``);
the rest are grouped by the part of the method they tune (``--inner.lr``, ``--noloco.gamma``,
``--exchange.timeout-s``, ``--data.source``...). Defaults are sized for a 2-core CPU: the tiny
Llama preset, 128-token sequences and small batches, so that a default 4-replica run takes minutes.
"""

from __future__ import annotations

from typing import Literal

from typing import Any

from pydantic import Field, model_validator

from swarmlm.config import StrictModel

Method = Literal["noloco", "diloco", "ddp"]
Algorithm = Literal["ring", "tree", "halving_doubling", "best"]
Backend = Literal["auto", "gloo", "nccl", "in_process"]
Precision = Literal["auto", "float32", "bfloat16"]


class InnerSection(StrictModel):
    """The inner optimizer: each replica's own Adam(W), never averaged."""

    optimizer: Literal["adamw", "adam"] = Field("adamw", description="inner optimizer")
    lr: float = Field(3e-3, gt=0, description="peak learning rate")
    weight_decay: float = Field(0.1, ge=0, description="decoupled weight decay (adamw only)")
    beta1: float = Field(0.9, ge=0, lt=1, description="Adam's decay rate of the gradient's running mean")
    beta2: float = Field(0.95, ge=0, lt=1, description="Adam's decay rate of the squared gradient's running mean")
    eps: float = Field(1e-8, gt=0, description="Adam's epsilon (added to the denominator)")
    warmup_steps: int = Field(30, ge=0, description="linear warmup steps, then cosine decay to min_lr_ratio * lr")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final learning rate as a fraction of the peak")
    clip: float = Field(1.0, gt=0, description="gradient clipping norm")


class OuterSection(StrictModel):
    """When outer steps happen (NoLoCo and DiLoCo)."""

    every: int = Field(20, ge=1, description="H: inner steps between outer steps. The NoLoCo reference uses 50; 20 suits this tiny scale")


class NoLoCoSection(StrictModel):
    """NoLoCo's outer step and the choice of its averaging groups (NoLoCo, arXiv 2506.10911)."""

    alpha: float = Field(0.5, ge=0, lt=1, description="outer momentum")
    beta: float = Field(0.7, description="outer lr on the group's mean pseudo-gradient")
    gamma: float = Field(0.7, description="pull of the slow weights toward the group's mean")
    momentum: Literal["heavy_ball", "lookahead"] = Field(
        "heavy_ball", description="heavy_ball: phi += delta (the reference); lookahead: phi += alpha*delta + update (Nesterov)")
    group_size: int = Field(2, ge=1, description="n: replicas per averaging group (2 = pairs)")
    leftover: Literal["join", "wait"] = Field(
        "join", description="when M is not divisible by n: join = the spare replica makes the last group n+1; "
                            "wait = it sits this outer step out (local outer step only)")


class DiLoCoSection(StrictModel):
    """DiLoCo's outer optimizer: SGD on the all-reduced pseudo-gradient."""

    lr: float = Field(0.7, gt=0, description="outer learning rate")
    momentum: float = Field(0.9, ge=0, lt=1, description="outer momentum. The DiLoCo paper uses 0.9 with Nesterov, the NoLoCo reference 0.3 heavy-ball")
    nesterov: bool = Field(True, description="Nesterov (true) or heavy-ball (false) momentum")


class ExchangeSection(StrictModel):
    """The point-to-point exchange of NoLoCo's outer step."""

    timeout_s: float = Field(60.0, gt=0, description="seconds to wait for a partner to arrive, and again for the transfer, before skipping it")
    compress: Literal["none", "int8", "int4"] = Field(
        "none", description="NoLoCo's messages in 8 or 4 bits: blockwise absmax quantization with error feedback "
        "(3.8x and 7.1x fewer bytes at block 64); none = fp32")
    block: int = Field(64, ge=2, multiple_of=2, description="values per quantization block (one fp32 scale each)")
    error_feedback: bool = Field(True, description="add what rounding lost from a message to this replica's next one")


class DataSection(StrictModel):
    source: str = Field(
        "builtin",
        description="builtin (Python standard library docstrings and reference text, offline); a .txt/.jsonl/.parquet "
                    "file, directory or glob (comma-separated for several); or hf:NAME[:CONFIG] for Hugging Face datasets streaming")
    text_field: str = Field("text", description="field holding the text in .jsonl/.parquet files and hf datasets")
    val_fraction: float = Field(0.03, gt=0, lt=1, description="share of documents held out for validation (local sources)")
    hf_split: str = Field("train", description="training split (hf: sources)")
    hf_val_split: str | None = Field(
        None, description="validation split (hf: sources); None = hold out the first val_docs documents of the training stream")
    hf_val_docs: int = Field(1000, ge=1, description="documents in the held-out validation set (hf: sources)")
    hf_data_files: str | None = Field(None, description="data_files for hf: builders such as hf:json or hf:parquet")


class LogSection(StrictModel):
    every: int = Field(1, ge=1, description="write a per-step metrics line every L steps")
    model_std: bool = Field(
        True, description="at every outer step, measure the RMS deviation of replicas' weights from their mean; "
                          "uses a collective (not part of the algorithm): turn off when workers may fail")
    tensorboard: bool = Field(True, description="also write TensorBoard events")
    fsync: bool = Field(True, description="force every metrics line to disk. Off saves about 10 ms a line on slow disks "
                                          "(many in-process replicas), and a crash may lose the last lines")


class FaultSection(StrictModel):
    """Fault injection, to see how the swarm copes with a slow or dead replica."""

    stall_rank: int | None = Field(None, ge=0, description="this rank sleeps stall_s before the outer steps listed in stall_outer_steps")
    stall_outer_steps: list[int] = Field(default_factory=list, description="outer step numbers (1 = the first) at which stall_rank stalls")
    stall_s: float = Field(0.0, ge=0, description="seconds of each stall")
    exit_rank: int | None = Field(None, ge=0, description="this rank exits abruptly (status 17) at outer step exit_outer_step")
    exit_outer_step: int | None = Field(None, ge=1, description="the outer step (1 = the first) at which exit_rank exits")
    stall_steps: list[int] = Field(
        default_factory=list, description="pipeline runs (--stages > 1): inner steps at whose start stall_rank stalls stall_s")


class PipelineSection(StrictModel):
    """Pipeline stages with NoLoCo's random routing (NoLoCo, arXiv 2506.10911); used when ``stages`` > 1."""

    micro_batches: int = Field(2, ge=1, description="micro-batches per batch (batch_size must be divisible by it)")
    routing: Literal["random", "identity"] = Field(
        "random", description="random: stage s of replica d sends each micro-batch to stage s+1 of replica pi(d), "
                              "a permutation drawn per step and slot from the shared seed; identity: replica d's own stages")
    retry_slots: int = Field(1, ge=0, description="extra slots per step that carry only micro-batches whose hop failed, "
                                                  "on another route")
    recompute: bool = Field(False, description="activation recomputation: keep only each decoder layer's input, and "
                                               "rerun the layer in the backward pass (torch.utils.checkpoint)")
    timeout_s: float = Field(30.0, gt=0, description="a hop is abandoned when its peer shows no progress for this long "
                                                     "(and a transfer that started must end within it)")
    max_wait_s: float | None = Field(None, gt=0, description="cap on any one wait for a hop, even with a live peer "
                                                             "(default 8 x timeout_s)")
    log_routes: bool = Field(False, description="log every step's peers (sent_to, recv_from) in the metrics")


class NetworkSection(StrictModel):
    """A link between every two replicas: one-way latency and bandwidth per message."""

    latency_ms: float = Field(0.0, ge=0, description="one-way latency of every message between replicas (ms)")
    bandwidth_gbit: float = Field(0.0, ge=0, description="bandwidth of every link (Gbit/s); 0 = unlimited")
    allreduce: Algorithm = Field("best", description="all-reduce algorithm whose hops the model charges (best = the cheapest for the size and M)")
    inject: bool = Field(False, description="really delay every message in the transport (sleep before each send); "
                                            "otherwise the link is only modelled (simulated wall-clock)")


class TrainConfig(StrictModel):
    """``swarmlm noloco train``: M replicas trained with NoLoCo, DiLoCo or data parallel."""

    method: Method = Field("noloco", description="noloco (pair averaging), diloco (all-reduce every H steps) or ddp (all-reduce every step)")
    replicas: int = Field(4, ge=1, description="M: replicas (local runs start replicas x stages processes); under "
                                               "torchrun the world size decides (M = world size / stages)")
    stages: int = Field(1, ge=1, description="S: pipeline stages per replica, each in its own process (see pipeline.*)")
    out: str = Field("runs/noloco", description="output directory")
    model: str = Field("tiny-llama", description="preset name (tiny-llama, llama-125m, llama-1.3b, llama-6.8b...), local directory or hub id")
    steps: int = Field(300, ge=1, description="inner steps per replica")
    seq_len: int = Field(128, ge=8, description="tokens per training sequence")
    batch_size: int = Field(8, ge=1, description="sequences per micro-batch per replica")
    grad_accum: int = Field(1, ge=1, description="micro-batches per inner step")
    seed: int = Field(0, ge=0, description="seed of the model init, the data order and the group permutations")
    device: str = Field("auto", description="auto, cpu, cuda or mps (under torchrun on GPUs: cuda:LOCAL_RANK)")
    precision: Precision = Field(
        "auto", description="auto = bf16 autocast on GPUs that support it, float32 on CPU")
    eval_every: int = Field(60, ge=0, description="K: validation loss and perplexity every K steps (0 = only at the end)")
    eval_batches: int = Field(16, ge=1, description="validation batches per evaluation (the same fixed batches every time)")
    checkpoint_every: int = Field(100, ge=0, description="checkpoint every C steps (0 = only at the end and on Ctrl+C)")
    keep_checkpoints: int = Field(2, ge=0, description=(
        "checkpoints kept per rank, the newest (0 = all). Ranks resume from the newest step all of them hold, so "
        "keep 2 or more with several ranks: one killed while the others saved still shares the step before"))
    resume: Literal["auto", "never"] | int = Field(
        "auto", description="auto = continue from the newest checkpoint all ranks hold; never = start over; N = from step N")
    stop_after: int | None = Field(
        None, ge=1, description="stop (with a checkpoint) after this step; the schedule still runs to `steps`")
    backend: Backend = Field(
        "auto", description="how the replicas talk: auto, gloo or nccl = one process per replica over torch.distributed "
                            "(auto = NCCL on GPUs, else gloo); in_process = all M replicas in this process. With "
                            "in_process the replicas share one device, are stepped in turn and exchange through memory, "
                            "their communication timed by the network.* link model on a simulated clock")
    stack_replicas: Literal["auto", "never"] = Field(
        "auto", description="backend in_process: auto = one vectorised forward and backward for all M replicas' "
                            "stacked weights (each replica still clips, steps and averages on its own; equal to one at "
                            "a time up to rounding); never = one replica at a time")
    threads: int = Field(0, ge=0, description="torch threads per process (0 = torch's default; the local launcher gives "
                                              "each worker cores / processes unless OMP_NUM_THREADS is set)")
    progress: bool = Field(True, description="progress bar on rank 0")
    inner: InnerSection = Field(default_factory=InnerSection)
    outer: OuterSection = Field(default_factory=OuterSection)
    noloco: NoLoCoSection = Field(default_factory=NoLoCoSection)
    diloco: DiLoCoSection = Field(default_factory=DiLoCoSection)
    exchange: ExchangeSection = Field(default_factory=ExchangeSection)
    data: DataSection = Field(default_factory=DataSection)
    log: LogSection = Field(default_factory=LogSection)
    faults: FaultSection = Field(default_factory=FaultSection)
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    network: NetworkSection = Field(default_factory=NetworkSection)

    @model_validator(mode="before")
    @classmethod
    def _nproc_is_replicas(cls, data: Any) -> Any:
        if isinstance(data, dict) and "nproc" in data:
            raise ValueError("nproc: the number of replicas is called replicas (--replicas M); nproc was its old name")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "TrainConfig":
        if self.stages > 1 and self.batch_size % self.pipeline.micro_batches:
            raise ValueError(f"batch_size ({self.batch_size}) is not divisible by pipeline.micro_batches "
                             f"({self.pipeline.micro_batches})")
        if self.stop_after is not None and self.stop_after > self.steps:
            raise ValueError(f"stop_after ({self.stop_after}) is past steps ({self.steps})")
        if self.method == "noloco" and self.noloco.group_size > self.replicas and self.replicas > 1:
            raise ValueError(f"noloco.group_size ({self.noloco.group_size}) is larger than replicas ({self.replicas})")
        if self.exchange.compress != "none" and self.method != "noloco":
            raise ValueError(f"exchange.compress: '{self.exchange.compress}' compresses NoLoCo's pair exchange; method "
                             f"'{self.method}' averages by all-reduce, which is sent in fp32 (allowed: none)")
        if self.backend == "in_process":
            if self.stages > 1:
                raise ValueError("stages: pipeline stages need one process per stage; backend in_process runs whole "
                                 "replicas only (use backend auto, gloo or nccl)")
            if self.network.inject:
                raise ValueError("network.inject: backend in_process never sleeps; it charges the network.* link to "
                                 "its simulated clock (set network.inject false)")
            if self.faults.exit_rank is not None:
                raise ValueError("faults.exit_rank: an abrupt exit would end every replica of backend in_process, "
                                 "which share one process (faults.stall_rank works: the stall goes on the simulated clock)")
        return self
