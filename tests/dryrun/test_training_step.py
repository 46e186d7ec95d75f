"""A training step on fake CUDA tensors (no GPU, no driver): the trainer's CUDA path runs as it would on a card.

Runs in `make dryrun` (`.venv-cuda`: torch's CUDA build; the CPU suite skips the module); by hand:
`PYTHONPATH=<a folder whose dgemma_lsp links to this checkout> .venv-cuda/bin/python -m pytest
tests/dryrun/test_training_step.py`. The model is moved to a virtual H100 (accelerator.prepare), a
batch is copied there, the loss runs under bf16 autocast (torch disables CUDA autocast without a driver; its two
availability checks are answered here), then clipping and the fused AdamW step (backward needs the driver: zeros
stand in for the gradients). FakeTensor raises on any
operator that mixes devices or dtypes a CUDA kernel would refuse, so the step's passing is the check. It caught
the experts' grouped GEMM, which on CUDA takes bf16 operands only and is not autocast-enabled (fp32 master weights:
accelerator.use_autocast_experts). Host reads (`.item()`, `bool()`, boolean-mask indexing) are counted, answered
with ones, and reported; they are syncs on a card, not errors. Not seen here: backward, the noise generator (a
CUDA generator needs a driver: the step draws from the default one), kernel speed, memory, numerics.
"""

from __future__ import annotations

import collections
import random

import pytest
import torch

if torch.version.cuda is None:
    pytest.skip("needs the CUDA build of torch (.venv-cuda)", allow_module_level=True)

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.symbolic_shapes import ShapeEnv  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from dgemma_lsp.bench import dryrun  # noqa: E402
from dgemma_lsp.engine.model.tiny_model import build_tiny_model, build_tiny_tokenizer  # noqa: E402
from dgemma_lsp.engine.training.accelerator import AUTOCAST_EXPERTS, Accelerator  # noqa: E402
from dgemma_lsp.engine.training.corpus import CodeFile  # noqa: E402
from dgemma_lsp.engine.training.examples import ExampleMaker, end_of_turn_id  # noqa: E402
from dgemma_lsp.engine.training.objective import LMHead, collate, diffusion_loss  # noqa: E402
from tests.training.test_training import SAMPLE  # noqa: E402


class HostReads(TorchDispatchMode):
    """Answers a CUDA scalar read with one (so `bool(any)` takes the self-conditioning path) and counts it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == "cuda":
            self.reads["scalar"] += 1
            return True if args[0].dtype == torch.bool else 1 if not args[0].is_floating_point() else 1.0
        if func is torch.ops.aten.nonzero.default:
            self.reads["nonzero"] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def cuda_autocast(monkeypatch):
    """CUDA autocast as on a card: torch turns it off when no driver answers."""
    import torch.cuda.amp.common as amp_common

    monkeypatch.setattr(amp_common, "amp_definitely_not_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)


def test_a_bf16_training_step_runs_on_a_virtual_h100(cuda_autocast):
    tokenizer = build_tiny_tokenizer()
    maker = ExampleMaker(tokenizer, 32, max_prompt_tokens=400, context_tokens=(32, 160))
    file = CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)
    rows = [e for seed in range(30) if (e := maker.make(file, random.Random(seed)))][:4]
    batch = collate([e.prompt_ids for e in rows], [e.canvas_ids for e in rows], 0, end_of_turn_id(tokenizer))
    model = build_tiny_model().train()
    accelerator = Accelerator.from_recipe({"device": "cuda"})
    assert (accelerator.precision, accelerator.fused_adam) == ("bf16", True)
    h100 = next(gpu for gpu in dryrun.GPUS if gpu.name == "H100")
    reads = HostReads()
    with dryrun.virtual_gpu(h100), FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()), reads:
        model = accelerator.prepare(model)
        assert model.config.text_config._experts_implementation == AUTOCAST_EXPERTS
        optimizer = accelerator.optimizer(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
        on_card = type(batch)(*(tensor.to("cuda") for tensor in
                                (batch.prompt_ids, batch.prompt_mask, batch.canvas_ids, batch.answer_mask)))
        with accelerator.autocast():
            assert torch.is_autocast_enabled("cuda")
            parts = diffusion_loss(model, on_card, None, self_conditioning=0.5, answer_encoder_weight=1.0,
                                   clean_weight=0.3, pad_weight=0.1, head=LMHead(model))
        assert parts.total.device.type == "cuda" and parts.total.dtype == torch.float32
        # Backward needs the autograd engine's CUDA thread, which asks the driver for a context: the step's
        # gradients are stood in for by zeros of the weights' own device and dtype, then clipped and stepped.
        for parameter in model.parameters():
            parameter.grad = torch.zeros_like(parameter)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        parameters = list(model.parameters())
        assert all(p.device.type == "cuda" and p.dtype == torch.float32 for p in parameters)
        moments = [state["exp_avg"] for state in optimizer.state.values()]
        assert len(moments) == len(parameters) and all(m.device.type == "cuda" for m in moments)
    # Host reads of one step: the loss parts' figures, the self-conditioning draw, the answer masks.
    assert 0 < sum(reads.reads.values()) < 40, reads.reads
