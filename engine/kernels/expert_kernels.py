"""Triton kernel of the quantized experts (and dense linears): one grouped GEMM for every packed format.

Owns the device code only: `expert_gemm_kernel`, the int4 unpacking it
uses, and `activation_codes_kernel` (w8a8's activation rounding as a launch). When to launch it, with which tiles, is `fused_moe`; the formats are
`quant_formats`; the routing alignment kernel and the first-generation
dequant GEMM (kept for A/B timing) are `moe_kernels`.

What it does per program (one block of BLOCK_M routed rows of one expert, one
block of BLOCK_N output columns), and why:

- int4 (w4a16): reads the tile layout of `quant_formats` (int16 words, four
  codes each, a K-block of 64 inputs = 16 words per row). Code j of a word
  goes straight into the mantissa of a bf16 constant: 0x4300 | c is exactly
  the bf16 of 128 + c, and one subtraction (of 136: codes are q + 8) leaves
  q. No integer-to-float conversion, no fp32, no sign extension. On CUDA
  (`ASM`) that is `lop3` + `fma.rn.bf16x2` on two words per 32-bit register
  (`pack=2`), the trick of Marlin's dequant.h written here for our layout;
  the pure version does the same bits with Triton integer ops and a bitcast,
  runs in the interpreter, and the device script checks the two equal. Each
  code gives a `[BLOCK_N, 16]` tile of 16 *consecutive* inputs, so a K-block
  is four K=16 dots with no shuffle of the activations.
- symmetric int4 with one scale per K-block (`SCALE_WEIGHTS`: groups of 64 or
  more, one level; the product's int4): each code is multiplied by its
  column's bf16 scale as it is unpacked, one more `fma.rn.bf16x2` a pair, so
  the tile is exactly `dequantize(..., bfloat16)`'s weight (q * s is exact
  in fp32 and rounds once either way) and the dots accumulate straight into
  the output's registers. The alternative, scaling each group's fp32
  partial sum, costs a multiply-add per output element per K-block (it grows
  with BLOCK_M: 4 row blocks of a 256-token dense launch pay it 4 times) and
  on Hopper a wait for every partial wgmma; the weight side costs the same
  whatever the rows (bench/device/compile_kernels.py counts both).
- otherwise scales are applied to the fp32 partial sum once per group, never to the
  weights: the integers -8..7 are exact in bf16, so the products are exact
  and a group's dots accumulate unscaled (the scale hoisted out of the
  inner loop). Affine int4 (weight = scale * code + min, the form GGUF /
  AWQ weights import into) adds min * (sum of the group's activations).
  Two-level scales (`SUPER` inputs per super scale: GGUF Q4_K's d and dmin
  per 256 over 6-bit sc and m per 32) multiply the group's scale and min by
  their super-block's in fp32 as they are loaded (exact: quant_formats).
- w8a8 (`ACTIVATIONS` int8 or fp8): the activation tile of each K step is
  quantized in registers, per row (absmax / 127 or / 448), and the raw
  int8 / e4m3 weight bytes go into the MMA as they are loaded: no weight
  conversion at all. The partial sum is scaled by the row's activation scale
  and the column's weight scale. Finer than vLLM's per-token scales (one per
  K step of 64 inputs), in-kernel so no extra launch and no extra read. Every
  column block of a launch rounds the same rows again, most of the w8a8 K
  loop's instructions: `CODED` launches read codes and scales that
  `activation_codes_kernel` wrote once instead (the same numbers; opt-in in
  `fused_moe`, one launch more a GEMM), and a gated launch can store its output
  as those codes (`CODES_OUT`: BLOCK_N columns are one K step of the next GEMM).
  int8 MMA runs on every card we target (sm80+); fp8 needs sm89+. Measured
  on the tiny layer (bench moe, CPU): error against the unquantized weights
  int8 1.0% -> 1.6%, fp8 4.3% -> 6.0% (int4: 18.5%).
- w4a8 (symmetric int4 weights, `ACTIVATIONS` int8; opt-in, not a product default): the int4 codes are
  exact in int8, so a K-block's 16 words become one `[BLOCK_N, 64]` int8 tile in input order for one
  K=64 int8 dot (IMMA needs K >= 32: four 16-input dots would not do) against the activations quantized
  as w8a8's; it runs in the 8-bit K loop, the group's scale per step (GROUP a multiple of 64). The four
  code tiles are laid side by side along K (join + permute + reshape), which moves no value between
  threads: a thread's int8 MMA register is 4 consecutive inputs, code j of the 4 consecutive words it
  reads. On CUDA (`ASM`) 4 words give their 16 codes as c - 8 in 18 instructions (masks, a byte-wise
  + 0x78 ^ 0x80, `prmt`); the pure version (c ^ 8 sign-extended by a shift pair) runs in the interpreter.
  Compiled (bench/device/compile_kernels.py): 0.23 (gate_up) and 0.36-0.40 (down) warp instructions a
  weight at 256 tokens, most of it w8a8's own in-loop activation rounding (int8 w8a8: 0.21 / 0.33; int4:
  0.11 / 0.14).
- w8a16 (`ACTIVATIONS` 0 with int8 / fp8 weights): the first generation's
  conversion through fp32, kept for cards without fp8 MMA and for A/B.
- `SWAP`: tokens on the MMA's N side. An expert gets ~16 rows at a 256-token
  canvas; with the weight tile as the dot's first operand the tensor core's M
  (64 per Hopper warpgroup) is filled by weight rows and 16 tokens are a
  legal N, and on Hopper the dequantized tile can feed the MMA from registers.
- `GATED` (gate and up stacked along N) fuses gelu_tanh(gate) * up into the
  epilogue; `ROUTE_WEIGHTED` scales each row by its routing weight and adds it
  atomically (fp32) into its token's row: the top-k sum.

`FP32_MATH` (set under TRITON_INTERPRET=1) converts the dot operands to fp32:
the interpreter's bf16 arithmetic and dot are wrong, and every bf16 product
is exact in fp32 anyway. The kernels run on CPU tensors in the interpreter
(the tests do); the decorators read TRITON_INTERPRET when this module is imported.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .rounding import quantized_activations, round_to

WEIGHT_CODES = {"int8": 0, "int4": 1, "fp8": 2, "int4-affine": 3}
"""The `WEIGHTS` constexpr for each stored format."""
ACTIVATION_CODES = {"none": 0, "int8": 1, "fp8": 2}
"""The `ACTIVATIONS` constexpr: as given (bf16 on CUDA) or quantized in the kernel."""
INT4_BLOCK_K = 64
"""K inputs per int4 step: 16 words of 4 codes (quant_formats.INT4_SUBTILE)."""


@triton.jit
def _int4_code(words32, j: tl.constexpr, SYMMETRIC: tl.constexpr, FP32_MATH: tl.constexpr):
    """Code j of each word as the weight value (q for symmetric, c for affine): magic-number bits, one subtraction."""
    bits = ((words32 >> (4 * j)) & 0xF) | 0x4300  # the bf16 of 128 + code, exactly
    value = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    if FP32_MATH:
        value = value.to(tl.float32)
    if SYMMETRIC:
        value = value - 136.0  # codes are q + 8; exact: both sides are in [128, 143]
    else:
        value = value - 128.0
    return value


@triton.jit
def _int4_codes_asm(words, SYMMETRIC: tl.constexpr):
    """The four codes of int16 `words` as bf16 tiles, two words per 32-bit register:
    (x >> 4j) & 0x000F000F | 0x43004300 is a bf16 pair (128 + c, 128 + c'), one `lop3`;
    an fma by 1.0 with -136 (-128 affine) gives both values, one instruction (sm80+)."""
    if SYMMETRIC:
        codes = tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b32 shifted, one, bias;
            mov.b32 one, 0x3F803F80;
            mov.b32 bias, 0xC308C308;
            lop3.b32 $0, $4, 0x000F000F, 0x43004300, 0xEA;
            fma.rn.bf16x2 $0, $0, one, bias;
            shr.b32 shifted, $4, 4;
            lop3.b32 $1, shifted, 0x000F000F, 0x43004300, 0xEA;
            fma.rn.bf16x2 $1, $1, one, bias;
            shr.b32 shifted, $4, 8;
            lop3.b32 $2, shifted, 0x000F000F, 0x43004300, 0xEA;
            fma.rn.bf16x2 $2, $2, one, bias;
            shr.b32 shifted, $4, 12;
            lop3.b32 $3, shifted, 0x000F000F, 0x43004300, 0xEA;
            fma.rn.bf16x2 $3, $3, one, bias;
            }
            """,
            constraints="=r,=r,=r,=r,r",
            args=[words],
            dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16),
            is_pure=True,
            pack=2,
        )
    else:
        codes = tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b32 shifted, one, bias;
            mov.b32 one, 0x3F803F80;
            mov.b32 bias, 0xC300C300;
            lop3.b32 $0, $4, 0x000F000F, 0x43004300, 0xEA;
            fma.rn.bf16x2 $0, $0, one, bias;
            shr.b32 shifted, $4, 4;
            lop3.b32 $1, shifted, 0x000F000F, 0x43004300, 0xEA;
            fma.rn.bf16x2 $1, $1, one, bias;
            shr.b32 shifted, $4, 8;
            lop3.b32 $2, shifted, 0x000F000F, 0x43004300, 0xEA;
            fma.rn.bf16x2 $2, $2, one, bias;
            shr.b32 shifted, $4, 12;
            lop3.b32 $3, shifted, 0x000F000F, 0x43004300, 0xEA;
            fma.rn.bf16x2 $3, $3, one, bias;
            }
            """,
            constraints="=r,=r,=r,=r,r",
            args=[words],
            dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16),
            is_pure=True,
            pack=2,
        )
    return codes


@triton.jit
def _int4_scaled_codes_asm(words, scales):
    """`_int4_codes_asm`'s symmetric values times `scales` (bf16, one per word, broadcast over its codes), each
    product rounded once: q = (128 + c) * 1 - 136 exactly, then q * s + -0.0 in one more `fma.rn.bf16x2` a pair
    (sm80+; `mul.bf16x2` is sm90 only, and fma(128 + c, s, -136 s) would round twice)."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 shifted, one, bias, zero;
        mov.b32 one, 0x3F803F80;
        mov.b32 bias, 0xC308C308;
        mov.b32 zero, 0x80008000;
        lop3.b32 $0, $4, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 $0, $0, one, bias;
        fma.rn.bf16x2 $0, $0, $5, zero;
        shr.b32 shifted, $4, 4;
        lop3.b32 $1, shifted, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 $1, $1, one, bias;
        fma.rn.bf16x2 $1, $1, $5, zero;
        shr.b32 shifted, $4, 8;
        lop3.b32 $2, shifted, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 $2, $2, one, bias;
        fma.rn.bf16x2 $2, $2, $5, zero;
        shr.b32 shifted, $4, 12;
        lop3.b32 $3, shifted, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 $3, $3, one, bias;
        fma.rn.bf16x2 $3, $3, $5, zero;
        }
        """,
        constraints="=r,=r,=r,=r,r,r",
        args=[words, scales],
        dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=2,
    )


@triton.jit
def _int4_scaled_tiles(words, scale, SWAP: tl.constexpr, ASM: tl.constexpr, ROUND_BF16: tl.constexpr,
                       FP32_MATH: tl.constexpr):  # fmt: skip
    """The four symmetric tiles of `_int4_tiles` times their column's scale `[BLOCK_N]`: `dequantize`'s weights.

    ROUND_BF16 (bf16 activations): each product rounded once to bf16, as `dequantize(..., bfloat16)` rounds it;
    else kept in fp32, where it is exact. In the dot's dtype: bf16 on CUDA, fp32 under FP32_MATH."""
    if SWAP:
        scales = tl.broadcast_to(scale[:, None], words.shape)
    else:
        scales = tl.broadcast_to(scale[None, :], words.shape)
    if ASM and ROUND_BF16:
        tiles = _int4_scaled_codes_asm(words, scales.to(tl.bfloat16))
    else:
        values = _int4_tiles(words, True, False, True)  # fp32 q, exact
        factor = scales.to(tl.float32)
        tiles = (
            _scaled_tile(values[0], factor, ROUND_BF16, FP32_MATH),
            _scaled_tile(values[1], factor, ROUND_BF16, FP32_MATH),
            _scaled_tile(values[2], factor, ROUND_BF16, FP32_MATH),
            _scaled_tile(values[3], factor, ROUND_BF16, FP32_MATH),
        )
    return tiles


