"""The community's pre-quantized checkpoints through the real loader, on CPU, written here in each format.

Proves, per format (GGUF Q4_K_M and Q8_0, compressed-tensors FP8-dynamic and NVFP4, ModelOpt
NVFP4), on the real architecture shrunk (6 layers, hidden 256, 8 experts of width 96 — a width
Q4_K's 256-blocks do not tile, as the real 704): the files are found and said to be what they
are; the packed weights are the format's own dequantized weights (every tensor of a GGUF Q4_K_M, a Q8_0
and an FP8 checkpoint bit for bit, NVFP4 up to its scales' rounding to bf16); a decoder step agrees
with the bf16 model's argmax; a GGUF's repack is saved and the next start reads it instead;
the published GGUF's tensor names are the ones the loader maps; MLX, NVFP4 off an FP4 card and
a second quantization are refused in one line naming what to do; and a GGUF load holds far less
host memory than its file (each load in its own process, `bench load`, peak RSS).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dgemma_lsp.engine.errors import ModelLoadError
from dgemma_lsp.engine.kernels.quant_formats import dequantize
from dgemma_lsp.engine.weights import loading
from dgemma_lsp.engine.weights.formats import detect

HERE = Path(__file__).parent
BUILD = """
import sys, shutil, torch
from pathlib import Path
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DiffusionGemmaTextConfig, Gemma4VisionConfig
from dgemma_lsp.engine.model.tiny_model import VISION_CONFIG, ensure_tiny_random_model
out = Path(sys.argv[1])
text = DiffusionGemmaTextConfig(vocab_size=1024, hidden_size=256, intermediate_size=160, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=64,
    layer_types=["sliding_attention"] * 5 + ["full_attention"], global_head_dim=64,
    num_experts=8, top_k_experts=2, moe_intermediate_size=96, pad_token_id=0, eos_token_id=1, bos_token_id=2)
config = DiffusionGemmaConfig(text_config=text.to_dict(), vision_config=Gemma4VisionConfig(**VISION_CONFIG),
    canvas_length=32, image_token_id=1023, boi_token_id=1022, eoi_token_id=1021)
torch.manual_seed(0)
DiffusionGemmaForBlockDiffusion(config).save_pretrained(out)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    shutil.copy(ensure_tiny_random_model() / name, out / name)
"""
WRITE = """
import sys, torch
from pathlib import Path
from transformers import AutoConfig
from dgemma_lsp.engine.weights.text_model import TextOnlyDiffusionGemma
from dgemma_lsp.bench import format_writers as w
base, out, kind = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
model = TextOnlyDiffusionGemma.from_pretrained(base, dtype=torch.float32)
if kind.startswith("gguf-"):
    out.mkdir(parents=True, exist_ok=True)
    w.write_gguf(model, AutoConfig.from_pretrained(base), out / f"model-{kind[5:]}.gguf", kind[5:])
elif kind == "modelopt-nvfp4":
    w.write_modelopt_nvfp4(model, out, base)
else:
    w.write_compressed_tensors(model, out, {"ct-fp8": "FP8_DYNAMIC", "ct-nvfp4": "NVFP4"}[kind], base)
"""
KINDS = ("gguf-Q4_K_M", "gguf-Q8_0", "ct-fp8", "ct-nvfp4", "modelopt-nvfp4")


class _Checkpoints(dict):
    """Folder per kind, each written the first time a test asks for it (a `-k` run writes only what it reads)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, kind: str) -> Path:
        assert kind == "base" or kind in KINDS, kind
        if kind == "base":
            subprocess.run([sys.executable, "-c", BUILD, str(self.root / "base")], check=True, capture_output=True,
                           timeout=300)
        else:
            subprocess.run([sys.executable, "-c", WRITE, str(self["base"]), str(self.root / kind), kind], check=True,
                           capture_output=True, timeout=600)
        self[kind] = self.root / kind
        return self[kind]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The shrunk model in bf16 ("base") and in each format; GGUF folders carry no config (as published)."""
    return _Checkpoints(tmp_path_factory.mktemp("formats"))


@pytest.fixture
def with_config(checkpoints, tmp_path) -> callable:
    """A GGUF folder with the base model's config and tokenizer beside it (a local folder as a user keeps one)."""

    def make(kind: str) -> Path:
        folder = tmp_path / kind
        shutil.copytree(checkpoints[kind], folder)
        for file in checkpoints["base"].iterdir():
            if file.suffix in (".json", ".jinja") and not (folder / file.name).exists():
                shutil.copy(file, folder / file.name)
        return folder

    return make


