"""dgemma_lsp.engine: the DiffusionGemma infill runtime.

Owns the model, prompts, denoising, and the pure syntax-aware pipeline
(planning, context, post-processing, validation). Knows nothing of LSP:
no pygls or lsprotocol import, ever. Public types live in `types`.
"""
