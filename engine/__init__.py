"""dgemma_lsp.engine: everything below the language server, room by room.

Torch-free (they run in the language server's process):
- `syntax/`     tree-sitter documents, hole planning, context, post-processing, validation,
                 and `infill` that glues them around the denoiser.
- `crossfile/`  context from the rest of the workspace: definitions, similar windows, recent edits.
- `nextedit/`   next-edit suggestions: the edit log, the window, the proposal.
- `model/`      what a model is without loading it: its folder, its prompt format, the built-in
                 tiny models, the released architectures.
- `remote/`     the engine as a vLLM server elsewhere, over its OpenAI-compatible API.
- `daemon/`     the resident engine: its host process (which loads torch), wire protocol, paths, client.

With torch (imported lazily):
- `weights/`    loading a checkpoint, quantized or not, within the memory it may use.
- `kernels/`    the Triton kernels and the compiled CUDA-graph step.
- `runtime/`    serving one loaded model: the service, denoising, rewriting, the prompt cache.
- `training/`   training the small code model (`dgemma-lsp train`); nothing in the product imports it.

At this level: `api` (the msgspec Structs that cross the engine's boundary), `errors` (typed
errors with one-line messages), `client` (the async `EngineClient` interface the server talks
to, and its in-process implementation) and `progress`. Knows nothing of LSP: no pygls or
lsprotocol import, ever. `tests/test_layering.py` holds these rules.
"""
