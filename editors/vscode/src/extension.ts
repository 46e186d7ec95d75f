/**
 * The DiffusionGemma extension: starts `dgemma-lsp --stdio` and wires it to VS Code.
 *
 * Inline completions, code actions ("Rewrite selection" in the lightbulb) and
 * the server's commands come through vscode-languageclient as plain LSP. This
 * file adds only what LSP does not carry: drafts while denoising, the status
 * bar, the palette command, settings pushes, next-edit suggestions (nextEdit.ts:
 * Copilot's `textDocument/copilotInlineEdit`, drawn with decorations) and the answer to the
 * server's `dgemma/definitions` request (definitions.ts: what the other language extensions
 * find for the names near the cursor). Model logic lives in the server.
 */
import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification, ExecuteCommandRequest, LanguageClient,
  LanguageClientOptions, ServerOptions, State,
} from 'vscode-languageclient/node';
import { DEFINITIONS_REQUEST, EditorDefinitionsCapability, answerDefinitions } from './definitions';
import { DraftParams, DraftRenderer } from './drafts';
import { NextEdits } from './nextEdit';
import { affectsServerLaunch, resolveServer, serverSettings } from './settings';
import { ServerStatus, StatusItem } from './status';

/** The server's executeCommand that computes and applies a rewrite: arguments [uri, range]. */
const SERVER_REWRITE_COMMAND = 'dgemma.rewriteSelection';

let client: LanguageClient | undefined;
let nextEdits: NextEdits | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const output = vscode.window.createOutputChannel('DiffusionGemma', { log: true });
  const status = new StatusItem('dgemma.showOutput');
  const drafts = new DraftRenderer();
  nextEdits = new NextEdits(() => client);
  context.subscriptions.push(
    output, status, drafts, nextEdits,
    vscode.commands.registerCommand('dgemma.showOutput', () => output.show(true)),
    vscode.commands.registerCommand('dgemma.restart', () => restart(output, status, drafts)),
    vscode.commands.registerCommand('dgemma.rewrite', () => rewriteSelection()),
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (affectsServerLaunch(event)) {
        void restart(output, status, drafts);
      } else if (event.affectsConfiguration('dgemma') && client?.state === State.Running) {
        void client.sendNotification(DidChangeConfigurationNotification.type, { settings: serverSettings() });
      }
    }),
  );
  await start(output, status, drafts);
}

export async function deactivate(): Promise<void> {
  await client?.stop();
  client = undefined;
}

async function start(output: vscode.LogOutputChannel, status: StatusItem, drafts: DraftRenderer): Promise<void> {
  const launch = resolveServer();
  if (!launch) {
    const configured = vscode.workspace.getConfiguration('dgemma').get<string>('server.path');
    status.stopped('dgemma-lsp not found');
    output.error(`cannot find the language server '${configured}' on PATH or in a workspace .venv/bin`);
    // Not awaited: activation must not wait for the user to dismiss the message.
    void vscode.window.showErrorMessage(
      `DiffusionGemma: cannot find the language server '${configured}'. Install dgemma-lsp ` +
      '(see the README, section "VS Code") or set "dgemma.server.path" to its full path.',
      'Open Settings',
    ).then((choice) => choice === 'Open Settings'
      && vscode.commands.executeCommand('workbench.action.openSettings', 'dgemma.server'));
    return;
  }
  output.info(`starting ${launch.command} ${launch.args.join(' ')}`);
  const serverOptions: ServerOptions = { command: launch.command, args: launch.args };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    initializationOptions: serverSettings(),
    outputChannel: output,
    middleware: {
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        const id = drafts.begin(document, position);
        const version = document.version;
        let answered = false;
        nextEdits?.completionStarted(document);
        try {
          const result = await next(document, position, context, token);
          answered = (Array.isArray(result) ? result.length : result?.items.length ?? 0) > 0;
          return result;
        } finally {
          drafts.end(document, id);
          nextEdits?.completionEnded(document, version, answered);
        }
      },
      handleWorkDoneProgress: (token, params, next) => {
        status.progress(
          params.kind === 'begin' ? params.title : undefined, params.kind === 'end' ? undefined : params.message,
          params.kind === 'end' ? undefined : params.percentage, params.kind === 'end',
        );
        next(token, params); // VS Code's own progress notification too
      },
    },
  };
  const started = new LanguageClient('dgemma', 'DiffusionGemma', serverOptions, clientOptions);
  client = started;
  const editorDefinitions = vscode.workspace.getConfiguration('dgemma').get<boolean>('editorDefinitions', true);
  started.registerFeature(new EditorDefinitionsCapability(editorDefinitions));
  started.onRequest(DEFINITIONS_REQUEST, (params) => answerDefinitions(started, params));
  client.onNotification('dgemma/draft', (params: DraftParams) => drafts.show(params));
  client.onNotification('dgemma/status', (params: ServerStatus) => status.update(params));
  // The drafts of a next edit are not drawn: the decorations show only the final edit.
  client.onNotification('dgemma/inlineEditDraft', () => undefined);
  client.onDidChangeState((event) => {
    if (event.newState === State.Stopped) status.stopped('the server stopped; see the output');
  });
  try {
    await client.start();
  } catch (error) {
    status.stopped('the server failed to start');
    output.error(`failed to start: ${String(error)}`);
  }
}

async function restart(output: vscode.LogOutputChannel, status: StatusItem, drafts: DraftRenderer): Promise<void> {
  const previous = client;
  client = undefined;
  nextEdits?.stop();
  await previous?.dispose();
  await start(output, status, drafts);
}

/** Palette / context-menu entry: asks the server to rewrite the selection; the server applies the edit. */
async function rewriteSelection(): Promise<void> {
  const editor = vscode.window.activeTextEditor;
  if (!editor || editor.selection.isEmpty) {
    void vscode.window.showInformationMessage('DiffusionGemma: select the code to rewrite first.');
    return;
  }
  if (!client || client.state !== State.Running) {
    void vscode.window.showErrorMessage('DiffusionGemma: the server is not running (see the output).');
    return;
  }
  const running = client;
  const args = [
    running.code2ProtocolConverter.asUri(editor.document.uri),
    running.code2ProtocolConverter.asRange(editor.selection),
  ];
  await vscode.window.withProgress(
    { location: vscode.ProgressLocation.Window, title: 'DiffusionGemma: rewriting' },
    async () => {
      try {
        await running.sendRequest(ExecuteCommandRequest.type, { command: SERVER_REWRITE_COMMAND, arguments: args });
      } catch (error) {
        void vscode.window.showErrorMessage(`DiffusionGemma: rewrite failed: ${String(error)}`);
      }
    },
  );
}
