"""A team's vLLM serving the model under its own name (`--served-model-name`).

The served name has no tokenizer files here; the server's `GET /v1/models` card
names the checkpoint as `root`, and the client finds the chat template from that.
When neither has files here, the status says so and names `--tokenizer`; with
`--tokenizer` the template comes from there. Against the real HTTP server of the
API subset (completions_server.py), answering with the tiny model.
"""

from __future__ import annotations

import pytest
from completions_server import CompletionsServer
from test_vllm_client import request, started

from dgemma_lsp.engine.client import EngineUnavailableError
from dgemma_lsp.engine.model.prompting import PromptBuilder
from dgemma_lsp.engine.model.tiny_model import tiny_random_dir

ALIAS = "team-coder"


async def test_a_served_name_finds_its_template_through_the_root_the_server_lists(server: CompletionsServer):
    server.model, server.root = ALIAS, str(tiny_random_dir())
    watched = await started(server, model=ALIAS)
    try:
        await watched.reaches("ready", "error")
        assert watched.client.status().state == "ready", watched.client.status().message
        result = await watched.denoise(request())
        assert len(result.candidates) == 1
        body = server.counters.bodies[-1]
        assert body["model"] == ALIAS  # the served name goes to the server ...
        builder = PromptBuilder(server.runtime.tokenizer)
        assert body["prompt"] == builder.layout.text(request().context).all  # ... the root's template lays it out
    finally:
        await watched.client.close()


async def test_no_files_for_the_name_nor_its_root_is_an_error_naming_the_tokenizer_option(server: CompletionsServer):
    server.model, server.root = ALIAS, "acme/checkpoint-not-on-this-machine"
    watched = await started(server, model=ALIAS)
    try:
        await watched.reaches("error")
        message = watched.client.status().message
        assert "--tokenizer" in message and ALIAS in message and "acme/checkpoint-not-on-this-machine" in message
        with pytest.raises(EngineUnavailableError):
            await watched.denoise(request())
    finally:
        await watched.client.close()


async def test_a_card_whose_root_is_the_name_itself_is_an_error_naming_the_tokenizer_option(server: CompletionsServer):
    server.model = ALIAS  # root defaults to the served name, as vLLM lists a model served under its own name
    watched = await started(server, model=ALIAS)
    try:
        await watched.reaches("error")
        assert "--tokenizer" in watched.client.status().message
    finally:
        await watched.client.close()


async def test_the_tokenizer_option_points_at_the_template(server: CompletionsServer):
    server.model = ALIAS
    watched = await started(server, model=ALIAS, tokenizer=str(tiny_random_dir()))
    try:
        await watched.reaches("ready", "error")
        assert watched.client.status().state == "ready", watched.client.status().message
        assert len((await watched.denoise(request())).candidates) == 1
    finally:
        await watched.client.close()
