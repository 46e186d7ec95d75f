"""Training a small DiffusionGemma that writes code (`dgemma-lsp train`): one room of engine/.

`corpus` finds permissively licensed code on this machine and writes its manifest,
`examples` cuts holes the way the syntax planner sees them and builds the product's own
prompts for them, `objective` is DiffusionGemma's uniform-state diffusion loss plus the
encoder's next-token loss, and `train` runs it: tokenizer, resumable checkpoints, export. On a GPU (issue 51)
`accelerator` is the device, precision, optimizer, compilation and cost, and `packing` cuts the examples ahead
in worker processes into `shards`, which the trainer reads.
Uses model/ and syntax/; nothing in the product imports it.
"""