@triton.jit
def _scaled_tile(values, factor, ROUND_BF16: tl.constexpr, FP32_MATH: tl.constexpr):
    """fp32 codes times their scales (exact), rounded once to bf16 where ROUND_BF16: by `rounding.round_to`'s
    bit arithmetic under the interpreter, whose fp32 -> bf16 conversion truncates; by the conversion on CUDA."""
    product = values * factor
    if ROUND_BF16 and FP32_MATH:
        product = round_to(product, tl.bfloat16)
    elif ROUND_BF16:
        product = product.to(tl.bfloat16)
    return product


@triton.jit
def _int4_tiles(words, SYMMETRIC: tl.constexpr, ASM: tl.constexpr, FP32_MATH: tl.constexpr):
    """The four `[.., 16]`-input weight tiles held by a tile of int16 words (code j = inputs 16j..16j+15)."""
    if ASM:
        tiles = _int4_codes_asm(words, SYMMETRIC)
    else:
        words32 = words.to(tl.int32)  # sign extension is masked off by the & 0xF
        tiles = (
            _int4_code(words32, 0, SYMMETRIC, FP32_MATH),
            _int4_code(words32, 1, SYMMETRIC, FP32_MATH),
            _int4_code(words32, 2, SYMMETRIC, FP32_MATH),
            _int4_code(words32, 3, SYMMETRIC, FP32_MATH),
        )
    return tiles


