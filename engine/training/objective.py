"""The training objective of DiffusionGemma, on transformers' own `DiffusionGemmaForBlockDiffusion`.

Per batch (shared/REFERENCE.md, "Training objective"):
- the encoder reads the clean prompt causally and fills the KV cache the decoder reads;
- each example draws a corruption level t ~ U(eps, 1); every canvas position is independently
  replaced by a uniformly random vocabulary token with probability t (uniform-state noise:
  there is no [MASK] token);
- the decoder (bidirectional over the canvas, attending to the cached prompt) predicts the
  clean token at every canvas position: cross-entropy over all of them, corrupted or not;
- with probability `self_conditioning` per example, a first decoder pass's logits (no
  gradient) are fed back as self-conditioning for the pass that is trained;
- plus `encoder_loss_weight` × the encoder's causal next-token loss.

Two choices of ours spend the CPU on the answer (issue 28):
- `draws` corruption draws per encoded prompt: the decoder is read-only over the encoder's
  KV cache (transformers' DiffusionGemmaDecoderTextAttention never writes it), so the cache
  is repeated `draws` times along the batch (`DynamicCache.batch_repeat_interleave`) and one
  decoder pass over draws × rows canvases gets draws× the answer targets for one encoder pass;
- a weighted canvas loss: the answer's tokens and the first end-of-turn weigh 1, the pad
  after it `pad_weight` (the model must still learn to stop, but pad is most of a canvas).
  `draws=1, pad_weight=1` is the plain mean over the canvas, as before;
- `clean_weight`: what a position the corruption left clean weighs (1: all positions alike, as in
  the reference recipe). A clean position asks the decoder only to keep the token it is shown;
  the corrupted ones are where it learns to write from the prompt and the canvas around them.
The answer-only loss and accuracy (answer tokens + the first end-of-turn) are reported
beside the canvas figures: they are what the model is for.

The encoder's next-token loss covers the prompt, and with `answer_encoder_weight` > 0 the answer
too, as NeMo's recipe has it (the encoder reads prompt + response causally): a second, short
encoder pass continues from a copy of the prompt's cache over the clean canvas, so the decoder
still reads the prompt alone. The answer's causal loss teaches the shared weights the infill
itself (find the cursor, continue the code before it) with every earlier answer token given:
far easier to learn than from a canvas of noise, and it is what the decoder lacked (issue 28: a
decoder trained only on its own loss learned to copy its canvas and hardly read the prompt).
With the weight 0 (older recipes), one encoder pass over the prompt alone, as before.
Knows torch and the model; knows nothing of files or prompts' meaning.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..model.cache_keyword import with_cache


@dataclass(frozen=True)
class Batch:
    """Left-padded prompts and clean canvases, as tensors."""

    prompt_ids: torch.Tensor  # [B, P] left-padded with pad
    prompt_mask: torch.Tensor  # [B, P] 1 for real tokens
    canvas_ids: torch.Tensor  # [B, C] clean canvas (answer, end-of-turn, pad)
    answer_mask: torch.Tensor  # [B, C] True on the answer's tokens and the first end-of-turn


@dataclass(frozen=True)
class LossParts:
    total: torch.Tensor
    diffusion: float
    encoder: float
    canvas_accuracy: float
    """Share of canvas positions whose argmax is the clean token."""
    answer_loss: float = float("nan")
    """Cross-entropy over the answer's tokens and the first end-of-turn only."""
    answer_accuracy: float = float("nan")
    """Share of those positions whose argmax is the clean token."""
    answer_tokens: int = 0
    """Answer positions the decoder was trained on in this batch (every draw counts)."""
    answer_encoder: float = float("nan")
    """The encoder's next-token loss over the answer and its end-of-turn (answer_encoder_weight > 0)."""


def collate(prompts: list[list[int]], canvases: list[list[int]], pad_id: int, end_id: int | None = None) -> Batch:
    """Left-pad prompts so every row's last prompt token sits at the same place (sliding windows keep the recent end).

    `end_id`: the end-of-turn id; the answer is every position up to and including its first
    occurrence. Without it, the answer is every position that is not pad."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    canvas = torch.tensor(canvases, dtype=torch.long)
    return Batch(ids, mask, canvas, answer_positions(canvas, pad_id, end_id))


def answer_positions(canvas: torch.Tensor, pad_id: int, end_id: int | None) -> torch.Tensor:
    """True up to and including the first end-of-turn of each row (or on every non-pad token)."""
    if end_id is None:
        return canvas != pad_id
    is_end = (canvas == end_id).long()
    return (is_end.cumsum(-1) - is_end) == 0  # no end-of-turn strictly before this position


def softcapped_losses(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float,
                      bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position cross-entropy of the softcapped LM head, and whether its argmax is the target.

    `bf16`: the head's matmul in bf16 (fp32 accumulation; this CPU's AVX-512 BF16 runs it at twice
    fp32's rate); the softcap and the loss stay in fp32."""
    if bf16:
        logits = F.linear(hidden.to(torch.bfloat16), weight.to(torch.bfloat16)).float()
    else:
        logits = F.linear(hidden, weight).float()
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return F.cross_entropy(logits, targets, reduction="none"), logits.argmax(-1) == targets


