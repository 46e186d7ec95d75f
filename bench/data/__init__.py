"""HumanEval-Infilling (OpenAI, MIT licence: LICENSE here), shipped so the benchmark needs no outside folder."""
