"""Context beyond the file: what the code at the cursor uses, from the rest of the workspace.

Torch-free and LSP-free (it runs in the language server's process, like engine/syntax):
files.py walks the workspace within bounds, outline.py reads each file's top-level
definitions and imports with tree-sitter, index.py keeps them and resolves imports to
workspace files (resolve.py), neighbours.py keeps open documents' similar windows and the
recently edited or viewed ranges, windows.py finds the windows of linked files most like the
lines before the cursor (whose names rank up), editor.py places the editor's own definitions,
and gather.py picks the snippets one prompt shows.
"""
