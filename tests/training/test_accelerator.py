"""The trainer's device, precision and cost (engine/training/accelerator.py), on the CPU: the same loss path under
bf16 autocast, 6·N·D with the right N, GPU-seconds only on a GPU, and a time budget that ends the schedule."""

import random

import pytest
import torch

from dgemma_lsp.engine.model.tiny_model import build_tiny_model, build_tiny_tokenizer
from dgemma_lsp.engine.training.accelerator import Accelerator, CostMeter, Deadline, active_parameters
from dgemma_lsp.engine.training.corpus import CodeFile
from dgemma_lsp.engine.training.examples import ExampleMaker, end_of_turn_id
from dgemma_lsp.engine.training.objective import collate, diffusion_loss
from dgemma_lsp.engine.training.train import _learning_rate
from tests.manual_clock import ManualClock
from tests.training.test_training import SAMPLE


@pytest.fixture(scope="module")
def batch():
    tokenizer = build_tiny_tokenizer()
    maker = ExampleMaker(tokenizer, 32, max_prompt_tokens=400, context_tokens=(32, 160))
    file = CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)
    rows = [e for seed in range(30) if (e := maker.make(file, random.Random(seed)))][:4]
    return collate([e.prompt_ids for e in rows], [e.canvas_ids for e in rows], 0, end_of_turn_id(tokenizer))


def test_a_cpu_recipe_without_the_knobs_trains_as_before():
    accelerator = Accelerator.from_recipe({})
    assert accelerator == Accelerator(torch.device("cpu"), "fp32", False, "none")
    assert Accelerator.from_recipe({"device": "auto"}).device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    # A GPU's defaults: bf16 and the fused optimizer (the dataclass only: no device is touched).
    assert Accelerator.from_recipe({}, "cuda") == Accelerator(torch.device("cuda"), "bf16", True, "none")
    with pytest.raises(AssertionError):
        Accelerator.from_recipe({"compile": "everything"})


def test_bf16_autocast_takes_the_same_loss_path_and_learns(batch):
    """The loss under bf16 autocast is the fp32 loss within bf16's rounding, and its steps lower it."""
    model = build_tiny_model().train()
    fp32, bf16 = Accelerator.from_recipe({}), Accelerator.from_recipe({"precision": "bf16"})
    with torch.no_grad():
        plain = diffusion_loss(model, batch, torch.Generator().manual_seed(0), self_conditioning=0.5,
                               answer_encoder_weight=1.0)
        with bf16.autocast():
            mixed = diffusion_loss(model, batch, torch.Generator().manual_seed(0), self_conditioning=0.5,
                                   answer_encoder_weight=1.0)
    assert mixed.total.dtype == torch.float32  # the losses' softmax stays in fp32 under autocast
    assert mixed.total.item() == pytest.approx(plain.total.item(), rel=0.02)
    assert fp32.autocast().__class__.__name__ == "nullcontext"
    optimizer = bf16.optimizer(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    losses = []
    for step in range(25):
        with bf16.autocast():
            parts = diffusion_loss(model, batch, torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        parts.total.backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
        optimizer.step()
        losses.append(parts.total.item())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the weights stay fp32 (autocast casts copies)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_flops_count_the_layers_with_top_k_experts_and_the_head_once():
    model = build_tiny_model()
    text = model.config.text_config
    layers = model.model.encoder.language_model.layers
    experts = sum(p.numel() for name, p in layers.named_parameters() if ".experts." in name)
    others = sum(p.numel() for name, p in layers.named_parameters() if ".experts." not in name)
    head = text.vocab_size * text.hidden_size
    assert experts > 0 and text.top_k_experts < text.num_experts
    assert active_parameters(model) == int(others + experts * text.top_k_experts / text.num_experts) + head
    # The decoder's layers are the encoder's weights: counted once; the vision tower not at all.
    assert active_parameters(model) < sum(p.numel() for p in model.parameters())


def test_gpu_seconds_count_on_a_gpu_only_and_carry_on_from_earlier_sessions():
    clock = ManualClock()
    on_cpu = CostMeter(Accelerator.from_recipe({}), 1000, clock=clock)
    on_gpu = CostMeter(Accelerator.from_recipe({}, "cuda"), 1000, gpu_seconds=60.0, flops=5.0, clock=clock)
    clock.advance(30.0)
    on_cpu.add_tokens(10)
    on_gpu.add_tokens(10)
    assert on_cpu.counters() == {"gpuSeconds": 0.0, "flops": 6 * 1000 * 10}
    assert on_gpu.counters() == {"gpuSeconds": 90.0, "flops": 5.0 + 6 * 1000 * 10}


def test_a_time_budget_stops_before_a_step_that_would_end_past_it_and_ends_the_cosine_there():
    clock = ManualClock()
    deadline = Deadline(100.0, clock=clock)
    schedule = {"lr": 1.0, "warmup": 2}
    step, rates = 0, []
    while deadline.allows_step(step):
        rates.append(_learning_rate(schedule, step, deadline.lr_total(step, 10**6)))
        clock.advance(12.0 if step == 0 else 8.0)  # the first step compiles and warms up: it does not set the pace
        step += 1
        deadline.step_done(step)
    # 12 s, then 8 s a step: steps end at 12, 20, ..., 100; the 13th would end past the budget.
    assert step == 12 and deadline.ended and deadline.left() == 0
    # The cosine ended where the budget did: the rates of a 12-step schedule, not of the recipe's million steps.
    assert rates == [_learning_rate(schedule, k, 12) for k in range(12)]
    assert rates[-1] < 0.15 < 0.9 < rates[3]
    # Without a budget: the schedule's own length, and no end.
    unlimited = Deadline(None, clock=clock)
    assert unlimited.lr_total(5, 300) == 300 and unlimited.allows_step(10**9) and not unlimited.ended
