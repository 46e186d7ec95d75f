"""What a DiffusionGemma model is, as the rest of the program needs to know it without loading it.

`folders` turns a model spec (`tiny`, `tiny-random`, a folder, a hub id) into its folder and
reads its declared context limit; `tiny_model` names and builds the two built-in models (data/:
the trained one's files); `prompting` lays out the infill prompt in the model's chat template;
`architecture` holds the released models' configs (configs/) for planning before a download;
`cache_keyword` adapts to the cache keyword of the installed transformers; `cache` is where
things built once are kept.

Torch-free at import (torch only inside the functions that build a model): the language server,
the daemon's client and the vLLM client import this room and never load torch.
"""
