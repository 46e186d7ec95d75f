"""The session's lifecycle: initialize, initialized, workspace/didChangeConfiguration, shutdown.

Settings come once with initialize (initializationOptions) and again on a configuration change
(pushed, or pulled where the client has workspace/configuration); the engine starts loading at
`initialized`; `shutdown` stops the session's work (`DGemmaServer.close`).
"""

from __future__ import annotations

import asyncio

from lsprotocol import types as lsp

from .editor_definitions import client_supports
from .lsp_server import DGemmaServer
from .settings import SECTION


def register(server: DGemmaServer) -> None:
    server.feature(lsp.INITIALIZE)(initialize)
    server.feature(lsp.INITIALIZED)(initialized)
    server.feature(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION)(did_change_configuration)
    server.feature(lsp.SHUTDOWN)(shutdown)


def initialize(ls: DGemmaServer, params: lsp.InitializeParams) -> None:
    # Problems are shown after `initialized`: messages before the initialize answer are discouraged.
    ls.apply_settings(params.initialization_options, show_problems=False)
    folders = params.workspace_folders or []
    ls.crossfile.open_workspace(folders[0].uri if folders else params.root_uri)
    ls.editor_definitions.enabled = client_supports(params.capabilities.experimental)


async def initialized(ls: DGemmaServer, params: lsp.InitializedParams) -> None:
    ls.show_pending_problems()
    asyncio.ensure_future(ls.watch_workspace_files())
    await ls.start_engine()


async def did_change_configuration(ls: DGemmaServer, params: lsp.DidChangeConfigurationParams) -> None:
    raw = params.settings
    workspace = ls.client_capabilities.workspace
    if raw is None and workspace and workspace.configuration:  # the pull model
        (raw,) = await ls.workspace_configuration_async(
            lsp.ConfigurationParams(items=[lsp.ConfigurationItem(section=SECTION)])
        )
    ls.apply_settings(raw)


def shutdown(ls: DGemmaServer, params: None) -> None:
    ls.close()  # synchronous on purpose: `exit` may follow at once, and must find the shutdown done
