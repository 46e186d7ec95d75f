"""The GPU kernels and the compiled step: what makes one denoising step fast on CUDA.

`quant_formats` defines the packed weight layouts (int4 tiles, int8 and fp8, group scales) and
their reference quantize/dequantize; `expert_kernels` is the Triton GEMM of the fused MoE and the
quantized linears (routing-sorted, weights unpacked in registers, w4a16 / w8a8), `moe_kernels` the
routing alignment (and the first-generation GEMM, for A/B), and `fused_moe` drives them;
`fused_sampler` fuses a step's sampling and acceptance; `fused_layer` holds the decoder's
non-expert kernels (norms, rotary, cache append, router) that `fused_decoder` chains into a step's
forward; `compiled_step` runs the denoising loop in CUDA graphs over static caches. Every kernel is
checked against its fp32 reference in Triton's interpreter on CPU
(tests/engine), and counted per step in `make dryrun`.

Imports torch and triton; knows nothing of prompts, syntax or LSP.
"""
