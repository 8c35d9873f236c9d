"""Cutting a Hugging Face decoder-only LM into pipeline stages (for NoLoCo's random pipeline routing, arXiv 2506.10911).

:func:`build_stage` takes the whole ``*ForCausalLM`` model (every process builds the same one from
the shared seed, so all stages start from the model an unsplit run would train) and keeps one
contiguous run of its decoder layers:

- stage 0 also holds the token embedding (its input is token ids);
- the last stage also holds the final norm and the LM head (its output is logits, and it computes
  the loss from the labels that travelled with the activations);
- every stage recomputes what the decoder layers need besides the hidden states from the sequence
  length alone: the position ids (0..T-1), the rotary embeddings (cos, sin) from the model's own
  rotary module, and the attention mask through the model's own ``create_causal_mask`` (and the
  sliding-window mask for models whose ``config.layer_types`` use it). Nothing but the hidden
  states therefore crosses a stage boundary, and a stage's layers compute exactly what they compute
  inside the unsplit model.

Tied embeddings are untied
--------------------------
Presets such as ``tiny-llama`` tie the LM head to the token embedding. Cut across stages, the two
uses of that one matrix live in different processes (stage 0 and stage S-1), and with random routing
the last stage that scores a micro-batch is not even in the same replica as the first stage that
embedded it. Keeping them tied would need an extra gradient exchange between first and last stages
every step (and a deadline on it). Instead the last stage's head starts as an exact copy of the
embedding and the two are trained as separate matrices from then on, as in the untied reference
shapes (``llama-125m`` and up). With identity routing and S = 2, the gradient of the tied matrix in
the unsplit model is the sum of the two stages' gradients (the tests check this).

Activation recomputation (``recompute=True``) wraps each decoder layer in
``torch.utils.checkpoint`` (non-reentrant): only layer inputs are kept, and the layer is run again
in the backward pass. Non-reentrant checkpointing passes gradients to every parameter whatever
``requires_grad`` its inputs have, so the embedding of stage 0 receives its gradient with or without
recomputation (the NoLoCo reference lost it).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

STAGE_FILE = "stage.json"


class UnsupportedModel(ValueError):
    """The model does not have the decoder-only layout this module can cut."""


def split_layers(num_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer ranges, as even as possible; the earlier stages take the remainder."""
    if num_stages < 1 or num_layers < num_stages:
        raise ValueError(f"cannot cut {num_layers} layers into {num_stages} stages (each stage needs a layer)")
    base, extra = divmod(num_layers, num_stages)
    ranges, start = [], 0
    for s in range(num_stages):
        n = base + (1 if s < extra else 0)
        ranges.append(range(start, start + n))
        start += n
    return ranges


