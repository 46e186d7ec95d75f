"""Checkpoints in the community's formats, written here from a DiffusionGemma model (for tests and `bench formats`).

Each is written with the format's own writer:
- GGUF: `gguf.GGUFWriter`, names as llama.cpp's converter gives them (formats/gguf.py), types
  by llama-quantize's Q4_K_M / Q8_0 rules (formats.gguf.recipe_types). gguf 0.19 quantizes
  Q8_0 and Q5_0 itself (`gguf.quants.quantize`, bit-exact with ggml) but has no Q4_K or Q6_K
  encoder, so those two are encoded here: Q4_K by llama.cpp's `quantize_row_q4_K_ref`
  (`make_qkx2_quants`' search for each sub-block's scale and min), Q6_K by a plain per-16 absmax
  (llama.cpp searches a little further; a slightly worse Q6_K, never a wrong one). Every block
  written is read back by gguf's own dequantizer in the tests.
- compressed-tensors FP8-dynamic and NVFP4: compressed-tensors' own compressors
  (`FloatQuantizationCompressor`, `NVFP4PackedCompressor`) over per-channel / per-16 scales
  computed as its observers do (absmax), experts one per expert as vLLM reads them.
- ModelOpt NVFP4: its layout written out with safetensors (nvidia-modelopt itself needs CUDA
  to quantize): `weight` (packed e2m1), `weight_scale` (e4m3 per 16), `weight_scale_2`.

Imports torch, gguf and compressed-tensors inside functions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

QK_K = 256


# -- GGUF -------------------------------------------------------------------------------------


def write_gguf(model, config, path: Path, recipe: str) -> dict[str, int]:
    """Write `model` (a DiffusionGemma, any float dtype) as a `recipe` GGUF at `path`; returns name -> type."""
    import gguf
    import torch

    from dgemma_lsp.engine.weights.formats import gguf as ours

    text = config.text_config
    state = {key: value for key, value in model.state_dict().items()}
    names = ours.checkpoint_names(model, text.num_hidden_layers)
    shapes = {name: tuple(state[key].shape) for name, key in names.items()}
    types = ours.recipe_types(recipe, shapes)
    writer = gguf.GGUFWriter(path, ours.ARCHITECTURE)
    writer.add_block_count(text.num_hidden_layers)
    writer.add_embedding_length(text.hidden_size)
    writer.add_expert_count(text.num_experts)
    writer.add_expert_used_count(text.top_k_experts)
    writer.add_file_type(int(gguf.LlamaFileType[f"MOSTLY_{recipe}"]))
    writer.add_name("diffusiongemma test checkpoint")
    for name in sorted(names, key=_order):
        values = state[names[name]].detach().to(torch.float32).numpy()
        kind = gguf.GGMLQuantizationType(types[name])
        writer.add_tensor(name, encode(values, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return types


def encode(values: np.ndarray, kind) -> np.ndarray:
    """`values` (fp32, last dim a multiple of the block) in GGUF type `kind`: raw blocks, uint8 [..., row bytes]."""
    import gguf

    if kind == gguf.GGMLQuantizationType.F32:
        return values.astype(np.float32)
    if kind == gguf.GGMLQuantizationType.Q4_K:
        return _rows(values, quantize_q4_k)
    if kind == gguf.GGMLQuantizationType.Q6_K:
        return _rows(values, quantize_q6_k)
    return gguf.quants.quantize(values, kind)


def _rows(values: np.ndarray, encoder) -> np.ndarray:
    rows = values.reshape(-1, values.shape[-1])
    blocks = encoder(rows.reshape(-1, QK_K))  # [rows * K/256, bytes]
    return blocks.reshape(*values.shape[:-1], -1)


def quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """fp32 [n, 256] -> Q4_K blocks uint8 [n, 144], as llama.cpp's quantize_row_q4_K_ref."""
    n = blocks.shape[0]
    x = blocks.reshape(n, 8, 32).astype(np.float32)
    av_x = np.sqrt((x * x).mean(axis=-1, keepdims=True))
    weights = av_x + np.abs(x)
    scales, mins = _make_qkx2(x, weights, nmax=15, rmin=-1.0, rdelta=0.1, nstep=20)  # [n, 8] each
    max_scale = scales.max(axis=1, keepdims=True)
    max_min = mins.max(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv_scale = np.where(max_scale > 0, 63.0 / max_scale, 0.0)
        inv_min = np.where(max_min > 0, 63.0 / max_min, 0.0)
    ls = np.minimum(63, _nearest(inv_scale * scales)).astype(np.uint8)
    lm = np.minimum(63, _nearest(inv_min * mins)).astype(np.uint8)
    d = (max_scale / 63.0).astype(np.float16)
    dmin = (max_min / 63.0).astype(np.float16)
    sub_d = d.astype(np.float32) * ls  # [n, 8]
    sub_m = dmin.astype(np.float32) * lm
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(sub_d[..., None] > 0, _nearest((x + sub_m[..., None]) / sub_d[..., None]), 0)
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(n, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(n, 128)
    packed = np.zeros((n, 12), dtype=np.uint8)
    packed[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    return np.concatenate([d.view(np.uint8), dmin.view(np.uint8), packed, qs], axis=1)


def _make_qkx2(x, weights, *, nmax, rmin, rdelta, nstep):
    """llama.cpp's make_qkx2_quants over [..., 32] sub-blocks: (scale, -min) per sub-block (min <= 0)."""
    low = np.minimum(x.min(axis=-1), 0.0)
    high = x.max(axis=-1)
    spread = high - low
    safe = np.where(spread > 0, spread, 1.0)
    sum_w = weights.sum(-1)
    sum_x = (weights * x).sum(-1)
    iscale = nmax / safe
    q = np.clip(_nearest(iscale[..., None] * (x - low[..., None])), 0, nmax)
    best_scale = 1.0 / iscale
    best_min = low.copy()
    best_err = (weights * (best_scale[..., None] * q + best_min[..., None] - x) ** 2).sum(-1)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * step + nmax) / safe
        trial = np.clip(_nearest(iscale[..., None] * (x - low[..., None])), 0, nmax)
        sum_l = (weights * trial).sum(-1)
        sum_l2 = (weights * trial * trial).sum(-1)
        sum_xl = (weights * trial * x).sum(-1)
        det = sum_w * sum_l2 - sum_l * sum_l
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(det > 0, (sum_w * sum_xl - sum_x * sum_l) / det, 0.0)
            minimum = np.where(det > 0, (sum_l2 * sum_x - sum_l * sum_xl) / det, 0.0)
            positive = minimum > 0
            scale = np.where(positive, np.where(sum_l2 > 0, sum_xl / sum_l2, 0.0), scale)
            minimum = np.where(positive, 0.0, minimum)
        err = (weights * (scale[..., None] * trial + minimum[..., None] - x) ** 2).sum(-1)
        better = (det > 0) & (err < best_err)
        best_scale = np.where(better, scale, best_scale)
        best_min = np.where(better, minimum, best_min)
        best_err = np.where(better, err, best_err)
    flat = spread <= 0
    return np.where(flat, 0.0, best_scale).astype(np.float32), np.where(flat, 0.0, -best_min).astype(np.float32)


def quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """fp32 [n, 256] -> Q6_K blocks uint8 [n, 210]: per 16 values a signed absmax scale (values in -32..31)."""
    n = blocks.shape[0]
    x = blocks.reshape(n, 16, 16).astype(np.float32)
    index = np.abs(x).argmax(axis=-1)[..., None]
    signed_max = np.take_along_axis(x, index, axis=-1)[..., 0]  # [n, 16]
    sub_scale = -signed_max / 32.0
    big = np.take_along_axis(sub_scale, np.abs(sub_scale).argmax(axis=-1)[:, None], axis=-1)  # [n, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(big != 0, -128.0 / big, 0.0)
    d = np.where(iscale != 0, 1.0 / np.where(iscale != 0, iscale, 1.0), 0.0).astype(np.float16)
    ls = np.clip(_nearest(iscale * sub_scale), -128, 127).astype(np.int8)
    step = d.astype(np.float32) * ls.astype(np.float32)  # [n, 16]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step[..., None] != 0, _nearest(x / step[..., None]), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(n, 256)
    low, high = q & 0xF, q >> 4
    ql = np.zeros((n, 128), dtype=np.uint8)
    qh = np.zeros((n, 64), dtype=np.uint8)
    for half in range(2):
        base = half * 128
        ql[:, half * 64 : half * 64 + 64] = low[:, base : base + 64] | (low[:, base + 64 : base + 128] << 4)
        qh[:, half * 32 : half * 32 + 32] = (high[:, base : base + 32] | (high[:, base + 32 : base + 64] << 2)
                                             | (high[:, base + 64 : base + 96] << 4)
                                             | (high[:, base + 96 : base + 128] << 6))
    return np.concatenate([ql, qh, ls.view(np.uint8), d.view(np.uint8)], axis=1)


def _nearest(values: np.ndarray) -> np.ndarray:
    """Round half away from zero, as C's roundf/nearest_int."""
    return np.sign(values) * np.floor(np.abs(values) + 0.5)


def _order(name: str) -> tuple[int, str]:
    digits = name.split(".")[1] if name.startswith("blk.") else ""
    return (int(digits) if digits.isdigit() else -1, name)


# -- safetensors formats ------------------------------------------------------------------------


def write_compressed_tensors(model, folder: Path, scheme: str, base_folder: Path) -> None:
    """Write `model` as a compressed-tensors `scheme` ("FP8_DYNAMIC" or "NVFP4") checkpoint into `folder`,
    experts one per expert, with compressed-tensors' own compressor; tokenizer and configs from `base_folder`."""
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, preset_name_to_scheme
    from safetensors.torch import save_file

    quant_scheme = preset_name_to_scheme(scheme, ["Linear"])
    fmt = "float-quantized" if scheme == "FP8_DYNAMIC" else "nvfp4-pack-quantized"
    compressor = BaseCompressor.load_from_registry(fmt)
    tensors: dict[str, torch.Tensor] = {}
    for key, weight in _linears(model):
        scale, global_scale = _observe(weight, scheme)
        module_state = {"weight": weight, "weight_scale": scale}
        if global_scale is not None:
            module_state["weight_global_scale"] = global_scale
        for part, value in compressor.compress(module_state, quant_scheme).items():
            tensors[f"{key}.{part}"] = value.contiguous()
    for key, value in model.state_dict().items():
        if key not in _linear_keys(model) and not _tied_copy(key):
            tensors[key] = value.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    config = QuantizationConfig(config_groups={"group_0": quant_scheme}, format=fmt,
                                quantization_status=QuantizationStatus.COMPRESSED,
                                ignore=["lm_head", "re:.*router.*", "re:.*vision.*"])
    _configs(folder, base_folder, config.model_dump(exclude_none=True) | {"quant_method": "compressed-tensors"})


def write_modelopt_nvfp4(model, folder: Path, base_folder: Path) -> None:
    """Write `model` in ModelOpt's NVFP4 layout into `folder` (weight, weight_scale, weight_scale_2, input_scale)."""
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for key, weight in _linears(model):
        block_scale, global_scale = _observe(weight, "NVFP4")  # compressed-tensors' convention: global = 1 / ModelOpt's
        scale_2 = (1.0 / global_scale.float()).reshape(())
        codes = _e2m1_codes(weight.float() / (block_scale.float().repeat_interleave(16, dim=-1) * scale_2))
        tensors[f"{key}.weight"] = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()
        tensors[f"{key}.weight_scale"] = block_scale.to(torch.float8_e4m3fn).contiguous()
        tensors[f"{key}.weight_scale_2"] = scale_2.float()
        tensors[f"{key}.input_scale"] = torch.ones(())
    for key, value in model.state_dict().items():
        if key not in _linear_keys(model) and not _tied_copy(key):
            tensors[key] = value.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    _configs(folder, base_folder, {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                   "exclude_modules": ["lm_head", "*router*"]})


def _observe(weight, scheme: str):
    """(scale, global scale or None) as compressed-tensors' absmax observers set them."""
    import torch
    from compressed_tensors.quantization.utils import generate_gparam

    w = weight.float()
    if scheme == "FP8_DYNAMIC":
        scale = (w.abs().amax(dim=-1, keepdim=True) / torch.finfo(torch.float8_e4m3fn).max).clamp(min=1e-12)
        return scale.to(weight.dtype if weight.dtype != torch.float32 else torch.float32), None
    global_scale = generate_gparam(w.amin(), w.amax())  # fp8 max * fp4 max / absmax
    groups = w.reshape(*w.shape[:-1], -1, 16)
    block = groups.abs().amax(dim=-1) / 6.0 * global_scale
    # rounded to e4m3 here (the compressor stores it so) but handed over as float, as its observers do
    block = block.clamp(min=torch.finfo(torch.float8_e4m3fn).tiny, max=448).to(torch.float8_e4m3fn).float()
    return block, global_scale.reshape(1).float()


def _e2m1_codes(values):
    """Nearest e2m1 code (sign in bit 3) of each value (already divided by its scales)."""
    import torch

    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    magnitude = (values.abs().clamp(max=6.0)[..., None] - grid).abs().argmin(dim=-1)
    return (magnitude | ((values < 0).to(torch.long) << 3)).to(torch.uint8)


def _linears(model):
    """(checkpoint name, weight [N, K]) of every linear a quantized checkpoint holds quantized: the text linears
    (not the router) and each expert's gate, up and down, named as vLLM reads them."""
    from dgemma_lsp.engine.weights.quantization import _quantizable_modules

    experts_groups, linear_groups = _quantizable_modules(model)
    for group in linear_groups:
        name = _decoder_name([n for n, _ in group])
        yield name, group[0][1].weight.detach()
    for group in experts_groups:
        name, module = _decoder_name([n for n, _ in group]), group[0][1]
        middle = module.gate_up_proj.shape[1] // 2
        for expert in range(module.num_experts):
            yield f"{name}.{expert}.gate_proj", module.gate_up_proj[expert, :middle].detach()
            yield f"{name}.{expert}.up_proj", module.gate_up_proj[expert, middle:].detach()
            yield f"{name}.{expert}.down_proj", module.down_proj[expert].detach()


def _linear_keys(model) -> set[str]:
    from dgemma_lsp.engine.weights.quantization import _quantizable_modules

    experts_groups, linear_groups = _quantizable_modules(model)
    keys = {f"{name}.weight" for group in linear_groups for name, _ in group}
    keys |= {f"{name}.{part}" for group in experts_groups for name, _ in group for part in ("gate_up_proj", "down_proj")}
    return keys


def _decoder_name(names: list[str]) -> str:
    return next((name for name in names if name.startswith("model.decoder.")), names[0])


def _tied_copy(key: str) -> bool:
    """Keys save_pretrained leaves out because they share the decoder's tensor."""
    return key == "lm_head.weight" or (key.startswith("model.encoder.language_model.")
                                       and not key.endswith("layer_scalar"))


def _configs(folder: Path, base_folder: Path, quantization_config: dict) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (base_folder / name).is_file():
            shutil.copy(base_folder / name, folder / name)
    config = json.loads((base_folder / "config.json").read_text("utf-8"))
    config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config, indent=1), "utf-8")
