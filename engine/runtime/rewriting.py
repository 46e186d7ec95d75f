""""Rewrite selection" as a real partial renoise of the selection, canvas by canvas.

The training corruption of DiffusionGemma (REFERENCE.md) replaces each canvas
position by a uniformly random token with probability t. A rewrite at
`strength` s is the reverse process started at time s instead of 1:

- each canvas starts as the selection's own tokens (then the chat template's
  turn-end token, then pad) with every position replaced by noise with
  probability s; the positions left alone are the *kept* tokens;
- the schedule starts at time s: ceil(s * N) of the N steps run, and the linear
  temperature schedule is cut to the same tail (t at step k is what the full
  N-step schedule gives at step k), instead of restarting at t_max;
- the kept tokens stay visible to the model for the whole run, in one or both of
  two ways (`DenoiseRequest.rewrite_keep`): "canvas" pins them (their logits are
  made one-hot at every step, so their entropy is 0, the entropy-bound sampler
  always accepts them and never renoises them, and the argmax canvas carries
  them); "prompt" writes the original selection into the prompt as the code
  being rewritten, and lets the sampler change any position; "both" does both;
- a selection longer than a canvas is rewritten canvas by canvas: transformers'
  `decoder_input_ids=` only sets the first canvas, so a sampler of our own
  (`_prepare_sampler` is the one hook generate offers) hands out each canvas's
  starting point, and the pin processor finds the canvas from input_ids' length;
- an end token before the last kept token would cut kept tokens off (an answer
  ends at its first end token), so the pin processor forbids it there.

Which keeping works better needs the trained tiny model (issue 14): on a random
model only the mechanics can be shown (bench/rewrite.py). Knows torch and
transformers' DiffusionGemma sampler; knows nothing of prompts' text or LSP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    EntropyBoundSampler,
    EntropyBoundSamplerConfig,
)

PINNED_LOGIT = -1.0e4
"""What every other token gets at a pinned position: large and finite (-inf gives NaN entropies)."""
KEEP_MODES = ("canvas", "prompt", "both")


@dataclass(frozen=True)
class RewriteSchedule:
    """Where on the N-step schedule a rewrite of a given strength starts."""

    steps: int
    """Denoising steps per canvas: the last `steps` of the full N."""
    t_start: float
    """Temperature at the first of them (the full schedule's temperature there)."""


def rewrite_schedule(strength: float, full_steps: int, t_max: float, t_min: float) -> RewriteSchedule:
    """The tail of the full schedule that starts at time `strength`.

    transformers' LinearTemperatureScheduleLogitsProcessor gives, at remaining step
    k of `steps`, t_min + (t_start - t_min) * k / steps; with t_start set as below that
    equals the full schedule's t_min + (t_max - t_min) * k / full_steps.
    """
    assert 0.0 < strength <= 1.0, f"strength {strength} outside (0, 1]"
    steps = max(1, math.ceil(strength * full_steps - 1e-9))
    return RewriteSchedule(steps=steps, t_start=t_min + (t_max - t_min) * steps / full_steps)


def turn_end_id(tokenizer) -> int | None:
    """The token the chat template closes a model turn with (`<turn|>` for Gemma), or None.

    Read from the template itself: render one model turn around a placeholder and take
    the first special token after it.
    """
    placeholder = "\x00ANSWER\x00"
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "?"}, {"role": "assistant", "content": placeholder}], tokenize=False
        )
    except Exception:  # noqa: BLE001 - a template without a model turn: no turn end to use
        return None
    after = rendered.split(placeholder, 1)[-1] if placeholder in rendered else ""
    special = set(tokenizer.all_special_ids) | {
        token_id for token_id, token in tokenizer.added_tokens_decoder.items() if token.special
    }
    for token_id in tokenizer(after, add_special_tokens=False)["input_ids"]:
        if token_id in special:
            return token_id
    return None


