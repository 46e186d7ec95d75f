"""The training pipeline on a micro recipe: licences, holes, the objective, resumable runs, a loadable result."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dgemma_lsp.engine.model.tiny_model import build_tiny_model, build_tiny_tokenizer
from dgemma_lsp.engine.syntax.document import SyntaxDocument
from dgemma_lsp.engine.training.corpus import CodeFile, is_permissive
from dgemma_lsp.engine.training.examples import KINDS, ExampleMaker, choose_hole, end_of_turn_id
from dgemma_lsp.engine.training.objective import collate, diffusion_loss, softcapped_logits

SAMPLE = '''import os


def total(values, start=0):
    """Sum of values after start."""
    result = start
    for value in values:
        if value > 0:
            result += value
        else:
            result -= abs(value)
    return result


class Box:
    def __init__(self, items):
        self.items = list(items)
        self.size = len(self.items)

    def first(self):
        return self.items[0] if self.items else None
'''


@pytest.mark.parametrize(("licence", "allowed"), [
    ("MIT", True), ("Apache-2.0 OR BSD-2-Clause", True), ("BSD-3-Clause AND 0BSD AND MIT AND Zlib", True),
    ("Apache 2.0", True), ("MPL-2.0 AND MIT", False), ("GPL-3.0-or-later", False), ("LGPL-2.1 OR GPL-2.0", False),
    (None, False), ("", False), ("Proprietary", False),
])
def test_only_permissive_licences_are_trained_on(licence, allowed):
    assert is_permissive(licence) is allowed


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_holes_of_every_kind_cut_real_code(tokenizer):
    doc = SyntaxDocument(SAMPLE, "python")
    found = {}
    for seed in range(200):
        for kind in KINDS:
            hole = choose_hole(doc, kind, random.Random(seed))
            if hole is not None:
                found.setdefault(kind, set()).add(SAMPLE[hole.start:hole.end])
    assert set(found) == set(KINDS)
    assert "return result" in found["statement"] or "result = start" in found["statement"]
    # A block hole is a whole body: every statement of it, from the first to the last.
    assert any(body.startswith("if value > 0:") and body.endswith("result -= abs(value)") for body in found["block"])
    assert all("\n" not in middle for middle in found["line"] | found["expression"])
    # A "lines" hole runs from inside a line across at least one more.
    assert all("\n" in middle for middle in found["lines"])


def test_an_example_is_the_products_prompt_and_a_finished_canvas(tokenizer):
    maker = ExampleMaker(tokenizer, 32, max_prompt_tokens=512, context_tokens=(64, 256))
    file = CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)
    examples = [e for seed in range(40) if (e := maker.make(file, random.Random(seed)))]
    assert len(examples) >= 30
    end = end_of_turn_id(tokenizer)
    assert tokenizer.convert_ids_to_tokens(end) == "<turn|>"
    for example in examples:
        assert len(example.canvas_ids) == 32
        middle_ids = tokenizer(example.middle, add_special_tokens=False)["input_ids"]
        assert example.canvas_ids[: len(middle_ids) + 1] == middle_ids + [end]
        assert set(example.canvas_ids[len(middle_ids) + 1:]) <= {tokenizer.pad_token_id}
        prompt = tokenizer.decode(example.prompt_ids)
        assert "<CURSOR>" in prompt and prompt.startswith("<bos><|turn>user")
    # Deterministic by seed.
    again = [e for seed in range(40) if (e := maker.make(file, random.Random(seed)))]
    assert [e.prompt_ids for e in again] == [e.prompt_ids for e in examples]


def test_a_span_hole_fills_the_canvas_with_answer(tokenizer):
    maker = ExampleMaker(tokenizer, 16, max_prompt_tokens=512, context_tokens=(64, 256), kind_weights={"span": 1.0})
    file = CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)
    examples = [e for seed in range(20) if (e := maker.make(file, random.Random(seed)))]
    assert len(examples) >= 15
    end = end_of_turn_id(tokenizer)
    for example in examples:
        assert example.kind == "span" and example.middle in SAMPLE
        answer = example.canvas_ids[: example.canvas_ids.index(end)]
        assert tokenizer.decode(answer) == example.middle
        # Every position is answer (then its end), unless the file ended first.
        assert len(answer) == 15 or SAMPLE.endswith(example.middle)
    assert sum(len(e.middle) for e in examples) / len(examples) > 30


def test_a_left_padded_batch_denoises_each_row_as_if_alone(tokenizer):
    from transformers import DynamicCache

    model = build_tiny_model().eval()
    maker = ExampleMaker(tokenizer, 32, max_prompt_tokens=400, context_tokens=(32, 160))
    file = CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)
    rows = [e for seed in range(30) if (e := maker.make(file, random.Random(seed)))][:3]
    assert len({len(e.prompt_ids) for e in rows}) > 1, "the batch must need padding"

    def canvas_logits(batch):
        positions = (batch.prompt_mask.cumsum(-1) - 1).clamp(min=0)
        encoded = model.model.encoder(input_ids=batch.prompt_ids, attention_mask=batch.prompt_mask,
                                      position_ids=positions, use_cache=True,
                                      past_key_values=DynamicCache(config=model.config.text_config))
        decoded = model.model.decoder(
            decoder_input_ids=batch.canvas_ids, past_key_values=encoded.past_key_values,
            decoder_attention_mask=torch.cat([batch.prompt_mask, torch.ones_like(batch.canvas_ids)], -1),
            decoder_position_ids=batch.prompt_mask.sum(-1, keepdim=True) + torch.arange(32))
        return softcapped_logits(model, decoded.last_hidden_state)

    with torch.no_grad():
        together = canvas_logits(collate([e.prompt_ids for e in rows], [e.canvas_ids for e in rows], 0))
        for row, example in enumerate(rows):
            alone = model(input_ids=torch.tensor([example.prompt_ids]),
                          decoder_input_ids=torch.tensor([example.canvas_ids])).logits  # generate's own path
            assert torch.allclose(together[row], alone[0], atol=1e-4)


def test_the_encoders_prompt_loss_counts_each_rows_real_tokens_as_if_alone(tokenizer):
    """The LM head runs on the real positions of a left-padded batch only; the loss is the plain
    next-token loss of every row's prompt read alone, every prompt token counted once."""
    model = build_tiny_model().eval()
    with torch.no_grad():  # random weights predict every token at ~log(vocab): spread the logits apart
        model.lm_head.weight.mul_(30)
    maker = ExampleMaker(tokenizer, 32, max_prompt_tokens=400, context_tokens=(32, 160))
    file = CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)
    rows = [e for seed in range(30) if (e := maker.make(file, random.Random(seed)))][:3]
    assert len({len(e.prompt_ids) for e in rows}) > 1, "the batch must need padding"
    batch = collate([e.prompt_ids for e in rows], [e.canvas_ids for e in rows], 0)
    with torch.no_grad():
        parts = diffusion_loss(model, batch, torch.Generator().manual_seed(0), self_conditioning=0.0)
        total = 0.0
        for example in rows:
            ids = torch.tensor([example.prompt_ids])
            logits = softcapped_logits(model, model.model.encoder(input_ids=ids).last_hidden_state[:, :-1])
            total += torch.nn.functional.cross_entropy(logits[0], ids[0, 1:], reduction="sum").item()
    assert parts.encoder == pytest.approx(total / sum(len(e.prompt_ids) - 1 for e in rows), abs=1e-4)


