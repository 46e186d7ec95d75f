"""The denoising runtime on the tiny model: the real transformers generate path, CPU only.

Asserts behaviour (counts, identity, cancellation), never wording or timings:
the tiny model's weights are random.
"""

import copy
import difflib
import math
import threading

import pytest
import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    EntropyBoundSamplerConfig,
    LinearTemperatureScheduleLogitsProcessor,
)

from dgemma_lsp.engine.api import DenoiseRequest, GenerationSettings, InfillContext
from dgemma_lsp.engine.errors import BadRequestError, CancelledError
from dgemma_lsp.engine.runtime.rewriting import (
    KEEP_MODES,
    PinKeptTokens,
    SelectionCanvases,
    rewrite_schedule,
    turn_end_id,
)

CONTEXT = InfillContext(
    prefix="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n", language="python"
)
# Far longer than the tiny model's 64-token sliding window.
LONG_CONTEXT = InfillContext(
    prefix="".join(f"def helper_{i}(x):\n    return x * {i}\n\n" for i in range(40)) + "def main():\n    ",
    suffix="\n\nmain()\n",
    language="python",
)


def request(context=CONTEXT, cache_key=None, **settings) -> DenoiseRequest:
    settings.setdefault("steps", 6)
    settings.setdefault("seed", 11)
    return DenoiseRequest(context=context, settings=GenerationSettings(**settings), cache_key=cache_key)


def test_same_seed_same_answer_and_other_seed_differs(runtime):
    first = runtime.run(request(seed=5))
    again = runtime.run(request(seed=5))
    other = runtime.run(request(seed=6))
    assert first.candidates == again.candidates
    assert first.candidates != other.candidates


def test_one_draft_per_step_in_order(runtime):
    drafts = []
    result = runtime.run(request(steps=7, early_stop=False), on_draft=drafts.append)
    assert result.steps == 7
    assert result.drafts == len(drafts) == result.steps
    assert [draft.step for draft in drafts] == list(range(1, 8))
    # The last draft is the answer's canvas before post-processing cut it at EOS.
    assert drafts[-1].text.startswith(result.candidates[0].text)


def test_cancel_mid_denoise_stops_within_one_step_then_serves_normally(runtime):
    cancel = threading.Event()
    seen = []

    def on_draft(draft):
        seen.append(draft.step)
        if draft.step == 3:
            cancel.set()

    with pytest.raises(CancelledError):
        runtime.run(request(steps=30, early_stop=False), on_draft=on_draft, cancel=cancel)
    assert seen == [1, 2, 3]
    after = runtime.run(request(seed=5))
    assert after.candidates == runtime.run(request(seed=5)).candidates


def test_answers_longer_than_a_canvas_take_more_canvases(runtime):
    canvas = runtime.canvas_length
    result = runtime.run(request(max_tokens=3 * canvas, steps=3, seed=4, early_stop=False))
    # The random model rarely emits EOS, so this seed runs all three canvases; each step is one draft.
    assert result.canvases == 3
    assert result.steps == 3 * 3
    assert result.candidates[0].tokens > canvas


def test_answers_and_drafts_carry_no_control_characters(runtime):
    drafts = []
    result = runtime.run(request(candidates=8, seed=21), on_draft=drafts.append)
    texts = [candidate.text for candidate in result.candidates] + [draft.text for draft in drafts]
    assert not [text for text in texts if any(ord(c) < 32 and c not in "\t\n\r" for c in text)]


def test_batched_candidates_come_from_one_call(runtime):
    result = runtime.run(request(candidates=4))
    assert len(result.candidates) == 4
    assert len({candidate.text for candidate in result.candidates}) > 1
    assert all(0.0 <= candidate.confidence <= 1.0 for candidate in result.candidates)


