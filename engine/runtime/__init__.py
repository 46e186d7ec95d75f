"""Serving one loaded model: requests in, denoised candidates and drafts out.

`service` owns a process's model (load, backoff, one request at a time, cancellation),
`denoising` runs DiffusionGemma's generate (or the compiled step) for a request and streams
its drafts, `rewriting` renoises a selection for "Rewrite selection" and next edits, and
`prompt_cache` keeps each document's stable prompt as encoder KV between keystrokes.

Imported lazily: a language server that talks to a daemon never loads torch. Uses weights/
to load, kernels/ to step fast, model/ for the prompt.
"""