def _logits(model) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    prompt = torch.randint(4, 1000, (1, 12), generator=generator)
    canvas = torch.randint(4, 1000, (1, 32), generator=generator)
    with torch.no_grad():
        return model.eval()(input_ids=prompt, decoder_input_ids=canvas).logits  # [1, 32, vocab]


def _bf16(checkpoints):
    from dgemma_lsp.engine.weights.text_model import TextOnlyDiffusionGemma

    return TextOnlyDiffusionGemma.from_pretrained(checkpoints["base"], dtype=torch.float32)


@pytest.mark.parametrize(("kind", "label", "mode"), [
    ("gguf-Q4_K_M", "GGUF Q4_K_M", "int4"), ("gguf-Q8_0", "GGUF Q8_0", "int8"),
    ("ct-fp8", "compressed-tensors FP8-dynamic", "fp8"), ("ct-nvfp4", "compressed-tensors NVFP4", "fp8"),
    ("modelopt-nvfp4", "ModelOpt NVFP4", "fp8"),
])
def test_each_format_loads_says_what_it_is_and_agrees_with_bf16(kind, label, mode, checkpoints, with_config,
                                                                  tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "cache"))
    folder = with_config(kind) if kind.startswith("gguf") else checkpoints[kind]
    caplog.set_level("INFO", logger="dgemma_lsp.engine.weights")

    model, _, _ = loading.load_model_and_tokenizer(str(folder))

    assert model.checkpoint_format == label
    assert f"is {label}: loading it as {mode}" in caplog.text
    reference = _logits(_bf16(checkpoints))
    agreement = float((_logits(model).argmax(-1) == reference.argmax(-1)).float().mean())
    assert agreement >= 0.75, agreement  # a random model: routing flips amplify; our own int4 gets 0.875 here
    experts = model.model.decoder.layers[0].experts
    assert experts is model.model.encoder.language_model.layers[0].experts  # tied: one packed copy
    assert experts.mode == mode


def test_gguf_q8_0_repacks_to_int8_exactly(checkpoints, with_config, tmp_path, monkeypatch):
    """Q8_0 -> int8 in groups of 32 with the block's own fp16 scale: every weight is the file's, bit for bit."""
    from dgemma_lsp.engine.weights.formats import gguf

    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "cache"))
    folder = with_config("gguf-Q8_0")
    model, _, _ = loading.load_model_and_tokenizer(str(folder))
    (file,) = folder.glob("*.gguf")
    tensors = {t.name: t for t in gguf.read_tensors((file,))[0]}
    experts = model.model.decoder.layers[2].experts
    own = torch.from_numpy(gguf.dequantize_rows(tensors["blk.2.ffn_gate_up_exps.weight"], 0, 8 * 192))
    ours = dequantize(experts.gate_up_data, experts.gate_up_scales, "int8", torch.float32).reshape(-1, 256)
    assert experts.gate_up_scales.shape[-2] == 256 // 32 and experts.gate_up_scales.dtype == torch.float16
    assert torch.equal(ours, own)


def _held_weight(model, key: str) -> torch.Tensor:
    """The fp32 weight a loaded `model` holds for checkpoint key `key`: packed ones unpacked (each projection in its
    own mode and form), the rest as they are."""
    from dgemma_lsp.engine.weights.quantization import QuantizedExperts, QuantizedLinear

    module_name, _, attr = key.rpartition(".")
    module = model.get_submodule(module_name)
    if isinstance(module, QuantizedExperts):
        return module.unpacked(attr.removesuffix("_proj"), torch.float32)
    if isinstance(module, QuantizedLinear):
        return module.unpacked(torch.float32)
    held = module._parameters[attr] if attr in module._parameters else module._buffers[attr]
    return held.detach().float()


