"""The denoising runtime on the tiny model: the real transformers generate path, CPU only.

Asserts behaviour (counts, identity, cancellation), never wording or timings:
the tiny model's weights are random.
"""

import threading

import pytest
import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

from dgemma_lsp.engine.api import DenoiseRequest, GenerationSettings, InfillContext
from dgemma_lsp.engine.errors import BadRequestError, CancelledError

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


def test_rewrite_starts_from_the_selection_and_scales_steps_by_strength(runtime):
    rewrite = DenoiseRequest(
        context=CONTEXT, selection="a + b", strength=0.5,
        settings=GenerationSettings(steps=8, seed=2, early_stop=False),
    )
    result = runtime.run(rewrite)
    assert result.steps == 4
    assert result.candidates and result.candidates[0].tokens >= 0


@pytest.mark.parametrize(
    "settings",
    [dict(candidates=0), dict(candidates=99), dict(steps=0), dict(t_max=0.3, t_min=0.5), dict(entropy_bound=-1.0)],
)
def test_bad_settings_are_a_clear_error_and_the_runtime_keeps_working(runtime, settings):
    with pytest.raises(BadRequestError):
        runtime.run(request(**settings))
    assert runtime.run(request()).candidates
