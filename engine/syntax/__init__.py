"""The torch-free syntax pipeline, run in the language server's process.

`languages` maps documents to tree-sitter grammars, `document` keeps text and
tree in step edit by edit, `planning` decides the hole at the cursor, `context`
cuts the prompt's text window, `postprocess` turns a raw middle into the text
to insert, `validation` checks and ranks candidates, and `infill` glues them:
prepare before the denoiser, finish after it. Offsets are Python str indices.
"""
