"""The model runtime: everything that imports torch or transformers.

`loading` finds and loads a checkpoint (`tiny_model` builds the test model;
`text_model` leaves the vision tower out; `memory_plan` checks it fits first;
`streaming` reads it shard by shard), `quantization` + `quant_formats` keep
weights packed, `prompting` turns an
InfillContext into token ids, `prompt_cache` keeps the stable prompt's encoder
KV per document, `denoising` runs DiffusionGemma's generate, and `service`
owns one loaded model for a process. Imported lazily: a language server that
talks to a daemon never loads torch.
"""
