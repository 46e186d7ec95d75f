"""The GPU kernels and the compiled step: what makes one denoising step fast on CUDA.

`quant_formats` defines the packed weight layouts (int4 groups, int8 and fp8 channels) and
their reference quantize/dequantize; `moe_kernels` are the Triton kernels of the fused MoE
(routing-sorted grouped matmuls over packed weights) and `fused_moe` drives them; `fused_sampler`
fuses a step's sampling and acceptance; `fused_layer` holds the decoder's non-expert kernels
(norms, rotary, cache append, router) that `fused_decoder` chains into a step's forward;
`compiled_step` runs the denoising loop in CUDA graphs over static caches. Every kernel is checked against its fp32 reference in Triton's interpreter on CPU
(tests/engine), and counted per step in `make dryrun`.

Imports torch and triton; knows nothing of prompts, syntax or LSP.
"""
