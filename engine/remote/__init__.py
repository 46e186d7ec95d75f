"""The remote engine: the model runs on a server elsewhere, behind vLLM's OpenAI-compatible API.

`vllm_client` implements the `EngineClient` Protocol (engine/client.py) over
HTTP, beside the in-process client and the daemon client; `template` renders
the served model's chat template as text so the prompt sent is exactly the one
`PromptBuilder` lays out. Everything in this room is torch-free and
transformers-free: a language server on a remote engine stays light.
"""