def _decoder_parts(causal_lm: nn.Module) -> tuple[nn.Module, nn.Module]:
    base = getattr(causal_lm, "model", None)
    head = getattr(causal_lm, "lm_head", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if base is None or head is None or not all(hasattr(base, n) for n in needed):
        raise UnsupportedModel(
            f"{type(causal_lm).__name__} cannot be cut into pipeline stages: expected a decoder-only causal LM with "
            f"model.embed_tokens, model.layers, model.norm, model.rotary_emb and lm_head (Llama, Qwen2, Mistral...)")
    return base, head


class _MaskMaker:
    """The attention masks the unsplit model would build, by layer type (None where SDPA's causal flag does)."""

    def __init__(self, config):
        from transformers import masking_utils

        self.config = config
        self.full = masking_utils.create_causal_mask
        self.sliding = getattr(masking_utils, "create_sliding_window_causal_mask", None)
        params = inspect.signature(self.full).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    def __call__(self, hidden: torch.Tensor, position_ids: torch.Tensor, kinds: set[str]) -> dict[str, object]:
        kwargs = {"config": self.config, "inputs_embeds": hidden, "attention_mask": None, self.cache_kw: None,
                  "position_ids": position_ids}
        masks: dict[str, object] = {}
        for kind in kinds:
            if kind == "sliding_attention":
                if self.sliding is None:  # pragma: no cover - old transformers
                    raise UnsupportedModel("this transformers version has no sliding-window masks")
                masks[kind] = self.sliding(**kwargs)
            else:
                masks[kind] = self.full(**kwargs)
        return masks


class StageModule(nn.Module):
    """One pipeline stage: a contiguous run of decoder layers, plus the embedding (first stage) and the
    final norm and LM head (last stage).

    ``forward`` takes token ids (first stage) or hidden states, and returns hidden states, or logits
    from the last stage. ``loss`` scores logits against labels as the HF model does (next-token cross
    entropy in fp32, positions with label -100 ignored).
    """

    def __init__(self, causal_lm: nn.Module, stage: int, num_stages: int, *, recompute: bool = False):
        super().__init__()
        base, head = _decoder_parts(causal_lm)
        config = causal_lm.config
        num_layers = len(base.layers)
        self.stage = stage
        self.num_stages = num_stages
        self.layer_range = split_layers(num_layers, num_stages)[stage]
        self.recompute = recompute
        self.config = config
        self.first = stage == 0
        self.last = stage == num_stages - 1
        self.embed_tokens = base.embed_tokens if self.first else None
        self.layers = nn.ModuleList(base.layers[i] for i in self.layer_range)
        layer_types = getattr(config, "layer_types", None)
        self.layer_kinds = [layer_types[i] if layer_types else "full_attention" for i in self.layer_range]
        self.rotary_emb = base.rotary_emb  # buffers only (inv_freq), no parameters
        self.norm = base.norm if self.last else None
        self.lm_head = None
        self.untied = False
        if self.last:
            self.lm_head = head
            if num_stages > 1 and head.weight is base.embed_tokens.weight:
                # Untie (see the module docstring): the head starts as a copy of the embedding.
                self.lm_head = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None,
                                         device=head.weight.device, dtype=head.weight.dtype)
                with torch.no_grad():
                    self.lm_head.weight.copy_(head.weight)
                    if head.bias is not None:
                        self.lm_head.bias.copy_(head.bias)
                self.untied = True
        self._masks = _MaskMaker(config)

    def describe(self) -> dict:
        return {"stage": self.stage, "num_stages": self.num_stages, "layers": [self.layer_range.start, self.layer_range.stop],
                "embedding": self.first, "head": self.last, "untied_head": self.untied,
                "model_type": getattr(self.config, "model_type", None)}

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(inputs) if self.first else inputs
        seq_len = hidden.shape[1]
        position_ids = torch.arange(seq_len, device=hidden.device).unsqueeze(0)
        position_embeddings = self.rotary_emb(hidden, position_ids)
        masks = self._masks(hidden, position_ids, set(self.layer_kinds))
        for layer, kind in zip(self.layers, self.layer_kinds):
            kwargs = {"attention_mask": masks[kind], "position_embeddings": position_embeddings,
                      "position_ids": position_ids}
            if self.recompute and self.training and torch.is_grad_enabled():
                out = checkpoint(layer, hidden, use_reentrant=False, **kwargs)
            else:
                out = layer(hidden, **kwargs)
            hidden = out[0] if isinstance(out, tuple) else out
        if self.last:
            hidden = self.lm_head(self.norm(hidden))
        return hidden

    @staticmethod
    def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sequence sum of next-token losses and count of scored tokens (fp32), as HF's causal-LM loss
        computes them before its mean."""
        shift_logits = logits[:, :-1, :].float()
        shift_labels = labels[:, 1:].to(logits.device)
        losses = F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
                                 ignore_index=-100, reduction="none").view(shift_labels.shape)
        counts = (shift_labels != -100).sum(dim=1)
        return losses.sum(dim=1), counts

    @classmethod
    def loss(cls, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        sums, counts = cls.token_losses(logits, labels)
        return sums.sum() / counts.sum().clamp(min=1)

    # ----- checkpoints: a stage is saved as safetensors of its own parameters, with a description
    def save_pretrained(self, path: str | Path, safe_serialization: bool = True) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items() if not k.startswith("rotary_emb.")}
        save_file(state, str(path / "model.safetensors"))
        (path / STAGE_FILE).write_text(json.dumps(self.describe(), indent=1))
        self.config.save_pretrained(path)

    def load_saved(self, path: str | Path) -> None:
        from safetensors.torch import load_file

        path = Path(path)
        saved = json.loads((path / STAGE_FILE).read_text()) if (path / STAGE_FILE).exists() else None
        mine = self.describe()
        if saved is None or {k: saved.get(k) for k in ("stage", "num_stages", "layers")} != \
                {k: mine[k] for k in ("stage", "num_stages", "layers")}:
            raise RuntimeError(f"{path} holds {saved or 'no pipeline stage'}, not stage {self.stage} of {self.num_stages} "
                               f"(layers {mine['layers']}): resume with the same --stages, or --resume never")
        state = load_file(str(path / "model.safetensors"))
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith("rotary_emb.")]
        if missing or unexpected:
            raise RuntimeError(f"{path} does not fit stage {self.stage}: missing {missing}, unexpected {unexpected}")


def build_stage(causal_lm: nn.Module, stage: int, num_stages: int, *, recompute: bool = False) -> StageModule:
    """Stage ``stage`` of ``num_stages`` of ``causal_lm``; the layers of other stages are dropped from the
    returned module (``causal_lm`` itself should be discarded afterwards)."""
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage {stage} is not in 0..{num_stages - 1}")
    return StageModule(causal_lm, stage, num_stages, recompute=recompute)


def build_stages(causal_lm: nn.Module, num_stages: int, *, recompute: bool = False) -> list[StageModule]:
    """All stages of one model (for a single process, e.g. tests): they share ``causal_lm``'s parameters,
    except the untied head, which is a copy."""
    return [StageModule(causal_lm, s, num_stages, recompute=recompute) for s in range(num_stages)]
