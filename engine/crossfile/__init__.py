"""Context beyond the file: what the code at the cursor uses, from the rest of the workspace.

Torch-free and LSP-free (it runs in the language server's process, like engine/syntax):
files.py walks the workspace within bounds, outline.py reads each file's top-level
definitions and imports with tree-sitter, index.py keeps them and resolves imports to
workspace files (resolve.py), neighbours.py keeps open documents' similar windows and the
recently edited or viewed ranges, and gather.py picks the snippets one prompt shows.
"""
