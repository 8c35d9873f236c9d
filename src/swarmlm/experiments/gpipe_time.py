"""The modelled time of a pipelined inner step, for the simulated clock of ``swarmlm noloco compare``: a GPipe
schedule (all forwards, then all backwards) of equal stages on devices of their own, with every activation
hand-over charged one link message."""

from __future__ import annotations

from swarmlm.noloco.config import TrainConfig


def model_hidden_size(spec: str) -> int:
    """The hidden size of a model spec, without building the model."""
    from swarmlm.models import PRESETS

    if spec in PRESETS:
        return PRESETS[spec].hidden
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(spec).hidden_size)


def activation_bytes(config: TrainConfig) -> int:
    """Bytes of one micro-batch's hidden states at a stage boundary (4 bytes a value: the weights, and so
    the residual stream, are fp32), which is also the size of its gradient on the way back."""
    rows = config.batch_size // config.pipeline.micro_batches
    return 4 * rows * config.seq_len * model_hidden_size(config.model)


def gpipe_step_s(step_compute_s: float, stages: int, micro_batches: int, hop_s: float) -> float:
    """Modelled time of one pipelined inner step of a replica whose unsplit step takes ``step_compute_s``,
    cut into ``stages`` equal stages on devices of their own, with ``micro_batches`` micro-batches and a
    hand-over time ``hop_s`` per hop (e.g. the link's time for :func:`activation_bytes`).

    GPipe order with blocking hand-overs: forward and backward each take n + S − 1 slot periods on the
    critical path, and a period is one stage's compute for one micro-batch plus one hand-over. The
    forward and backward computes of a micro-batch at a stage add up to step_compute_s / (S·n)."""
    n, S = micro_batches, stages
    if S <= 1:
        return step_compute_s
    return (n + S - 1) * (step_compute_s / (S * n) + 2 * hop_s)
