"""dgemma_lsp.engine: everything below the language server, in three rooms.

- `runtime/`  the model (torch, transformers): loading, quantization, prompts,
               the prompt cache, denoising, and the service that serialises requests.
- `syntax/`   the torch-free pipeline that runs in the language server's process:
               tree-sitter documents, hole planning, context, post-processing,
               validation, and `infill` that glues them around the denoiser.
- `daemon/`   the resident engine: its host process, wire protocol, paths and client.

At this level: `api` (the msgspec Structs that cross the engine's boundary),
`errors` (typed errors with one-line messages) and `client` (the async
`EngineClient` interface the server talks to, and its in-process implementation).
Knows nothing of LSP: no pygls or lsprotocol import, ever.
"""
