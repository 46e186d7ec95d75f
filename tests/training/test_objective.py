"""The answer-weighted objective on the real transformers model: K draws per encoder pass, pad weight, answer figures."""

import logging
import random
import warnings

import pytest
import torch

from dgemma_lsp.engine.model.tiny_model import build_tiny_model, build_tiny_tokenizer
from dgemma_lsp.engine.training.corpus import CodeFile
from dgemma_lsp.engine.training.examples import ExampleMaker
from dgemma_lsp.engine.training.objective import answer_positions, collate, diffusion_loss

SAMPLE = '''import os


def total(values, start=0):
    """Sum of values after start."""
    result = start
    for value in values:
        if value > 0:
            result += value
        else:
            result -= abs(value)
    return result


class Box:
    def __init__(self, items):
        self.items = list(items)
        self.size = len(self.items)

    def first(self):
        return self.items[0] if self.items else None
'''


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def batch(tokenizer):
    maker = ExampleMaker(tokenizer, 32, max_prompt_tokens=300, context_tokens=(24, 120))
    file = CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)
    rows = [e for seed in range(40) if (e := maker.make(file, random.Random(seed)))][:3]
    assert len({len(e.prompt_ids) for e in rows}) > 1, "the batch must need padding"
    return collate([e.prompt_ids for e in rows], [e.canvas_ids for e in rows], tokenizer.pad_token_id, maker.end_id)


def test_the_answer_is_every_position_up_to_the_first_end_of_turn():
    canvas = torch.tensor([[7, 8, 5, 0, 0], [5, 0, 0, 0, 0], [9, 9, 9, 9, 5]])
    assert answer_positions(canvas, pad_id=0, end_id=5).tolist() == [
        [True, True, True, False, False], [True, False, False, False, False], [True] * 5]
    # An end-of-turn id inside the pad (or a second one) is not answer.
    assert answer_positions(torch.tensor([[7, 5, 0, 5]]), 0, 5).tolist() == [[True, True, False, False]]


def test_k_draws_share_one_encoder_pass_and_each_draw_reads_its_own_prompt(batch):
    model = build_tiny_model().eval()
    calls = {"encoder": [], "decoder": []}
    hooks = [
        model.model.encoder.register_forward_hook(
            lambda module, args, kwargs, out: calls["encoder"].append(kwargs["input_ids"].shape), with_kwargs=True),
        model.model.decoder.register_forward_hook(
            lambda module, args, kwargs, out: calls["decoder"].append((kwargs["decoder_input_ids"], out.last_hidden_state)),
            with_kwargs=True),
    ]
    try:
        with torch.no_grad():
            parts = diffusion_loss(model, batch, torch.Generator().manual_seed(0), draws=4, self_conditioning=0.0)
    finally:
        for hook in hooks:
            hook.remove()
    rows = batch.prompt_ids.shape[0]
    assert calls["encoder"] == [batch.prompt_ids.shape]  # one encoder pass over the 3 prompts
    assert len(calls["decoder"]) == 1
    canvases, hidden = calls["decoder"][0]
    assert canvases.shape == (4 * rows, 32)
    assert parts.answer_tokens == 4 * int(batch.answer_mask.sum())
    # The 4 draws of a prompt are different corruptions of the same clean canvas...
    assert len({tuple(c.tolist()) for c in canvases[:4]}) == 4
    # ...and each decodes exactly as generate's own forward does with that prompt alone.
    logits = model.lm_head(hidden).float()
    cap = model.final_logit_softcapping
    logits = torch.tanh(logits / cap) * cap
    with torch.no_grad():
        for row in range(rows):
            prompt = batch.prompt_ids[row][batch.prompt_mask[row].bool()]
            for draw in (0, 3):
                alone = model(input_ids=prompt[None], decoder_input_ids=canvases[row * 4 + draw][None]).logits
                assert torch.allclose(logits[row * 4 + draw], alone[0], atol=1e-4)


