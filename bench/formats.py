"""`dgemma-lsp bench formats`: what loading each community format costs in answers, against bf16 and against the format itself.

For each format (GGUF Q4_K_M and Q8_0, compressed-tensors FP8-dynamic and NVFP4, ModelOpt NVFP4)
this writes the same seeded random model — DiffusionGemma's architecture shrunk (6 layers, 5:1
sliding/full, hidden 256, 16 experts top-4 of width 96, a width Q4_K's 256-blocks do not tile, as
the real 704 does not) — with the format's own writer (bench/format_writers.py), loads it through
the product's loader (our packed layout), and builds a second model holding the format's *own*
dequantized weights (gguf.quants.dequantize, compressed-tensors' decompressor, ModelOpt's formula)
in fp32. Then, on CPU:

- weights: relative error of layer 0's experts, gate_up and down: format vs bf16 (what the format
  lost), ours vs format (what our repack lost on top), and their ratio — "a repack must not lose
  more than the format already lost" is ratio < 1;
- one MoE layer: relative error of layer 0's experts' output on 64 random tokens routed by the
  bf16 router, the same three ways;
- one decoder step: top-1 agreement of the canvas logits with bf16, ours and the format's;
- for GGUF Q4_K, the same blocks in quant_formats' affine int4 (codes 0..15, a scale and a min per
  32 inputs, as Q4_K's sub-blocks are) with bf16 and with float32 scales, built here from the blocks
  apart from the loader: float32 is exact (the loader's form), bf16 what the cheaper scales would lose.

Random weights say nothing of quality; the errors compare formats and repacks on equal terms.
Tables and JSON to stdout, progress to stderr; torch is imported inside functions.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec

from .report import say, write_report

KINDS = ("gguf-Q4_K_M", "gguf-Q8_0", "ct-fp8", "ct-nvfp4", "modelopt-nvfp4")
TEXT = {
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 160, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "sliding_window": 64,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "global_head_dim": 64,
    "num_experts": 16, "top_k_experts": 4, "moe_intermediate_size": 96,
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
}
SEED = 0
TOKENS = 64


class FormatFigure(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    kind: str
    label: str
    mode: str
    resident_bytes: int
    gate_up_format_error: float
    gate_up_repack_error: float
    down_format_error: float
    down_repack_error: float
    moe_format_error: float
    """||MoE(format) - MoE(bf16)|| / ||MoE(bf16)||, layer 0."""
    moe_repack_error: float
    """||MoE(ours) - MoE(format)|| / ||MoE(format)||."""
    moe_total_error: float
    """||MoE(ours) - MoE(bf16)|| / ||MoE(bf16)||."""
    top1_ours: float
    """Share of canvas positions whose argmax matches bf16's, our load."""
    top1_format: float
    """The same for the format's own dequantized weights."""
    asymmetric_repack_error: float | None = None
    """GGUF Q4_K gate_up in quant_formats' affine int4 (groups of 32) with bf16 scales and mins, vs the format."""
    asymmetric_fp32_repack_error: float | None = None
    """The same with float32 scales and mins (the layout's lossless form for Q4_K, which the loader uses)."""


class FormatsReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    architecture: dict
    figures: list[FormatFigure]


def add_arguments(parser) -> None:
    parser.add_argument("--kinds", nargs="*", choices=KINDS, default=list(KINDS), help="formats to measure")


def run(args) -> int:
    report = run_benchmark(args.kinds)
    write_report(report, args.json, format_table)
    return 0


def run_benchmark(kinds: list[str] | tuple[str, ...] = KINDS) -> FormatsReport:
    import torch

    with tempfile.TemporaryDirectory(prefix="dgemma-formats-") as scratch:
        root = Path(scratch)
        base = _write_base(root / "base")
        from dgemma_lsp.engine.weights.text_model import TextOnlyDiffusionGemma

        bf16 = TextOnlyDiffusionGemma.from_pretrained(base, dtype=torch.float32).eval()
        probe = _probe(bf16)
        figures = []
        for kind in kinds:
            say(f"formats: {kind}")
            figures.append(_measure(kind, root, base, bf16, probe))
    return FormatsReport(architecture=TEXT, figures=figures)


def format_table(report: FormatsReport) -> str:
    lines = ["format               mode  resident  gate_up fmt/ours(ratio)    down fmt/ours(ratio)      "
             "MoE layer fmt/ours/total       top-1 ours/fmt  asym-int4 g32"]
    for f in report.figures:
        asym = (f"{f.asymmetric_repack_error:.2e} (fp32 {f.asymmetric_fp32_repack_error:.1e})"
                if f.asymmetric_repack_error is not None else "-")
        lines.append(
            f"{f.label:20} {f.mode:5} {f.resident_bytes / 2**20:6.1f}M  "
            f"{f.gate_up_format_error:.2e}/{f.gate_up_repack_error:.2e}({f.gate_up_repack_error / f.gate_up_format_error:4.2f})  "
            f"{f.down_format_error:.2e}/{f.down_repack_error:.2e}({f.down_repack_error / f.down_format_error:4.2f})  "
            f"{f.moe_format_error:.2e}/{f.moe_repack_error:.2e}/{f.moe_total_error:.2e}  "
            f"{f.top1_ours:.3f}/{f.top1_format:.3f}    {asym}"
        )
    return "\n".join(lines)