def test_gguf_q4_k_m_loads_every_tensor_exactly_as_gguf_dequantizes_it(checkpoints, with_config, tmp_path,
                                                                       monkeypatch):
    """"A repack must not lose more than the format already lost": every tensor of a Q4_K_M file (Q4_K, Q6_K,
    Q5_0, Q8_0 and F32 in one file, one experts module holding Q4_K gate_up and Q5_0/Q8_0 down) loads to the
    values gguf's own dequantizer gives, bit for bit (CPU: float32), on the first start and from the cache."""
    import gguf as gguf_package
    from transformers import AutoConfig

    from dgemma_lsp.engine.weights.formats import gguf

    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "cache"))
    folder = with_config("gguf-Q4_K_M")
    first, _, _ = loading.load_model_and_tokenizer(str(folder))
    again, _, _ = loading.load_model_and_tokenizer(str(folder))
    assert (first.loaded_from_packed_cache, again.loaded_from_packed_cache) == (False, True)
    (file,) = folder.glob("*.gguf")
    tensors, _ = gguf.read_tensors((file,))
    skeleton = loading._skeleton(AutoConfig.from_pretrained(folder), torch.float32)
    names = gguf.checkpoint_names(skeleton, 6)
    kinds = gguf_package.GGMLQuantizationType
    types = {t.name: kinds(t.qtype) for t in tensors}
    assert {kinds.Q4_K, kinds.Q6_K, kinds.Q5_0, kinds.Q8_0, kinds.F32} <= set(types.values())
    assert types["blk.0.ffn_gate_up_exps.weight"] == kinds.Q4_K
    assert types["blk.0.ffn_down_exps.weight"] in (kinds.Q5_0, kinds.Q8_0)
    differ = []
    for tensor in tensors:
        rows = int(np.prod(tensor.shape[:-1])) if len(tensor.shape) > 1 else 1
        own = torch.from_numpy(gguf.dequantize_rows(tensor, 0, rows)).reshape(tensor.shape)
        for start, model in (("first start", first), ("from the cache", again)):
            held = _held_weight(model, names[tensor.name])
            held = held[: own.shape[0]] if held.dim() == 2 and held.shape[1:] == own.shape[1:] else held
            if not torch.equal(held.reshape(own.shape), own):
                error = float((held.reshape(own.shape) - own).norm() / own.norm())
                differ.append(f"{tensor.name} ({types[tensor.name].name}, {start}): {error:.2e}")
    assert not differ, f"{len(differ)} differ:\n" + "\n".join(differ)


def test_a_gguf_repack_is_saved_and_read_back_on_the_next_start(checkpoints, with_config, tmp_path, monkeypatch):
    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "cache"))
    folder = with_config("gguf-Q4_K_M")
    first, _, _ = loading.load_model_and_tokenizer(str(folder))
    again, _, _ = loading.load_model_and_tokenizer(str(folder))
    assert (first.loaded_from_packed_cache, again.loaded_from_packed_cache) == (False, True)
    assert torch.equal(_logits(first), _logits(again))


def test_fp8_dynamic_goes_into_the_fp8_layout_bit_for_bit(checkpoints):
    """No round trip through bf16: the stored bytes are the checkpoint's e4m3 bytes and its own scale per row."""
    from safetensors import safe_open

    model, _, _ = loading.load_model_and_tokenizer(str(checkpoints["ct-fp8"]))
    with safe_open(str(checkpoints["ct-fp8"] / "model.safetensors"), "pt") as shard:
        weight = shard.get_tensor("model.decoder.layers.1.experts.5.up_proj.weight")
        scale = shard.get_tensor("model.decoder.layers.1.experts.5.up_proj.weight_scale")
        q_proj = shard.get_tensor("model.decoder.layers.1.self_attn.q_proj.weight")
    experts = model.model.decoder.layers[1].experts
    assert torch.equal(experts.gate_up_data[5, 96:], weight.view(torch.uint8))  # up rows follow the gate rows
    assert torch.equal(experts.gate_up_scales[5, :, 96:], scale.float().T)  # group-major [1, N], float32
    assert torch.equal(model.model.decoder.layers[1].self_attn.q_proj.weight_data, q_proj.view(torch.uint8))