def test_the_objective_learns_a_batch(tokenizer):
    model = build_tiny_model().train()
    maker = ExampleMaker(tokenizer, 32, max_prompt_tokens=200, context_tokens=(16, 64))
    file = CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)
    rows = [e for seed in range(20) if (e := maker.make(file, random.Random(seed)))][:4]
    batch = collate([e.prompt_ids for e in rows], [e.canvas_ids for e in rows], 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(25):
        parts = diffusion_loss(model, batch, torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        parts.total.backward()
        optimizer.step()
        losses.append(parts.total.item())
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_the_encoders_answer_loss_is_one_causal_pass_and_leaves_the_decoder_the_prompt(tokenizer):
    """With answer_encoder_weight the encoder also reads the answer (a second pass from a copy of the
    prompt's cache): its loss is the plain next-token loss of prompt + answer read at once, and the
    decoder's loss, which must see the prompt alone, is what it was without it."""
    model = build_tiny_model().eval()
    maker = ExampleMaker(tokenizer, 32, max_prompt_tokens=400, context_tokens=(32, 160))
    file = CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)
    rows = [e for seed in range(30) if (e := maker.make(file, random.Random(seed)))][:3]
    end = end_of_turn_id(tokenizer)
    batch = collate([e.prompt_ids for e in rows], [e.canvas_ids for e in rows], 0, end)
    with torch.no_grad():
        plain = diffusion_loss(model, batch, torch.Generator().manual_seed(3), self_conditioning=0.0)
        both = diffusion_loss(model, batch, torch.Generator().manual_seed(3), self_conditioning=0.0,
                              answer_encoder_weight=0.5)
        assert both.diffusion == pytest.approx(plain.diffusion, abs=1e-5)
        assert both.total.item() == pytest.approx(plain.total.item() + 0.5 * both.answer_encoder, abs=1e-4)
        # The same loss, from one causal pass per row over its prompt and answer (the model's own forward).
        losses = []
        for example in rows:
            answer = example.canvas_ids[: example.canvas_ids.index(end) + 1]
            ids = torch.tensor([example.prompt_ids + answer])
            hidden = model.model.encoder(input_ids=ids).last_hidden_state
            logits = softcapped_logits(model, hidden[:, len(example.prompt_ids) - 1:-1])
            losses.append(torch.nn.functional.cross_entropy(logits[0], torch.tensor(answer), reduction="sum"))
        tokens = sum(e.canvas_ids.index(end) + 1 for e in rows)
        assert both.answer_encoder == pytest.approx((sum(losses) / tokens).item(), abs=1e-3)


def _train(run_dir: Path, recipe: Path | None, steps: int) -> None:
    config = ["--config", str(recipe)] if recipe else []
    subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "train", str(run_dir), *config,
                    "--steps", str(steps), "--quiet", "--threads", "1"], check=True, timeout=300)