def test_prompt_cache_reuse_equals_full_prefill_past_the_sliding_window(runtime):
    sliding_window = runtime.model.config.text_config.sliding_window
    prompt = runtime.prompts.build(LONG_CONTEXT)
    assert len(prompt.stable) > 2 * sliding_window

    cold = runtime.run(request(LONG_CONTEXT, cache_key="doc-a", seed=9))
    warm = runtime.run(request(LONG_CONTEXT, cache_key="doc-a", seed=9))
    assert cold.cached_prompt_tokens == 0
    assert warm.cached_prompt_tokens == len(prompt.stable)

    # The reference: transformers' generate prefilling the whole prompt in one go.
    torch.manual_seed(9)
    full = runtime.model.generate(
        torch.tensor([prompt.all]),
        max_new_tokens=runtime.canvas_length,
        max_denoising_steps=6,
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.1),
    )
    reference = runtime._decode_answer(full.sequences[0, len(prompt.all):].tolist())
    assert cold.candidates[0].text == warm.candidates[0].text == reference


def test_a_changed_tail_reuses_the_stable_part(runtime):
    typed = InfillContext(prefix=LONG_CONTEXT.prefix + "x = ", suffix=LONG_CONTEXT.suffix, language="python")
    runtime.run(request(LONG_CONTEXT, cache_key="doc-b"))
    result = runtime.run(request(typed, cache_key="doc-b"))
    assert result.cached_prompt_tokens == len(runtime.prompts.build(typed).stable) > 0


# Five canvases of the tiny model (32 tokens each).
LONG_SELECTION = "".join(f"total = total + values[{i}] * {i}\n" for i in range(12))
MEDIUM_SELECTION = LONG_SELECTION[:200]


def kept_share(runtime, selection: str, answer: str) -> float:
    """Share of the selection's tokens found, in order, in the answer (difflib's matching blocks)."""
    before = runtime.tokenizer(selection, add_special_tokens=False)["input_ids"]
    after = runtime.tokenizer(answer, add_special_tokens=False)["input_ids"]
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) / len(before)


def rewrite(runtime, strength, seed, keep="canvas", selection=LONG_SELECTION, steps=8):
    return runtime.run(DenoiseRequest(
        context=CONTEXT, selection=selection, strength=strength, rewrite_keep=keep,
        settings=GenerationSettings(steps=steps, seed=seed),
    ))


def test_pinned_rewrite_keeps_most_at_low_strength_and_less_as_strength_rises(runtime):
    # By construction, not by training: kept tokens are pinned, so even the random model returns them.
    shares = {
        strength: sum(kept_share(runtime, MEDIUM_SELECTION, rewrite(runtime, strength, seed, selection=MEDIUM_SELECTION,
                                                                    steps=4).candidates[0].text)
                      for seed in (0, 1)) / 2
        for strength in (0.1, 0.5, 1.0)
    }
    assert shares[0.1] >= 0.75
    assert shares[0.1] > shares[0.5] > shares[1.0]


def test_a_selection_longer_than_a_canvas_is_rewritten_canvas_by_canvas(runtime):
    tokens = len(runtime.tokenizer(LONG_SELECTION, add_special_tokens=False)["input_ids"])
    canvases = math.ceil((tokens + 1) / runtime.canvas_length)
    assert canvases >= 3
    result = rewrite(runtime, 0.1, seed=0)
    assert result.canvases == canvases
    # Its last canvas came from the selection's end, not from fresh noise.
    answer = result.candidates[0].text
    assert kept_share(runtime, LONG_SELECTION[-60:], answer[-80:]) >= 0.6


def test_rewrite_runs_the_tail_of_the_schedule_that_starts_at_strength(runtime):
    result = rewrite(runtime, 0.25, seed=3, selection="a + b", steps=8)
    assert result.canvases == 1 and result.steps == 2  # ceil(0.25 * 8)
    schedule = rewrite_schedule(0.25, 48, t_max=0.8, t_min=0.4)
    assert schedule.steps == 12
    # transformers' own temperature processor, given the cut schedule, matches the full one step by step.
    cut = LinearTemperatureScheduleLogitsProcessor(t_min=0.4, t_max=schedule.t_start, max_denoising_steps=12)
    full = LinearTemperatureScheduleLogitsProcessor(t_min=0.4, t_max=0.8, max_denoising_steps=48)
    ones = torch.ones(1, 1, 1)
    for remaining in range(12, 0, -1):
        assert torch.allclose(cut(None, ones, remaining), full(None, ones, remaining))


