"""Getting a checkpoint's weights onto the device, quantized or not.

`loading` loads a model and its tokenizer (offline; the vision tower never); `memory_plan`
checks the planned resident size against free memory before a weight is read; `streaming`
reads a checkpoint shard by shard, packing experts as they arrive; `quantization` holds the
packed modules (int4/int8/fp8) and their saved cache; `text_model` is the model without its
vision tower; `readiness` answers `doctor`'s questions (what fits, what is here).

Imports torch (lazily where `doctor` needs to answer without it). Uses kernels/ for the packed
formats and the fused MoE, model/ for which folder a spec names.
"""