@triton.jit
def _int4_int8_codes_asm(words):
    """The four codes of int16 `words` as int8 values c - 8, four words a call (`pack=4`: two 32-bit registers
    in, one register of 4 int8 out per code): a mask (and a shift) per code pair and register splits the
    nibbles into bytes, c + 0x78 then ^ 0x80 makes each byte c - 8 (no carry crosses a byte: c + 0x78 <= 0x87),
    and a `prmt` gathers each code's 4 bytes in the words' order. 18 instructions for 16 weights."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 a, b, c, d;
        and.b32 a, $4, 0x0F0F0F0F;
        shr.b32 b, $4, 4;
        and.b32 b, b, 0x0F0F0F0F;
        and.b32 c, $5, 0x0F0F0F0F;
        shr.b32 d, $5, 4;
        and.b32 d, d, 0x0F0F0F0F;
        add.u32 a, a, 0x78787878;
        add.u32 b, b, 0x78787878;
        add.u32 c, c, 0x78787878;
        add.u32 d, d, 0x78787878;
        xor.b32 a, a, 0x80808080;
        xor.b32 b, b, 0x80808080;
        xor.b32 c, c, 0x80808080;
        xor.b32 d, d, 0x80808080;
        prmt.b32 $0, a, c, 0x6420;
        prmt.b32 $1, b, d, 0x6420;
        prmt.b32 $2, a, c, 0x7531;
        prmt.b32 $3, b, d, 0x7531;
        }
        """,
        constraints="=r,=r,=r,=r,r,r",
        args=[words],
        dtype=(tl.int8, tl.int8, tl.int8, tl.int8),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _int4_int8_tile(words, SWAP: tl.constexpr, ASM: tl.constexpr):
    """A K-block of int4 words, `[BLOCK_N, 16]` (SWAP) or `[16, BLOCK_N]`, as one int8 weight tile in input order
    for the int8 MMA (w4a8): `[BLOCK_N, 64]` or `[64, BLOCK_N]`, input 16j + p = code j of word p, value c - 8.

    c ^ 8 read as a signed nibble is c - 8: one XOR a word, a shift pair a code sign-extends it. The four code
    tiles are then laid side by side along K by join + permute + reshape: in the MMA's int8 operand layout a
    thread's register holds 4 consecutive inputs, code j of 4 consecutive words, so the words a thread loads
    give exactly its registers and no value leaves the thread."""
    if ASM:
        t0, t1, t2, t3 = _int4_int8_codes_asm(words)
    else:
        flipped = words.to(tl.int32) ^ 0x8888
        t0 = ((flipped << 28) >> 28).to(tl.int8)
        t1 = ((flipped << 24) >> 28).to(tl.int8)
        t2 = ((flipped << 20) >> 28).to(tl.int8)
        t3 = ((flipped << 16) >> 28).to(tl.int8)
    joined = tl.join(tl.join(t0, t1), tl.join(t2, t3))  # [.., .., x, y] holds code j = x + 2y
    if SWAP:
        rows: tl.constexpr = words.shape[0]
        return tl.reshape(tl.permute(joined, (0, 3, 2, 1)), [rows, 64])  # [n, y, x, p]: column 16j + p
    else:
        columns: tl.constexpr = words.shape[1]
        return tl.reshape(tl.permute(joined, (3, 2, 0, 1)), [64, columns])  # [y, x, p, n]: row 16j + p