class LMHead:
    """The LM head's losses for training: eager fp32 (the reference), or compiled with bf16 matmuls.

    The head over the vocabulary is most of a step of a 128-wide model: in eager mode its matmul, then
    the softcap's divide, tanh and multiply, the log-softmax and their backward each pass over a
    [positions, vocabulary] tensor (issue 28's profile: about half a step). `compiled=True` hands
    `softcapped_losses` to torch.compile (inductor fuses the passes after the matmul into one loop
    each way) with the matmul in bf16: the head and its loss take 2.4x less CPU on this machine, a
    step ~22% less. It needs a C compiler at the first step (inductor's C++ backend), hence a
    recipe's choice (`train.compiledHead`)."""

    def __init__(self, model, compiled: bool = False) -> None:
        self.model = model
        self.cap = float(model.final_logit_softcapping or 0.0)
        self.bf16 = compiled
        self._losses = torch.compile(softcapped_losses, dynamic=True) if compiled else softcapped_losses

    def losses(self, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-position loss, hits) over the last dimension of `hidden` [..., H] and `targets` [...]."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        losses, hits = self._losses(flat, self.model.lm_head.weight, targets.reshape(-1), self.cap, self.bf16)
        return losses.view(targets.shape), hits.view(targets.shape)


def softcapped_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head with the model's final logit softcap, as its forward applies it."""
    logits = model.lm_head(hidden).float()
    cap = model.final_logit_softcapping
    if not cap:
        return logits
    if not torch.is_grad_enabled():  # no graph to keep: in place, three passes over the logits and no copies
        return logits.div_(cap).tanh_().mul_(cap)
    return torch.tanh(logits / cap) * cap