class SelectionCanvases:
    """The selection cut into canvases, each with its noise: starting canvases and kept masks."""

    def __init__(
        self, ids: list[int], end_id: int, pad_id: int, canvas_length: int, vocab_size: int,
        strength: float, batch: int, device: torch.device,
    ) -> None:
        self.canvas_length = canvas_length
        self.count = max(1, math.ceil((len(ids) + 1) / canvas_length))
        padded = ids + [end_id] + [pad_id] * (self.count * canvas_length - len(ids) - 1)
        clean = torch.tensor(padded, device=device).view(self.count, 1, canvas_length)
        self.clean = clean.expand(self.count, batch, canvas_length)  # [C, B, L]
        # Training corruption at time `strength`: each position independently noised.
        self.kept = torch.rand(self.clean.shape, device=device) >= strength  # [C, B, L]
        noise = torch.randint(0, vocab_size, self.clean.shape, device=device)
        self.start = torch.where(self.kept, self.clean, noise)  # [C, B, L]
        # An answer ends at its first end token: one before a kept token would cut that token off.
        flat_kept = self.kept.permute(1, 0, 2).reshape(batch, -1)  # [B, C*L]
        positions = torch.arange(flat_kept.shape[1], device=device)
        last_kept = torch.where(flat_kept, positions, -1).max(dim=-1).values  # [B]
        self.before_last_kept = (positions[None, :] < last_kept[:, None]).view(batch, self.count, canvas_length)
        self.before_last_kept = self.before_last_kept.permute(1, 0, 2)  # [C, B, L]


class SelectionSampler(EntropyBoundSampler):
    """The entropy-bound sampler, but each new canvas starts from the selection's own noisy canvas."""

    def __init__(self, canvases: SelectionCanvases, entropy_bound: float, vocab_size: int, steps: int) -> None:
        super().__init__(
            EntropyBoundSamplerConfig(entropy_bound=entropy_bound),
            canvas_length=canvases.canvas_length, vocab_size=vocab_size, max_denoising_steps=steps,
        )
        self.canvases = canvases
        self.started = 0

    def initialize_canvas(self, batch_size: int, device: torch.device) -> torch.LongTensor:
        # generate calls this exactly once per canvas (and we never pass decoder_input_ids).
        index, self.started = self.started, self.started + 1
        if index < self.canvases.count:
            return self.canvases.start[index].clone()
        return torch.randint(0, self.vocab_size, (batch_size, self.canvas_length), device=device)

    def renoise_canvas(self, accepted_canvas: torch.LongTensor, cur_step: int) -> torch.LongTensor:
        # The parent draws its noise through initialize_canvas, which here means "next canvas".
        noise = torch.randint(0, self.vocab_size, accepted_canvas.shape, device=accepted_canvas.device)
        return torch.where(self.accepted_token_mask, accepted_canvas, noise)


class PinKeptTokens(LogitsProcessor):
    """Makes the kept tokens' logits one-hot at every step of their canvas."""

    def __init__(self, canvases: SelectionCanvases, prompt_length: int, end_ids: list[int]) -> None:
        self.canvases = canvases
        self.prompt_length = prompt_length  # input_ids' length at the first canvas
        self.end_ids = end_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor, cur_step) -> torch.Tensor:
        # input_ids grows by one canvas per finished canvas: its length says which canvas this is.
        index = (input_ids.shape[1] - self.prompt_length) // self.canvases.canvas_length
        if index >= self.canvases.count:
            return scores
        kept = self.canvases.kept[index].unsqueeze(-1)  # [B, L, 1]
        clean = self.canvases.clean[index].unsqueeze(-1)  # [B, L, 1]
        pinned = scores.masked_fill(kept, PINNED_LOGIT)  # scores: [B, L, V]
        own = scores.gather(-1, clean)
        pinned = pinned.scatter(-1, clean, torch.where(kept, torch.zeros_like(own), own))
        # No end token where a kept token still follows (pinned positions are one-hot already).
        early = self.canvases.before_last_kept[index] & ~self.canvases.kept[index]  # [B, L]
        pinned[..., self.end_ids] = pinned[..., self.end_ids].masked_fill(early.unsqueeze(-1), PINNED_LOGIT)
        return pinned