@pytest.mark.timeout(1500)  # four subprocesses of up to 300 s each
def test_a_run_resumes_where_it_stopped_and_its_model_loads(tmp_path, micro_recipe):
    _train(tmp_path / "straight", micro_recipe, 3)
    _train(tmp_path / "resumed", micro_recipe, 2)
    assert json.loads((tmp_path / "resumed" / "recipe.json").read_text())["train"]["steps"] == 2  # a resume keeps it
    _train(tmp_path / "resumed", None, 3)  # no --config: the run's own recipe (the default one has another shape)
    straight = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=False)
    resumed = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=False)
    assert straight["step"] == resumed["step"] == 3
    # Cost is kept across sessions: CPU-seconds and answer tokens only grow, one log line per checkpoint.
    assert resumed["cpuSeconds"] > 0 and resumed["answerTokens"] == straight["answerTokens"] > 0
    lines = [json.loads(line) for line in (tmp_path / "resumed" / "log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert lines[-1]["cpuSeconds"] >= lines[0]["cpuSeconds"] and "answerAccuracy" in lines[-1]
    # The weights each finished schedule ends with are a snapshot too, so the curve ends where the run did.
    for run, checkpoint in (("straight", straight), ("resumed", resumed)):
        last = torch.load(sorted((tmp_path / run / "snapshots").iterdir())[-1], weights_only=False)
        assert last["step"] == 3 and last["cpuSeconds"] == pytest.approx(checkpoint["cpuSeconds"], abs=5)
        assert all(torch.equal(value, checkpoint["model"][name].to(value.dtype)) for name, value in last["model"].items())
    # AdamW's moments are kept in bf16 (the checkpoint is committed to git): the resumed run's weights
    # differ from the unbroken run's by that rounding only, far below one step's update (lr 3e-3).
    moments = [v for state in resumed["optimizer"]["state"].values() for k, v in state.items() if k != "step"]
    assert moments and all(v.dtype == torch.bfloat16 for v in moments)
    for name, value in straight["model"].items():
        assert value.dtype == torch.float32 and torch.allclose(value, resumed["model"][name], rtol=0, atol=1e-4), name

    manifest = json.loads((tmp_path / "straight" / "model" / "corpus.json").read_text())
    assert manifest["tokens"] > 0 and all(is_permissive(s["licence"]) for s in manifest["sources"])
    assert sum(s["tokens"] for s in manifest["sources"]) == manifest["tokens"]
    assert all(not is_permissive(s["licence"]) or s["licence"] == "unknown" for s in manifest["leftOut"])

    # The exported folder is a checkpoint like any other: the CLI completes with it.
    done = subprocess.run(
        [sys.executable, "-m", "dgemma_lsp.server.cli", "complete", "examples/fib.py:8:12", "--model",
         str(tmp_path / "straight" / "model"), "--steps", "2", "--json"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"] == 2


def test_a_recipe_can_mix_in_the_suffix_first_layout(tokenizer):
    file = CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)
    natural = ExampleMaker(tokenizer, 32, max_prompt_tokens=512, context_tokens=(64, 256))
    mixed = ExampleMaker(tokenizer, 32, max_prompt_tokens=512, context_tokens=(64, 256), suffix_first_share=0.5)
    suffix_first = [e for seed in range(40) if (e := mixed.make(file, random.Random(seed)))
                    and "The code after the line with <CURSOR>" in tokenizer.decode(e.prompt_ids)]
    assert 5 <= len(suffix_first) <= 35  # about half, where the hole has code after its line
    assert not [e for seed in range(40) if (e := natural.make(file, random.Random(seed)))
                and "The code after the line" in tokenizer.decode(e.prompt_ids)]


def test_a_forced_layout_cuts_the_same_holes_as_the_natural_one(tokenizer):
    """Validation compares the layouts on the same holes: forcing one draws nothing from the hole's RNG."""
    file = CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)
    natural = ExampleMaker(tokenizer, 32, max_prompt_tokens=512, context_tokens=(64, 256))
    forced = ExampleMaker(tokenizer, 32, max_prompt_tokens=512, context_tokens=(64, 256), layout="suffix-first")
    pairs = [(natural.make(file, random.Random(seed)), forced.make(file, random.Random(seed))) for seed in range(40)]
    pairs = [(a, b) for a, b in pairs if a is not None]
    assert len(pairs) >= 30 and all(b is not None and (a.middle, a.canvas_ids) == (b.middle, b.canvas_ids)
                                    for a, b in pairs)
    laid_out = [tokenizer.decode(b.prompt_ids) for _, b in pairs]
    assert sum("The code after the line with <CURSOR>" in text for text in laid_out) >= 5
    assert sum(a.prompt_ids != b.prompt_ids for a, b in pairs) >= 5