@pytest.mark.parametrize("kind", ["ct-nvfp4", "modelopt-nvfp4"])
def test_nvfp4_values_are_kept_exactly_in_the_fp8_layout(kind, checkpoints):
    """compressed-tensors' own decompressor is the reference; ours differs only by bf16 scales (per 16)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from safetensors import safe_open

    model, _, _ = loading.load_model_and_tokenizer(str(checkpoints[kind]))
    base = "model.decoder.layers.3.self_attn.o_proj"
    with safe_open(str(checkpoints["ct-nvfp4"] / "model.safetensors"), "pt") as shard:
        state = {part: shard.get_tensor(f"{base}.{part}") for part in
                 ("weight_packed", "weight_scale", "weight_global_scale")}
    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    state["weight_shape"] = torch.tensor([256, 256])
    own = BaseCompressor.load_from_registry("nvfp4-pack-quantized").decompress(state, scheme)["weight"].float()
    linear = model.model.decoder.layers[3].self_attn.o_proj
    ours = dequantize(linear.weight_data, linear.weight_scales, "fp8", torch.float32)
    assert linear.weight_scales.shape == (256 // 16, 256)  # group-major
    assert torch.allclose(ours, own, rtol=2**-8, atol=1e-30)


def test_the_published_q4_k_m_files_tensor_names_are_the_ones_the_loader_maps():
    """Inventory of unsloth's Q4_K_M (692 tensors; read off the file by a third party, formats/gguf.py):
    our names for the real architecture are those, rope_freqs aside (written for llama.cpp's rope)."""
    import gguf as gguf_package

    from dgemma_lsp.engine.model.architecture import DIFFUSION_CONFIG
    from dgemma_lsp.engine.weights.choice import _architecture_config
    from dgemma_lsp.engine.weights.formats import gguf

    config = _architecture_config(DIFFUSION_CONFIG)
    skeleton = loading._skeleton(config, torch.bfloat16)
    names = gguf.checkpoint_names(skeleton, 30)
    assert len(names) + 1 == 692
    outside = {"token_embd.weight", "output_norm.weight", "self_cond_pre_norm.weight", "self_cond_gate.weight",
               "self_cond_up.weight", "self_cond_down.weight"}
    per_block = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                 "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm_1",
                 "pre_ffw_norm_2", "ffn_gate_inp", "ffn_gate_up_exps", "ffn_down_exps", "post_ffw_norm_2",
                 "post_ffw_norm", "layer_output_scale", "enc_layer_output_scale"}
    block0 = {name.split(".", 2)[2] for name in names if name.startswith("blk.0.")}
    assert outside <= set(names)
    assert block0 == {f"{part}.weight" for part in per_block} | {"ffn_gate_inp.scale", "ffn_down_exps.scale"}
    assert not [name for name in names if name.startswith("blk.5.attn_v")]  # full attention: V from K
    state = skeleton.state_dict(keep_vars=True)
    # ggml shapes as listed (innermost first): fused gate_up [2816, 1408, 128], down [704, 2816, 128]
    assert tuple(reversed(state[names["blk.0.ffn_gate_up_exps.weight"]].shape)) == (2816, 1408, 128)
    assert tuple(reversed(state[names["blk.0.ffn_down_exps.weight"]].shape)) == (704, 2816, 128)
    types = gguf.recipe_types("Q4_K_M", {n: tuple(state[k].shape) for n, k in names.items()})
    kinds = gguf_package.GGMLQuantizationType
    assert types["token_embd.weight"] == kinds.Q6_K and types["blk.3.ffn_gate_up_exps.weight"] == kinds.Q4_K
    assert {types[f"blk.{i}.ffn_down_exps.weight"] for i in range(30)} == {kinds.Q5_0, kinds.Q8_0}  # 704 % 256


def test_k_quant_encoders_write_blocks_ggufs_own_dequantizer_reads_back():
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize as gguf_dequantize

    from dgemma_lsp.bench.format_writers import encode

    values = np.random.default_rng(0).standard_normal((6, 512)).astype(np.float32)
    for kind, bound in ((T.Q4_K, 0.12), (T.Q6_K, 0.03), (T.Q8_0, 0.01)):
        back = gguf_dequantize(encode(values, kind), kind)
        error = np.linalg.norm(back - values) / np.linalg.norm(values)
        assert error < bound, (kind.name, error)