def test_the_objective_prints_no_deprecation(batch):
    """`dgemma-lsp train` printed transformers' "`past_key_values`/`cache_params` are deprecated"
    (a `warning_once` on its logger, read from the encoder's output) and must print nothing."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    library, keep = logging.getLogger("transformers"), Keep()
    library.addHandler(keep)
    # Each `warning_once` message is printed once per process: another test may have used it up.
    getattr(logging.Logger.warning_once, "cache_clear", lambda: None)()
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            diffusion_loss(build_tiny_model().eval(), batch, torch.Generator().manual_seed(0), draws=2)
    finally:
        library.removeHandler(keep)
    assert [m for m in messages if "deprecated" in m.lower()] == []
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []


def test_pad_after_the_answer_weighs_what_the_recipe_says(batch):
    model = build_tiny_model().eval()

    def loss(pad_weight):
        with torch.no_grad():
            return diffusion_loss(model, batch, torch.Generator().manual_seed(1), draws=2, self_conditioning=0.0,
                                  pad_weight=pad_weight)

    answer_only, plain, tenth = loss(0.0), loss(1.0), loss(0.1)
    answers = 2 * int(batch.answer_mask.sum())
    pads = 2 * batch.answer_mask.numel() - answers
    assert pads > answers, "the canvases must be mostly pad for the test to mean anything"
    # Pad weight 0: the loss is the answer's loss alone.
    assert answer_only.diffusion == pytest.approx(answer_only.answer_loss, rel=1e-5)
    # Weight w: (answer sum + w * pad sum) / (answers + w * pads), with the sums read off w = 0 and w = 1.
    answer_sum = answer_only.diffusion * answers
    pad_sum = plain.diffusion * (answers + pads) - answer_sum
    assert tenth.diffusion == pytest.approx((answer_sum + 0.1 * pad_sum) / (answers + 0.1 * pads), rel=1e-4)
    assert plain.answer_loss == pytest.approx(answer_only.answer_loss, rel=1e-5)  # same draws, same figures


def test_one_draw_and_full_pad_weight_is_the_plain_canvas_mean(batch):
    model = build_tiny_model().eval()
    seen = []
    hook = model.model.decoder.register_forward_hook(lambda module, args, out: seen.append(out.last_hidden_state))
    try:
        with torch.no_grad():
            parts = diffusion_loss(model, batch, torch.Generator().manual_seed(2), self_conditioning=0.0)
    finally:
        hook.remove()
    logits = model.lm_head(seen[0]).float()
    logits = torch.tanh(logits / model.final_logit_softcapping) * model.final_logit_softcapping
    plain = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.canvas_ids.reshape(-1))
    assert parts.diffusion == pytest.approx(plain.item(), rel=1e-5)
    hits = logits.argmax(-1) == batch.canvas_ids
    assert parts.answer_accuracy == pytest.approx(hits[batch.answer_mask].float().mean().item())
    assert parts.canvas_accuracy == pytest.approx(hits.float().mean().item())


def test_clean_weight_zero_is_the_mean_over_the_corrupted_positions(batch):
    """`clean_weight` 0: only positions the corruption changed carry the loss (pad weight 1 here)."""
    model = build_tiny_model().eval()
    seen, canvases = [], []
    hooks = [model.model.decoder.register_forward_hook(lambda module, args, out: seen.append(out.last_hidden_state)),
             model.model.decoder.register_forward_pre_hook(
                 lambda module, args, kwargs: canvases.append(kwargs["decoder_input_ids"]), with_kwargs=True)]
    try:
        with torch.no_grad():
            parts = diffusion_loss(model, batch, torch.Generator().manual_seed(6), self_conditioning=0.0,
                                   clean_weight=0.0)
    finally:
        for hook in hooks:
            hook.remove()
    logits = model.lm_head(seen[0]).float()
    logits = torch.tanh(logits / model.final_logit_softcapping) * model.final_logit_softcapping
    per_position = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch.canvas_ids, reduction="none")
    changed = canvases[0] != batch.canvas_ids  # a noise token equal to the clean one by chance counts as clean here
    assert 0 < int(changed.sum()) < changed.numel(), "the draw must leave some positions clean"
    assert parts.diffusion == pytest.approx(per_position[changed].mean().item(), rel=2e-3)
    assert parts.diffusion != pytest.approx(per_position.mean().item(), rel=2e-3)


def test_a_noise_floor_corrupts_every_canvas_at_least_that_much(batch):
    """The decoder's input canvases: with the floor at 0.95 every row is nearly all noise; without it, some are not."""
    model = build_tiny_model().eval()

    def changed_shares(noise_floor):
        canvases = []
        hook = model.model.decoder.register_forward_pre_hook(
            lambda module, args, kwargs: canvases.append(kwargs["decoder_input_ids"]), with_kwargs=True)
        try:
            with torch.no_grad():
                diffusion_loss(model, batch, torch.Generator().manual_seed(3), draws=8, self_conditioning=0.0,
                               noise_floor=noise_floor)
        finally:
            hook.remove()
        clean = batch.canvas_ids.repeat_interleave(8, dim=0)
        return (canvases[0] != clean).float().mean(-1).tolist()

    assert min(changed_shares(0.95)) >= 0.8
    assert min(changed_shares(0.0)) < 0.5


def test_the_compiled_bf16_head_gives_the_eager_heads_loss_and_gradients(batch):
    """`LMHead(compiled=True)` (torch.compile, bf16 matmul) trains what the eager fp32 head trains: the same
    loss to bf16's precision and gradients pointing the same way, on every weight of the model."""
    from dgemma_lsp.engine.training.objective import LMHead

    def loss_and_gradients(head):
        model.zero_grad()
        parts = diffusion_loss(model, batch, torch.Generator().manual_seed(5), draws=2, pad_weight=0.1,
                               answer_encoder_weight=1.0, head=head)
        parts.total.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return parts, grads

    model = build_tiny_model().train()
    eager, eager_grads = loss_and_gradients(LMHead(model))
    compiled, compiled_grads = loss_and_gradients(LMHead(model, compiled=True))
    for name in ("diffusion", "encoder", "answer_encoder", "answer_loss"):
        assert getattr(compiled, name) == pytest.approx(getattr(eager, name), rel=1e-2), name
    assert compiled.canvas_accuracy == pytest.approx(eager.canvas_accuracy, abs=0.02)
    cosine = torch.nn.functional.cosine_similarity(compiled_grads, eager_grads, dim=0)
    assert cosine > 0.99 and compiled_grads.norm() == pytest.approx(eager_grads.norm().item(), rel=0.05)