# -- pieces -------------------------------------------------------------------------------


def _write_base(folder: Path) -> Path:
    import shutil

    import torch
    from transformers import (
        DiffusionGemmaConfig,
        DiffusionGemmaForBlockDiffusion,
        DiffusionGemmaTextConfig,
        Gemma4VisionConfig,
    )

    from dgemma_lsp.engine.model.tiny_model import VISION_CONFIG, ensure_tiny_random_model

    config = DiffusionGemmaConfig(text_config=DiffusionGemmaTextConfig(**TEXT).to_dict(),
                                  vision_config=Gemma4VisionConfig(**VISION_CONFIG), canvas_length=32,
                                  image_token_id=1023, boi_token_id=1022, eoi_token_id=1021)
    torch.manual_seed(SEED)
    DiffusionGemmaForBlockDiffusion(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(ensure_tiny_random_model() / name, folder / name)
    return folder


def _probe(bf16):
    """Fixed inputs: a prompt and canvas for a decoder step; 64 hidden states routed by layer 0's bf16 router."""
    import torch

    generator = torch.Generator().manual_seed(SEED + 1)
    prompt = torch.randint(4, 1000, (1, 24), generator=generator)
    canvas = torch.randint(4, 1000, (1, 32), generator=generator)
    hidden = torch.randn(TOKENS, TEXT["hidden_size"], generator=generator)
    layer = bf16.model.decoder.layers[0]
    with torch.no_grad():
        _, weights, index = layer.router(hidden)
        logits = bf16(input_ids=prompt, decoder_input_ids=canvas).logits
        moe = layer.experts(hidden, index, weights)
    return {"prompt": prompt, "canvas": canvas, "hidden": hidden, "index": index, "weights": weights,
            "logits": logits, "moe": moe}


def _measure(kind: str, root: Path, base: Path, bf16, probe) -> FormatFigure:
    import os

    import torch
    from transformers import AutoConfig

    from dgemma_lsp.engine.runtime.denoising import _resident_bytes
    from dgemma_lsp.engine.weights.loading import load_model_and_tokenizer

    from . import format_writers as writers

    folder = root / kind
    if kind.startswith("gguf-"):
        folder.mkdir()
        writers.write_gguf(bf16, AutoConfig.from_pretrained(base), folder / f"model-{kind[5:]}.gguf", kind[5:])
        for file in base.iterdir():
            if file.suffix in (".json", ".jinja"):
                (folder / file.name).write_bytes(file.read_bytes())
    elif kind == "modelopt-nvfp4":
        writers.write_modelopt_nvfp4(bf16, folder, base)
    else:
        writers.write_compressed_tensors(bf16, folder, {"ct-fp8": "FP8_DYNAMIC", "ct-nvfp4": "NVFP4"}[kind], base)
    os.environ["DGEMMA_LSP_CACHE"] = str(root / "cache")
    ours, _, _ = load_model_and_tokenizer(str(folder))
    own = _format_model(kind, folder, base)
    experts_ours = ours.model.decoder.layers[0].experts
    experts_own = own.model.decoder.layers[0].experts
    experts_bf16 = bf16.model.decoder.layers[0].experts
    errors = {}
    for which in ("gate_up", "down"):
        mine = experts_ours.unpacked(which, torch.float32)  # each projection in its own mode (and mins)
        theirs = getattr(experts_own, f"{which}_proj").detach()
        truth = getattr(experts_bf16, f"{which}_proj").detach()
        errors[which] = (_rel(theirs, truth), _rel(mine, theirs))
    with torch.no_grad():
        moe_ours = experts_ours(probe["hidden"], probe["index"], probe["weights"])
        moe_own = experts_own(probe["hidden"], probe["index"], probe["weights"])
        top1 = [float((m(input_ids=probe["prompt"], decoder_input_ids=probe["canvas"]).logits.argmax(-1)
                       == probe["logits"].argmax(-1)).float().mean()) for m in (ours, own)]
    asymmetric = asymmetric_exact = None
    if kind == "gguf-Q4_K_M":
        asymmetric = _asymmetric_q4_k(folder, experts_own, torch.bfloat16)
        asymmetric_exact = _asymmetric_q4_k(folder, experts_own, torch.float32)
    return FormatFigure(
        kind=kind, label=ours.checkpoint_format, mode=experts_ours.mode, resident_bytes=_resident_bytes(ours),
        gate_up_format_error=errors["gate_up"][0], gate_up_repack_error=errors["gate_up"][1],
        down_format_error=errors["down"][0], down_repack_error=errors["down"][1],
        moe_format_error=_rel(moe_own, probe["moe"]), moe_repack_error=_rel(moe_ours, moe_own),
        moe_total_error=_rel(moe_ours, probe["moe"]), top1_ours=top1[0], top1_format=top1[1],
        asymmetric_repack_error=asymmetric, asymmetric_fp32_repack_error=asymmetric_exact,
    )


def _format_model(kind: str, folder: Path, base: Path):
    """The bf16 architecture in fp32 holding the format's own dequantized weights (no repack)."""
    import torch
    from safetensors import safe_open

    from dgemma_lsp.engine.weights.text_model import TextOnlyDiffusionGemma

    from .format_writers import _linears

    model = TextOnlyDiffusionGemma.from_pretrained(base, dtype=torch.float32).eval()
    state = model.state_dict()
    if kind.startswith("gguf-"):
        from dgemma_lsp.engine.weights.formats import gguf

        (file,) = folder.glob("*.gguf")
        tensors, _ = gguf.read_tensors((file,))
        names = gguf.checkpoint_names(model, TEXT["num_hidden_layers"])
        with torch.no_grad():
            for tensor in tensors:
                if tensor.name in names:
                    rows = 1
                    for dim in tensor.shape[:-1]:
                        rows *= dim
                    values = torch.from_numpy(gguf.dequantize_rows(tensor, 0, rows))
                    state[names[tensor.name]].copy_(values.reshape(state[names[tensor.name]].shape))
        return model
    decompress = _decompressor(kind)
    with safe_open(str(folder / "model.safetensors"), "pt") as shard, torch.no_grad():
        for name, weight in _linears(model):
            values = decompress(shard, name, tuple(weight.shape))
            weight.copy_(values)  # a view into the model's parameter (experts: a slice of the stack)
    return model


def _decompressor(kind: str):
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    from dgemma_lsp.engine.weights.formats.prequantized import unpack_e2m1

    if kind == "modelopt-nvfp4":
        def modelopt(shard, name, shape):
            values = unpack_e2m1(shard.get_tensor(f"{name}.weight"))
            scale = shard.get_tensor(f"{name}.weight_scale").float().repeat_interleave(16, dim=-1)
            return values * scale * shard.get_tensor(f"{name}.weight_scale_2").float()
        return modelopt
    scheme = preset_name_to_scheme("FP8_DYNAMIC" if kind == "ct-fp8" else "NVFP4", ["Linear"])
    fmt = "float-quantized" if kind == "ct-fp8" else "nvfp4-pack-quantized"
    compressor = BaseCompressor.load_from_registry(fmt)
    parts = ("weight", "weight_scale") if kind == "ct-fp8" else ("weight_packed", "weight_scale", "weight_global_scale")

    def own(shard, name, shape):
        module_state = {part: shard.get_tensor(f"{name}.{part}") for part in parts}
        module_state["weight_shape"] = torch.tensor(shape)
        return compressor.decompress(module_state, scheme)["weight"].float()
    return own


def _asymmetric_q4_k(folder: Path, experts_own, scale_dtype) -> float:
    """Layer 0's Q4_K gate_up in quant_formats' affine int4 (tiles of codes 0..15, weight = scale * code + min,
    groups of 32), its scale (d*sc) and min (-dmin*m) per Q4_K sub-block stored in `scale_dtype`, against the
    format's own values: float32 holds them exactly (quant_formats' docstring), bf16 rounds them."""
    import numpy as np
    import torch
    from gguf.quants import Q4_K

    from dgemma_lsp.engine.kernels.quant_formats import dequantize, pack_int4_tiles
    from dgemma_lsp.engine.weights.formats import gguf

    (file,) = folder.glob("*.gguf")
    tensor = next(t for t in gguf.read_tensors((file,))[0] if t.name == "blk.0.ffn_gate_up_exps.weight")
    experts, rows, columns = tensor.shape
    blocks = gguf.read_blocks(tensor, 0, experts * rows).reshape(-1, 144)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, mins = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    codes = (blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0xF
    codes = torch.from_numpy(codes.reshape(experts, rows, columns).astype(np.uint8))
    scales = torch.from_numpy(d * sc.astype(np.float32)).reshape(experts, rows, -1)  # [E, N, K/32]
    minimum = torch.from_numpy(-dmin * mins.astype(np.float32)).reshape(experts, rows, -1)
    held = dequantize(pack_int4_tiles(codes), scales.to(scale_dtype).transpose(-1, -2).contiguous(), "int4",
                      torch.float32, mins=minimum.to(scale_dtype).transpose(-1, -2).contiguous())
    return _rel(held, experts_own.gate_up_proj.detach())


def _rel(value, reference) -> float:
    return float((value.float() - reference.float()).norm() / reference.float().norm())
