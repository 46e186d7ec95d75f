/**
 * Answers the server's `dgemma/definitions` request (docs/context.md): for each position it sends
 * (names used near the cursor), the definitions VS Code's definition providers find — the other
 * language extensions (TypeScript, Pylance, gopls, ...); dgemma-lsp provides none itself — each
 * with the text of its first `maxLines` lines, from the open document or else from disk (opening a
 * TextDocument would make it an open document of every language server).
 *
 * The extension advertises the request with `capabilities.experimental.dgemmaDefinitions`
 * (`dgemma.editorDefinitions: false` does not). Positions a provider has not answered within
 * TIMEOUT_MS are sent as null ("not known yet": the server asks again later). Knows the language
 * client's converters and VS Code's definition command; knows nothing of drafts or the status bar.
 */
import * as vscode from 'vscode';
import {
  ClientCapabilities, ErrorCodes, FeatureState, LanguageClient, ResponseError, StaticFeature,
} from 'vscode-languageclient/node';
import type { Position as LspPosition, Range as LspRange } from 'vscode-languageclient/node';

export const DEFINITIONS_REQUEST = 'dgemma/definitions';
const TIMEOUT_MS = 1500;
const MAX_LINES = 20;

interface DefinitionsParams {
  textDocument: { uri: string };
  positions: LspPosition[];
  maxLines?: number;
}

interface FoundDefinition { uri: string; range: LspRange; text: string }

/** Adds `experimental.dgemmaDefinitions: true` to the client capabilities when `enabled`. */
export class EditorDefinitionsCapability implements StaticFeature {
  constructor(private readonly enabled: boolean) {}

  fillClientCapabilities(capabilities: ClientCapabilities): void {
    if (!this.enabled) return;
    capabilities.experimental = { ...(capabilities.experimental as object ?? {}), dgemmaDefinitions: true };
  }

  initialize(): void { /* nothing: the request handler is registered with the client */ }

  getState(): FeatureState { return { kind: 'static' }; }

  clear(): void { /* nothing held */ }
}

function isPosition(value: unknown): value is LspPosition {
  const p = value as LspPosition;
  return typeof p === 'object' && p !== null && Number.isInteger(p.line) && Number.isInteger(p.character)
    && p.line >= 0 && p.character >= 0;
}

/** The handler of `dgemma/definitions`: one entry per position, a list of definitions or null. */
export async function answerDefinitions(
  client: LanguageClient, params: DefinitionsParams,
): Promise<(FoundDefinition[] | null)[] | ResponseError> {
  if (typeof params?.textDocument?.uri !== 'string' || !Array.isArray(params.positions)
    || !params.positions.every(isPosition)) {
    return new ResponseError(ErrorCodes.InvalidParams, 'expected {textDocument: {uri}, positions: Position[]}');
  }
  const uri = client.protocol2CodeConverter.asUri(params.textDocument.uri);
  const maxLines = Math.min(Math.max(Math.trunc(Number(params.maxLines) || 4), 1), MAX_LINES);
  const late = Symbol('late');
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<typeof late>((resolve) => { timer = setTimeout(() => resolve(late), TIMEOUT_MS); });
  const files = new Map<string, Promise<string[] | undefined>>();
  try {
    return await Promise.all(params.positions.map(async (position) => {
      const asked = Promise.resolve(vscode.commands.executeCommand<(vscode.Location | vscode.LocationLink)[]>(
        'vscode.executeDefinitionProvider', uri, client.protocol2CodeConverter.asPosition(position),
      )).catch((): typeof late => late);
      const found = await Promise.race([asked, deadline]);
      if (found === late) return null;
      const definitions: FoundDefinition[] = [];
      const seen = new Set<string>();
      for (const location of found ?? []) {
        const target = 'targetUri' in location ? location.targetUri : location.uri;
        // The name's line (a link's selection range): where the header is, past decorators and docs.
        const range = 'targetUri' in location ? location.targetSelectionRange ?? location.targetRange : location.range;
        const key = `${target.toString()}:${range.start.line}`;
        if (seen.has(key)) continue;
        seen.add(key);
        const lines = await linesOf(files, target);
        if (!lines) continue;
        definitions.push({
          uri: client.code2ProtocolConverter.asUri(target),
          range: { start: client.code2ProtocolConverter.asPosition(range.start),
            end: client.code2ProtocolConverter.asPosition(range.end) },
          text: lines.slice(range.start.line, range.start.line + maxLines).join('\n'),
        });
      }
      return definitions;
    }));
  } finally {
    clearTimeout(timer);
  }
}

/** The file's lines: from its open document when there is one, else from disk (read once per answer). */
function linesOf(files: Map<string, Promise<string[] | undefined>>, target: vscode.Uri): Promise<string[] | undefined> {
  const key = target.toString();
  let lines = files.get(key);
  if (!lines) {
    const open = vscode.workspace.textDocuments.find((document) => document.uri.toString() === key);
    lines = open
      ? Promise.resolve(open.getText().split(/\r?\n/))
      : Promise.resolve(vscode.workspace.fs.readFile(target)).then(
        (bytes) => new TextDecoder().decode(bytes).split(/\r?\n/), () => undefined);
    files.set(key, lines);
  }
  return lines;
}