def test_the_end_token_is_the_one_the_chat_template_ends_a_turn_with(runtime):
    turn_end = runtime.tokenizer.convert_tokens_to_ids("<turn|>")
    assert runtime.turn_end_id == turn_end
    assert turn_end not in runtime.model.generation_config.eos_token_id  # not the generation config's EOS
    ids = [7, 8, 9]
    canvases = SelectionCanvases(ids, runtime.turn_end_id, runtime.pad_id, 4, runtime.vocab_size,
                                 strength=0.5, batch=2, device=torch.device("cpu"))
    assert canvases.count == 1 and canvases.clean[0, 0].tolist() == [7, 8, 9, turn_end]
    other = copy.deepcopy(runtime.tokenizer)
    other.chat_template = "{% for m in messages %}{{ m['content'] }}<eos>\n{% endfor %}"
    assert turn_end_id(other) == other.eos_token_id


def test_pins_make_kept_tokens_certain_and_forbid_an_end_before_them(runtime):
    end_ids = sorted(runtime.eos_ids)
    canvases = SelectionCanvases([7, 8, 9, 10, 11, 12], runtime.turn_end_id, runtime.pad_id, 4, runtime.vocab_size,
                                 strength=0.5, batch=3, device=torch.device("cpu"))
    pin = PinKeptTokens(canvases, prompt_length=1, end_ids=end_ids)
    for index in range(canvases.count):
        scores = torch.randn(3, 4, runtime.vocab_size)
        scores[..., end_ids[0]] = 50.0  # the model would end everywhere
        out = pin(torch.zeros(1, 1 + 4 * index, dtype=torch.long), scores, cur_step=1).argmax(-1)  # [B, L]
        kept, clean = canvases.kept[index], canvases.clean[index]
        assert torch.equal(out[kept], clean[kept])
        early = canvases.before_last_kept[index] & ~kept
        assert not torch.isin(out[early], torch.tensor(end_ids)).any()
        assert (out[~kept & ~canvases.before_last_kept[index]] == end_ids[0]).all()


def test_keeping_in_the_prompt_shows_the_original_selection_to_the_model(runtime):
    original = "return a + b"
    shown = runtime.prompts.build(CONTEXT, rewrite=True, original=original)
    hidden = runtime.prompts.build(CONTEXT, rewrite=True)
    assert original in runtime.tokenizer.decode(shown.all) and original not in runtime.tokenizer.decode(hidden.all)
    # Each mode at a light touch, one seed: where the original goes, and whether kept tokens are pinned.
    runs = {keep: rewrite(runtime, 0.1, seed=0, keep=keep, selection=MEDIUM_SELECTION, steps=4) for keep in KEEP_MODES}
    with_original = len(runtime.prompts.build(CONTEXT, rewrite=True, original=MEDIUM_SELECTION).all)
    assert runs["canvas"].prompt_tokens == len(hidden.all)  # the prompt alone does not carry it
    assert runs["prompt"].prompt_tokens == runs["both"].prompt_tokens == with_original
    kept = {keep: kept_share(runtime, MEDIUM_SELECTION, run.candidates[0].text) for keep, run in runs.items()}
    assert kept["canvas"] >= 0.75 and kept["both"] >= 0.75  # pinned: the random model returns them
    # "prompt" pins nothing: the random model's sampler changes kept tokens too.
    assert kept["prompt"] < kept["both"]
    with pytest.raises(BadRequestError):
        rewrite(runtime, 0.5, seed=1, keep="nowhere", selection=original)


@pytest.mark.parametrize(
    "settings",
    [dict(candidates=0), dict(candidates=99), dict(steps=0), dict(t_max=0.3, t_min=0.5), dict(entropy_bound=-1.0)],
)
def test_bad_settings_are_a_clear_error_and_the_runtime_keeps_working(runtime, settings):
    with pytest.raises(BadRequestError):
        runtime.run(request(**settings))
    assert runtime.run(request()).candidates