def test_refusals_name_what_to_do(checkpoints, tmp_path, monkeypatch):
    from dgemma_lsp.engine.weights import choice

    mlx = tmp_path / "mlx"
    shutil.copytree(checkpoints["base"], mlx)
    config = json.loads((mlx / "config.json").read_text())
    (mlx / "config.json").write_text(json.dumps({**config, "quantization": {"group_size": 64, "bits": 4}}))
    with pytest.raises(ModelLoadError, match=r"MLX 4-bit checkpoint: MLX runs on Apple silicon only"):
        loading.load_model_and_tokenizer(str(mlx))

    with pytest.raises(ModelLoadError, match=r"loads as fp8; --quantization int4 would quantize it a second time"):
        loading.load_model_and_tokenizer(str(checkpoints["ct-fp8"]), quantization="int4")

    # NVFP4 on an RTX 4090 (sm_89, 24 GiB): refused, naming the GGUF that fits the card.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    monkeypatch.setattr(choice, "free_device_bytes", lambda device: 23 * 1024**3)
    with pytest.raises(ModelLoadError) as refused:
        loading.load_model_and_tokenizer(str(checkpoints["ct-nvfp4"]), device="cuda")
    message = str(refused.value)
    assert "made for FP4 tensor cores (sm100/sm120); this GPU is sm_89" in message
    assert "fetch-model unsloth/diffusiongemma-26B-A4B-it-GGUF:Q4_K_M" in message and "\n" not in message


