"""dgemma_lsp.bench: benchmarks (`make bench`, `dgemma-lsp bench ...`). Figures, never tests."""
