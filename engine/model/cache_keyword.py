"""The keyword transformers takes a KV cache by: `cache` from 5.24, `past_key_values` before.

transformers 5.24 renamed the argument of DiffusionGemma's encoder, decoder and
`generate` (past_key_values -> cache) and warns with a FutureWarning on every
call that uses the old name; 5.40 removes it, and 5.23 (still allowed by
pyproject.toml) has only the old one. So the name is read once from the
installed encoder's signature and every call passes `**with_cache(cache)`:
the current API where it exists, no warning to filter, and 5.23 keeps working.
Knows transformers' signatures; knows nothing of what the cache holds.
"""

from __future__ import annotations

import functools
import inspect


@functools.cache
def cache_keyword() -> str:
    """"cache" when the installed DiffusionGemma takes it, else "past_key_values"."""
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaEncoderModel

    return "cache" if "cache" in inspect.signature(DiffusionGemmaEncoderModel.forward).parameters else "past_key_values"


def with_cache(cache) -> dict:
    """`{keyword: cache}` for a DiffusionGemma encoder, decoder or generate call."""
    return {cache_keyword(): cache}