def test_a_gguf_without_config_names_the_fetch_that_brings_it(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(ModelLoadError, match=r"carries no config.json .* fetch-model"):
        loading.load_model_and_tokenizer(str(checkpoints["gguf-Q8_0"]))


def test_a_folder_of_several_gguf_variants_asks_for_one(checkpoints, tmp_path):
    folder = tmp_path / "both"
    folder.mkdir()
    for kind in ("gguf-Q4_K_M", "gguf-Q8_0"):
        for file in checkpoints[kind].glob("*.gguf"):
            shutil.copy(file, folder / file.name)
    with pytest.raises(ModelLoadError, match=r"holds 2 GGUF files .*: name one"):
        detect.find_format(folder)
    assert detect.find_format(folder, "Q8_0").label == "GGUF Q8_0"
    assert detect.find_format(folder, "q4_k_m").files == tuple(folder.glob("*Q4_K_M.gguf"))


def _bench_load(model: Path, cache: Path, *args: str) -> dict:
    env = {**os.environ, "DGEMMA_LSP_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "bench", "load", "--model", str(model),
                           "--json", *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.timeout(1500)
def test_a_gguf_load_holds_no_more_than_the_bf16_streaming_load_in_its_mode(tmp_path_factory, tmp_path):
    """The ~305 MB sharded test model as GGUF Q8_0 (~81 MB) against the same model's safetensors loaded with
    --quantization int8 (the streaming loader, same resident size): first start (dequantize + repack) and
    cached start grow the process no more than the streaming loader's, give or take half the GGUF file —
    a load that kept the file (or read it whole) would be a whole file above."""
    base = tmp_path_factory.mktemp("sharded")
    subprocess.run([sys.executable, str(HERE / "sharded_checkpoint.py"), str(base)], check=True, capture_output=True,
                   timeout=300)
    folder = tmp_path / "gguf"
    subprocess.run([sys.executable, "-c", WRITE, str(base), str(folder), "gguf-Q8_0"], check=True,
                   capture_output=True, timeout=900)
    for file in base.iterdir():
        if file.suffix in (".json", ".jinja") and not file.name.startswith("model."):
            shutil.copy(file, folder / file.name)

    streamed = [_bench_load(base, tmp_path / "cache-st", "--quantization", "int8") for _ in range(2)]
    loads = [_bench_load(folder, tmp_path / "cache-gguf") for _ in range(2)]

    assert loads[0]["format"] == "GGUF Q8_0" and loads[0]["checkpointBytes"] > 60 * 2**20
    assert [load["fromPackedCache"] for load in loads] == [False, True]
    for load, reference in zip(loads, streamed, strict=True):
        growth = load["peakRssBytes"] - load["baselineRssBytes"]
        allowed = reference["peakRssBytes"] - reference["baselineRssBytes"] + 0.5 * load["checkpointBytes"]
        assert growth < allowed, (load, reference)


KERNELS = """
import json, sys, torch
from dgemma_lsp.engine.weights.loading import load_model_and_tokenizer
torch.manual_seed(0)
model, _, _ = load_model_and_tokenizer(sys.argv[1])
experts = model.model.decoder.layers[0].experts
hidden, index, weights = torch.randn(8, 256), torch.randint(0, 8, (8, 2)), torch.rand(8, 2)
def rel(value, reference):
    return float((value - reference).norm() / reference.norm())
experts.backend, experts.quantize_activations = "triton", False
figures = {"scales": str(experts.gate_up_scales.dtype), "modes": [experts.mode, experts.down_mode],
           "mins": experts.gate_up_mins is not None,
           "super": None if experts.gate_up_super_scales is None else str(experts.gate_up_super_scales.dtype),
           "experts": rel(experts(hidden, index, weights), experts.forward_loop(hidden, index, weights))}
# w8a8 where a projection's weights are 8-bit: the kernels quantize that projection's activations, and only its
experts.quantize_activations = True
figures["w8a8"] = rel(experts(hidden, index, weights),
                     experts.forward_loop(hidden, index, weights, activations=experts.down_mode))
linear = model.model.decoder.layers[0].self_attn.q_proj
reference = linear(hidden)
linear.backend, linear.quantize_activations = "triton", False
figures["linear"] = rel(linear(hidden), reference)
print(json.dumps(figures))
"""


@pytest.mark.parametrize(("kind", "scales", "modes", "mins", "super_scales"), [
    ("ct-fp8", "torch.float32", ["fp8", "fp8"], False, None),
    ("gguf-Q8_0", "torch.float16", ["int8", "int8"], False, None),
    ("gguf-Q4_K_M", "torch.uint8", ["int4", "int8"], True, "torch.float16"),
])
def test_the_fused_kernels_read_the_checkpoints_own_scales(kind, scales, modes, mins, super_scales, checkpoints,
                                                           with_config, tmp_path):
    """FP8-dynamic's float32 scale per row, Q8_0's fp16 scale per 32 and Q4_K_M's affine int4 gate_up (uint8 sc
    and m per 32 under fp16 d and -dmin per 256) beside int8 down go through the Triton expert kernel (on the
    CPU in Triton's interpreter) as bf16 scales do: it matches the torch loop, and each projection's w8a8 goes
    with its own weights' kind."""
    folder = with_config(kind) if kind.startswith("gguf") else checkpoints[kind]
    env = {**os.environ, "TRITON_INTERPRET": "1", "DGEMMA_LSP_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", KERNELS, str(folder)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    assert (figures["scales"], figures["modes"], figures["mins"], figures["super"]) == (scales, modes, mins,
                                                                                        super_scales)
    assert figures["experts"] < 1e-5 and figures["linear"] < 1e-5 and figures["w8a8"] < 1e-5


def test_the_dry_runs_empty_rows_are_shaped_and_typed_as_a_files_blocks_decode(checkpoints):
    """bench/dryrun.py loads `--modes gguf-q4_k_m` through `gguf.stream_load` fed `gguf.empty_rows()` (fake
    tensors, no file): each exact type's fields (Q4_K's codes, sc, m, d, -dmin; Q6_K's, Q5_0's and Q8_0's
    values and scales) and each dequantized row must be what the file's rows give, or the dry run would place
    another layout than a real load."""
    import gguf as gguf_package

    from dgemma_lsp.engine.weights.formats import gguf

    (file,) = checkpoints["gguf-Q4_K_M"].glob("*.gguf")
    tensors, _ = gguf.read_tensors((file,))
    kinds = gguf_package.GGMLQuantizationType
    first_of_type = {t.qtype: t for t in reversed(tensors) if len(t.shape) > 1}
    assert {kinds.Q4_K, kinds.Q6_K, kinds.Q5_0, kinds.Q8_0} <= set(first_of_type)
    files, empty = gguf.file_rows(), gguf.empty_rows()

    def described(parts):
        return [(tuple(part.shape), part.dtype) for part in parts]

    for qtype, tensor in first_of_type.items():
        assert described([empty.values(tensor, 1, 3)]) == described([files.values(tensor, 1, 3)]), kinds(qtype)
        if qtype in (kinds.Q4_K, kinds.Q6_K, kinds.Q5_0, kinds.Q8_0):
            assert described(empty.exact(tensor, 1, 3)) == described(files.exact(tensor, 1, 3)), kinds(qtype)