@triton.jit
def _group_factor(ptrs, super_factor, n_valid, group_offset, SUPER: tl.constexpr):
    """The group's scale (or min) per output column in fp32: times its super-block's where SUPER > 0."""
    factor = tl.load(ptrs + group_offset, mask=n_valid, other=0).to(tl.float32)
    if SUPER > 0:
        factor = factor * super_factor
    return factor


@triton.jit
def _super_factor(super_ptrs, n_valid, super_offset, SUPER: tl.constexpr):
    """The super-block's scale (or min) per output column in fp32 where SUPER > 0 (else unused)."""
    if SUPER > 0:
        return tl.load(super_ptrs + super_offset, mask=n_valid, other=0).to(tl.float32)
    else:
        return 0.0


@triton.jit
def _scaled_group(part, scale, SWAP: tl.constexpr):
    """part * the group's weight scale per output column (fp32)."""
    if SWAP:
        return part * scale[:, None]
    else:
        return part * scale[None, :]


@triton.jit
def _group_mins(mins, row_sums, SWAP: tl.constexpr):
    """Affine int4: min per output column * the group's activation sum per row."""
    if SWAP:
        return mins[:, None] * row_sums[None, :]
    else:
        return row_sums[:, None] * mins[None, :]


@triton.jit
def _dot(w, a, SWAP: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """w `[BLOCK_N, k]` (SWAP) or `[k, BLOCK_N]`, a `[k, BLOCK_M]` (SWAP) or `[BLOCK_M, k]`: the partial product."""
    if SWAP:
        return tl.dot(w, a, input_precision=DOT_PRECISION)
    else:
        return tl.dot(a, w, input_precision=DOT_PRECISION)


@triton.jit
def _dot_into(w, a, acc, SWAP: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc + `_dot(w, a)`, accumulated by the matrix instruction itself (no partial sum to add)."""
    if SWAP:
        return tl.dot(w, a, acc=acc, input_precision=DOT_PRECISION)
    else:
        return tl.dot(a, w, acc=acc, input_precision=DOT_PRECISION)


@triton.jit
def _weight_values(raw, WEIGHTS: tl.constexpr, ACTIVATIONS: tl.constexpr, dtype):
    """An 8-bit weight tile as the dot takes it: raw bytes for w8a8, converted (exact) for w8a16."""
    if ACTIVATIONS == 2:
        values = raw.to(tl.float8e4nv, bitcast=True)
    elif ACTIVATIONS == 1:
        values = raw
    elif WEIGHTS == 2:
        values = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32).to(dtype)
    else:
        values = raw.to(tl.float32).to(dtype)  # via fp32: the interpreter mangles int -> bf16
    return values


@triton.jit
def _w8_partial(a, w_raw, WEIGHTS: tl.constexpr, ACTIVATIONS: tl.constexpr, SWAP: tl.constexpr,
                DOT_PRECISION: tl.constexpr, FP32_MATH: tl.constexpr):  # fmt: skip
    """One K step of an 8-bit weight tile against a (bf16, or in-kernel quantized) activation tile, fp32."""
    if ACTIVATIONS == 0:
        part = _dot(_weight_values(w_raw, WEIGHTS, ACTIVATIONS, a.dtype), a, SWAP, DOT_PRECISION)
    else:
        codes, row_scale = quantized_activations(a, ACTIVATIONS, SWAP, FP32_MATH)
        part = _coded_partial(codes, row_scale, w_raw, WEIGHTS, ACTIVATIONS, SWAP)
    return part


@triton.jit
def _coded_partial(codes, row_scale, w_raw, WEIGHTS: tl.constexpr, ACTIVATIONS: tl.constexpr, SWAP: tl.constexpr):
    """One K step of 8-bit (or w4a8's int8) weights against activation codes (int8, or e4m3) and their scale per
    row, fp32: the raw weight bytes and the codes go into the MMA as they are."""
    w = _weight_values(w_raw, WEIGHTS, ACTIVATIONS, tl.float32)
    if ACTIVATIONS == 1:
        if SWAP:
            part = tl.dot(w, codes, out_dtype=tl.int32).to(tl.float32) * row_scale[None, :]
        else:
            part = tl.dot(codes, w, out_dtype=tl.int32).to(tl.float32) * row_scale[:, None]
    else:
        if SWAP:
            part = tl.dot(w, codes) * row_scale[None, :]
        else:
            part = tl.dot(codes, w) * row_scale[:, None]
    return part


@triton.jit
def activation_codes_kernel(
    a_ptr,  # activations [R, K]
    codes_ptr,  # out [R, K]: int8 codes, or e4m3 codes' bytes (uint8)
    scales_ptr,  # out [R, K / BLOCK_K] fp32
    rows,
    stride_am,
    stride_ak,
    stride_cm,
    stride_sm,
    ACTIVATIONS: tl.constexpr,
    FP32_MATH: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """w8a8's activation rounding done once for every GEMM program that reads the rows (`CODED`): per row and per
    BLOCK_K inputs the codes and fp32 scale `quantized_activations` makes in the GEMM's K loop, bit for bit."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    valid = offs_r < rows
    a = tl.load(a_ptr + offs_r[:, None] * stride_am + offs_k[None, :] * stride_ak, mask=valid[:, None], other=0.0)
    codes, row_scale = quantized_activations(a, ACTIVATIONS, False, FP32_MATH)
    if ACTIVATIONS == 2:
        codes = codes.to(tl.uint8, bitcast=True)
    tl.store(codes_ptr + offs_r[:, None] * stride_cm + offs_k[None, :], codes, mask=valid[:, None])
    tl.store(scales_ptr + offs_r * stride_sm + tl.program_id(1), row_scale, mask=valid)


@triton.jit
def expert_gemm_kernel(
    a_ptr,  # activations [A rows, K]
    w_ptr,  # packed weights [E, N (x2 when GATED), K / values per element]
    s_ptr,  # scales [E, K / GROUP, N (x2)]
    m_ptr,  # affine int4: mins, laid out as the scales
    ss_ptr,  # SUPER: super scales [E, K / SUPER, N (x2)]
    sm_ptr,  # SUPER and affine: super mins, laid out as the super scales
    out_ptr,  # [out rows, N]: dtype of the result, fp32 when ROUTE_WEIGHTED (atomic sums)
    sorted_pairs_ptr,  # ROUTED: [MAX_ROWS] int32 pair per padded row
    block_experts_ptr,  # ROUTED: [MAX_BLOCKS] int32 expert per row block
    rows_used_ptr,  # ROUTED: [1] int32
    route_weights_ptr,  # ROUTE_WEIGHTED: [P] routing weight per pair
    as_ptr,  # CODED: the activation codes' fp32 scales [A rows, K / BLOCK_K]
    os_ptr,  # CODES_OUT: the output codes' fp32 scales [out rows, N / BLOCK_N]
    num_rows,  # ROUTED: pairs P; dense: rows of a
    N,
    K,
    a_row_div,  # a row = pair // a_row_div (gate_up reads token = pair // top_k; down reads pair)
    out_row_div,  # out row = pair // out_row_div (down sums the top_k pairs of a token into one row)
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_se,
    stride_sg,
    stride_sn,
    stride_sse,  # super scales' (and mins') expert and super-group strides; their column stride is stride_sn
    stride_ssg,
    stride_om,
    stride_on,
    stride_asm,  # CODED: the scales' row stride
    stride_osm,  # CODES_OUT: the output scales' row stride
    GROUP: tl.constexpr,
    SUPER: tl.constexpr,  # inputs per super scale (a multiple of GROUP); 0: one level
    WEIGHTS: tl.constexpr,
    ACTIVATIONS: tl.constexpr,
    ROUTED: tl.constexpr,
    GATED: tl.constexpr,
    ROUTE_WEIGHTED: tl.constexpr,
    SWAP: tl.constexpr,
    ASM: tl.constexpr,
    SCALE_WEIGHTS: tl.constexpr,  # symmetric int4 (w4a16), one scale per K-block: scaled as unpacked
    ROUND_BF16: tl.constexpr,  # SCALE_WEIGHTS under bf16 activations: scaled weights rounded to bf16
    CODED: tl.constexpr,  # ACTIVATIONS given as codes (a_ptr) and scales (as_ptr): `activation_codes_kernel`'s
    CODES_OUT: tl.constexpr,  # 1 int8, 2 e4m3: store the output as the next GEMM's codes (BLOCK_N = its K step)
    OUT_ROUND: tl.constexpr,  # CODES_OUT: the dtype the output would have been stored in: 0 fp32, 1 bf16, 2 fp16
    FP32_MATH: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out = a @ w[expert].T per row block (w dequantized in registers), with the MoE prologue/epilogue when routed.

    int4 (WEIGHTS 1, 3): BLOCK_K is 64, GROUP a multiple of 16 (of 64 for w4a8). 8-bit: BLOCK_K divides GROUP; with
    ACTIVATIONS the activation scale is per row per BLOCK_K inputs.
    """
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(N, BLOCK_N)
    pid_m = pid // n_blocks
    pid_n = pid % n_blocks
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if ROUTED:
        # The grid is sized for the worst case; blocks past the rows in use leave at once.
        if pid_m * BLOCK_M >= tl.load(rows_used_ptr):
            return
        expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
        pairs = tl.load(sorted_pairs_ptr + rows)
        row_valid = pairs < num_rows
        a_rows = pairs // a_row_div
        out_rows = pairs // out_row_div
    else:
        expert = 0
        pairs = rows
        row_valid = rows < num_rows
        a_rows = rows
        out_rows = rows
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_valid = offs_n < N
    INT4: tl.constexpr = WEIGHTS % 2 == 1  # codes 1 (int4) and 3 (int4-affine)
    W4A16: tl.constexpr = INT4 and ACTIVATIONS == 0  # four K=16 bf16 dots a K-block
    W4A8: tl.constexpr = INT4 and ACTIVATIONS == 1  # one K=64 int8 dot a K-block, in the 8-bit loop
    SUB_K: tl.constexpr = 16 if W4A16 else BLOCK_K  # inputs per dot
    W_STEP: tl.constexpr = 16 if INT4 else BLOCK_K  # stored elements per K step along a row
    offs_k = tl.arange(0, SUB_K)
    offs_wk = tl.arange(0, W_STEP)
    # Pointer tiles are built once and advanced per K step (index math stays out of the loop).
    if SWAP:
        a_ptrs = a_ptr + a_rows[None, :] * stride_am + offs_k[:, None] * stride_ak  # [SUB_K, BLOCK_M]
        a_mask = row_valid[None, :]
        w_ptrs = w_ptr + expert * stride_we + offs_n[:, None] * stride_wn + offs_wk[None, :] * stride_wk
        w_mask = n_valid[:, None]
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak  # [BLOCK_M, SUB_K]
        a_mask = row_valid[:, None]
        w_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_wk[:, None] * stride_wk
        w_mask = n_valid[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros_like(acc)
    as_ptrs = as_ptr + a_rows * stride_asm  # CODED: [BLOCK_M], one scale per K step along the row
    s_ptrs = s_ptr + expert * stride_se + offs_n * stride_sn  # [BLOCK_N]
    m_ptrs = m_ptr + expert * stride_se + offs_n * stride_sn
    ss_ptrs = ss_ptr + expert * stride_sse + offs_n * stride_sn
    sm_ptrs = sm_ptr + expert * stride_sse + offs_n * stride_sn
    up_w_offset = N * stride_wn  # GATED: the up rows follow the N gate rows
    up_s_offset = N * stride_sn
    for k0 in range(0, K, BLOCK_K):
        if SCALE_WEIGHTS:
            # One K-block, one scale per column: tiles scaled as they are unpacked, dots into the output.
            group_offset = (k0 // GROUP) * stride_sg
            scale = tl.load(s_ptrs + group_offset, mask=n_valid, other=0)
            tiles = _int4_scaled_tiles(tl.load(w_ptrs, mask=w_mask, other=0), scale, SWAP, ASM, ROUND_BF16,
                                       FP32_MATH)  # fmt: skip
            if GATED:
                scale_up = tl.load(s_ptrs + up_s_offset + group_offset, mask=n_valid, other=0)
                tiles_up = _int4_scaled_tiles(tl.load(w_ptrs + up_w_offset, mask=w_mask, other=0), scale_up, SWAP,
                                              ASM, ROUND_BF16, FP32_MATH)  # fmt: skip
            for j in tl.static_range(4):
                a = tl.load(a_ptrs + (k0 + 16 * j) * stride_ak, mask=a_mask, other=0.0)
                if FP32_MATH:
                    a = a.to(tl.float32)
                acc = _dot_into(tiles[j].to(a.dtype), a, acc, SWAP, DOT_PRECISION)
                if GATED:
                    acc_up = _dot_into(tiles_up[j].to(a.dtype), a, acc_up, SWAP, DOT_PRECISION)
        elif W4A16:
            # One K-block: 16 words per row, 4 codes each = 64 inputs in four 16-input tiles.
            tiles = _int4_tiles(tl.load(w_ptrs, mask=w_mask, other=0), WEIGHTS == 1, ASM, FP32_MATH)
            if GATED:
                tiles_up = _int4_tiles(tl.load(w_ptrs + up_w_offset, mask=w_mask, other=0), WEIGHTS == 1, ASM,
                                       FP32_MATH)  # fmt: skip
            # Tiles of one scale group accumulate unscaled; the scale lands once per group.
            SUBTILES_PER_GROUP: tl.constexpr = GROUP // 16 if GROUP < 64 else 4
            part = tl.zeros_like(acc)
            part_up = tl.zeros_like(acc)
            row_sums = tl.zeros([BLOCK_M], dtype=tl.float32)  # affine: the group's activation sum per row
            # Super factors: one load per K-block (the launch checks SUPER is whole K-blocks).
            super_offset = (k0 // SUPER) * stride_ssg if SUPER > 0 else 0
            ss_gate = _super_factor(ss_ptrs, n_valid, super_offset, SUPER)
            sm_gate = _super_factor(sm_ptrs, n_valid, super_offset, SUPER)
            ss_up = _super_factor(ss_ptrs + up_s_offset, n_valid, super_offset, SUPER)
            sm_up = _super_factor(sm_ptrs + up_s_offset, n_valid, super_offset, SUPER)
            for j in tl.static_range(4):
                a = tl.load(a_ptrs + (k0 + 16 * j) * stride_ak, mask=a_mask, other=0.0)
                if FP32_MATH:
                    a = a.to(tl.float32)
                part += _dot(tiles[j].to(a.dtype), a, SWAP, DOT_PRECISION)
                if GATED:
                    part_up += _dot(tiles_up[j].to(a.dtype), a, SWAP, DOT_PRECISION)
                if WEIGHTS == 3:
                    row_sums += tl.sum(a.to(tl.float32), axis=0 if SWAP else 1)
                if (j + 1) % SUBTILES_PER_GROUP == 0:
                    group_offset = ((k0 + 16 * j) // GROUP) * stride_sg
                    scale = _group_factor(s_ptrs, ss_gate, n_valid, group_offset, SUPER)
                    acc += _scaled_group(part, scale, SWAP)
                    if WEIGHTS == 3:
                        mins = _group_factor(m_ptrs, sm_gate, n_valid, group_offset, SUPER)
                        acc += _group_mins(mins, row_sums, SWAP)
                    if GATED:
                        scale = _group_factor(s_ptrs + up_s_offset, ss_up, n_valid, group_offset, SUPER)
                        acc_up += _scaled_group(part_up, scale, SWAP)
                        if WEIGHTS == 3:
                            mins = _group_factor(m_ptrs + up_s_offset, sm_up, n_valid, group_offset, SUPER)
                            acc_up += _group_mins(mins, row_sums, SWAP)
                    part = tl.zeros_like(acc)
                    part_up = tl.zeros_like(acc)
                    row_sums = tl.zeros_like(row_sums)
        else:
            a = tl.load(a_ptrs + k0 * stride_ak, mask=a_mask, other=0)  # other=0: codes are integers
            if FP32_MATH and ACTIVATIONS == 0:
                a = a.to(tl.float32)
            group_offset = (k0 // GROUP) * stride_sg  # BLOCK_K divides GROUP: one scale per column per step
            super_offset = (k0 // SUPER) * stride_ssg if SUPER > 0 else 0
            w_raw = tl.load(w_ptrs, mask=w_mask, other=0)
            if W4A8:
                w_raw = _int4_int8_tile(w_raw, SWAP, ASM)
            if CODED:
                codes = a.to(tl.float8e4nv, bitcast=True) if ACTIVATIONS == 2 else a
                row_scale = tl.load(as_ptrs + k0 // BLOCK_K, mask=row_valid, other=0.0)
                part = _coded_partial(codes, row_scale, w_raw, WEIGHTS, ACTIVATIONS, SWAP)
            else:
                part = _w8_partial(a, w_raw, WEIGHTS, ACTIVATIONS, SWAP, DOT_PRECISION, FP32_MATH)
            scale = _group_factor(s_ptrs, _super_factor(ss_ptrs, n_valid, super_offset, SUPER), n_valid, group_offset,
                                  SUPER)  # fmt: skip
            acc += _scaled_group(part, scale, SWAP)
            if GATED:
                w_up = tl.load(w_ptrs + up_w_offset, mask=w_mask, other=0)
                if W4A8:
                    w_up = _int4_int8_tile(w_up, SWAP, ASM)
                if CODED:
                    part_up = _coded_partial(codes, row_scale, w_up, WEIGHTS, ACTIVATIONS, SWAP)
                else:
                    part_up = _w8_partial(a, w_up, WEIGHTS, ACTIVATIONS, SWAP, DOT_PRECISION, FP32_MATH)
                super_up = _super_factor(ss_ptrs + up_s_offset, n_valid, super_offset, SUPER)
                scale = _group_factor(s_ptrs + up_s_offset, super_up, n_valid, group_offset, SUPER)
                acc_up += _scaled_group(part_up, scale, SWAP)
        w_ptrs += W_STEP * stride_wk
    if GATED:
        # gelu_tanh(x) = x * (1 + tanh(z)) / 2 = x * sigmoid(2z), z = sqrt(2/pi) * (x + 0.044715 x^3)
        inner = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = acc * tl.sigmoid(2.0 * inner) * acc_up
    if SWAP:
        out_ptrs = out_ptr + out_rows[None, :] * stride_om + offs_n[:, None] * stride_on
        out_mask = row_valid[None, :] & n_valid[:, None]
    else:
        out_ptrs = out_ptr + out_rows[:, None] * stride_om + offs_n[None, :] * stride_on
        out_mask = row_valid[:, None] & n_valid[None, :]
    if ROUTE_WEIGHTED:
        route = tl.load(route_weights_ptr + pairs, mask=row_valid, other=0.0).to(tl.float32)
        if SWAP:
            tl.atomic_add(out_ptrs, acc * route[None, :], mask=out_mask)
        else:
            tl.atomic_add(out_ptrs, acc * route[:, None], mask=out_mask)
    elif CODES_OUT > 0:
        # The next GEMM's activations (the experts' down): the output as it would have been stored, rounded per
        # row over this program's BLOCK_N columns (one K step there) as `activation_codes_kernel` rounds it.
        values = acc  # converted as the plain store below converts (the interpreter's truncation included)
        if OUT_ROUND == 1:
            values = values.to(tl.bfloat16).to(tl.float32)
        elif OUT_ROUND == 2:
            values = values.to(tl.float16).to(tl.float32)
        codes, row_scale = quantized_activations(values, CODES_OUT, SWAP, FP32_MATH)
        if CODES_OUT == 2:
            codes = codes.to(tl.uint8, bitcast=True)
        tl.store(out_ptrs, codes, mask=out_mask)
        tl.store(os_ptr + out_rows * stride_osm + pid_n, row_scale, mask=row_valid)
    else:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