def diffusion_loss(model, batch: Batch, generator: torch.Generator, *, self_conditioning: float = 0.5,
                   encoder_loss_weight: float = 1.0, eps: float = 1e-3, draws: int = 1,
                   pad_weight: float = 1.0, noise_floor: float = 0.0, answer_encoder_weight: float = 0.0,
                   clean_weight: float = 1.0, head: LMHead | None = None) -> LossParts:
    """The loss of one batch; call `.total.backward()` on the result.

    `noise_floor`: the lowest corruption level drawn (levels are uniform in [max(eps, floor), 1]).
    Generation starts from a canvas of pure noise and renoises every token it does not accept, so
    the canvases a model reads while writing are mostly noise; below the floor the decoder mostly
    learns to copy the clean tokens it is shown."""
    assert draws >= 1, "draws counts corruption draws per encoded prompt"
    head = head or LMHead(model)
    device = batch.prompt_ids.device
    vocab = model.config.text_config.vocab_size

    # Encoder: the clean prompt, causal; positions count real tokens only (left padding).
    positions = (batch.prompt_mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
    # The encoder fills the cache it is given in place: keep our own reference rather than read it back
    # from the output (`encoder.past_key_values` is the deprecated name since transformers 5.24 and printed
    # its warning at every `dgemma-lsp train`; `cache`, its new name, does not exist in 5.23).
    cache = DynamicCache(config=model.config.text_config)
    encoder = model.model.encoder(
        input_ids=batch.prompt_ids, attention_mask=batch.prompt_mask, position_ids=positions,
        **with_cache(cache), use_cache=True,
    )
    answer_encoder = answer_encoder_loss(model, batch, cache, encoder, head) if answer_encoder_weight > 0 else None
    # K draws: the decoder only reads the cache, so one encoder pass serves draws × rows canvases
    # (row r's draws are rows r*draws .. r*draws+draws-1).
    prompt_mask, clean, answer = batch.prompt_mask, batch.canvas_ids, batch.answer_mask
    if draws > 1:
        cache.batch_repeat_interleave(draws)
        prompt_mask, clean, answer = (x.repeat_interleave(draws, dim=0) for x in (prompt_mask, clean, answer))
    rows, canvas_length = clean.shape

    # Corrupt: level t per row, each position replaced by a uniform token with probability t.
    lowest = max(eps, noise_floor)
    t = lowest + (1 - lowest) * torch.rand(rows, 1, generator=generator, device=device)  # [B, 1]
    corrupt = torch.rand(rows, canvas_length, generator=generator, device=device) < t  # [B, C]
    noise = torch.randint(0, vocab, (rows, canvas_length), generator=generator, device=device)
    canvas = torch.where(corrupt, noise, clean)  # [B, C]

    lengths = prompt_mask.sum(-1, keepdim=True)  # [B, 1]
    decoder_kwargs = dict(
        **with_cache(cache),
        decoder_attention_mask=torch.cat([prompt_mask, torch.ones_like(canvas)], dim=-1),
        decoder_position_ids=lengths + torch.arange(canvas_length, device=device),  # [B, C]
    )
    conditioned = torch.rand(rows, generator=generator, device=device) < self_conditioning  # [B]
    previous = None
    if bool(conditioned.any()):
        with torch.no_grad():
            first = model.model.decoder(decoder_input_ids=canvas, **decoder_kwargs)
            previous = softcapped_logits(model, first.last_hidden_state)  # [B, C, V]
    decoded = model.model.decoder(
        decoder_input_ids=canvas, self_conditioning_logits=previous,
        self_conditioning_mask=conditioned if previous is not None else None, **decoder_kwargs,
    )
    per_position, hits = head.losses(decoded.last_hidden_state, clean)  # [B, C] each
    weights = torch.where(answer, 1.0, pad_weight)  # [B, C]
    if clean_weight != 1.0:
        weights = weights * torch.where(corrupt, 1.0, clean_weight)
    diffusion = (per_position * weights).sum() / weights.sum()

    # Encoder: next-token loss on the prompt's real tokens. The LM head runs on those positions alone:
    # left padding is ~30% of a batch's prompt positions, and the head over the vocabulary is most of a step.
    predicts = (batch.prompt_mask[:, 1:] == 1) & (batch.prompt_mask[:, :-1] == 1)  # [B, P-1]
    encoder_loss = head.losses(encoder.last_hidden_state[:, :-1][predicts], batch.prompt_ids[:, 1:][predicts])[0].mean()

    total = diffusion + encoder_loss_weight * encoder_loss
    if answer_encoder is not None:
        total = total + answer_encoder_weight * answer_encoder
    answer_count = int(answer.sum())
    return LossParts(
        total=total, diffusion=diffusion.item(), encoder=encoder_loss.item(), canvas_accuracy=hits.float().mean().item(),
        answer_loss=(per_position.detach()[answer].mean().item()), answer_accuracy=hits[answer].float().mean().item(),
        answer_tokens=answer_count,
        answer_encoder=answer_encoder.item() if answer_encoder is not None else float("nan"),
    )


def answer_encoder_loss(model, batch: Batch, cache, encoded, head: LMHead | None = None) -> torch.Tensor:
    """The encoder's causal next-token loss over the answer and its first end-of-turn.

    Runs on a copy of the prompt's cache (the decoder must read the prompt alone): the last
    prompt position predicts the answer's first token, each answer position the next."""
    import copy

    # A shallow copy per layer is enough: a layer's update concatenates into new tensors and leaves
    # the prompt's keys and values (which carry the graph: no deepcopy) as the decoder will read them.
    answer_cache = copy.copy(cache)
    answer_cache.layers = [copy.copy(layer) for layer in cache.layers]
    rows, canvas_length = batch.canvas_ids.shape
    lengths = batch.prompt_mask.sum(-1, keepdim=True)  # [B, 1]
    answer_mask = batch.answer_mask.long()
    continued = model.model.encoder(
        input_ids=batch.canvas_ids, attention_mask=torch.cat([batch.prompt_mask, answer_mask], dim=-1),
        position_ids=lengths + torch.arange(canvas_length, device=lengths.device), **with_cache(answer_cache),
        use_cache=True,
    )
    # Inputs: the last prompt position, then the answer's tokens; targets: the answer's tokens.
    hidden = torch.cat([encoded.last_hidden_state[:, -1:], continued.last_hidden_state[:, :-1]], dim=1)
    answer = batch.answer_mask
    return (head or LMHead(model)).losses(hidden[answer], batch.canvas_ids[answer])[0].mean()
