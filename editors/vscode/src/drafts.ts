/**
 * Shows the server's drafts (`dgemma/draft`) as ghost text while it denoises.
 *
 * VS Code's inline-suggestion API takes one final answer per request, so drafts
 * are drawn as an `after` decoration at the cursor in the ghost-text colour,
 * and cleared the moment the request ends (the real inline suggestion then takes
 * their place). A draft is drawn only while a request for exactly its document
 * version and position is in flight, so a late draft never outlives its answer.
 * Multi-line drafts are drawn on one line, their line breaks shown as `⏎`: a
 * decoration cannot open lines. Knows nothing of the language client.
 */
import * as vscode from 'vscode';

/** The `dgemma/draft` notification's params (LSP positions, the document's URI string). */
export interface DraftParams {
  uri: string;
  version: number;
  position: { line: number; character: number };
  requestId?: string | number;
  step: number;
  text: string;
}

const MAX_DRAFT_CHARS = 160;

export class DraftRenderer implements vscode.Disposable {
  private readonly decoration = vscode.window.createTextEditorDecorationType({
    after: {
      color: new vscode.ThemeColor('editorGhostText.foreground'),
      fontStyle: 'italic',
    },
    rangeBehavior: vscode.DecorationRangeBehavior.ClosedClosed,
  });
  /** "uri version:line:character" -> inline-completion requests in flight there (VS Code may overlap them). */
  private readonly inFlight = new Map<string, number>();
  private readonly drawnIn = new Set<vscode.TextEditor>();
  private readonly subscriptions: vscode.Disposable[];

  constructor() {
    this.subscriptions = [
      vscode.workspace.onDidChangeTextDocument((event) => this.clear(event.document.uri.toString())),
      vscode.window.onDidChangeActiveTextEditor(() => this.clearAll()),
    ];
  }

  /** An inline-completion request starts: its drafts may be drawn. */
  begin(document: vscode.TextDocument, position: vscode.Position): string {
    const id = key(document.uri.toString(), document.version, position.line, position.character);
    this.inFlight.set(id, (this.inFlight.get(id) ?? 0) + 1);
    return id;
  }

  /** The request `begin` returned `id` for ended (answered, cancelled or failed): its drafts go away. */
  end(document: vscode.TextDocument, id: string): void {
    const left = (this.inFlight.get(id) ?? 1) - 1;
    if (left > 0) {
      this.inFlight.set(id, left);
      return;
    }
    this.inFlight.delete(id);
    this.clear(document.uri.toString());
  }

  show(draft: DraftParams): void {
    const { line, character } = draft.position;
    if (!this.inFlight.has(key(draft.uri, draft.version, line, character))) return;
    const editor = vscode.window.visibleTextEditors.find(
      (e) => e.document.uri.toString() === draft.uri && e.document.version === draft.version,
    );
    if (!editor) return;
    const text = oneLine(draft.text);
    const at = new vscode.Position(line, character);
    editor.setDecorations(this.decoration, text ? [{
      range: new vscode.Range(at, at),
      renderOptions: { after: { contentText: text } },
      hoverMessage: `DiffusionGemma draft, step ${draft.step}`,
    }] : []);
    this.drawnIn.add(editor);
  }

  private clear(uri: string): void {
    for (const editor of [...this.drawnIn]) {
      if (editor.document.uri.toString() !== uri) continue;
      editor.setDecorations(this.decoration, []);
      this.drawnIn.delete(editor);
    }
  }

  private clearAll(): void {
    for (const editor of this.drawnIn) editor.setDecorations(this.decoration, []);
    this.drawnIn.clear();
  }

  dispose(): void {
    this.clearAll();
    this.decoration.dispose();
    for (const s of this.subscriptions) s.dispose();
  }
}

function key(uri: string, version: number, line: number, character: number): string {
  return `${uri} ${version}:${line}:${character}`;
}

/** Line breaks become ⏎ and spaces stay visible (an `after` decoration collapses nothing, but trims nothing either). */
export function oneLine(text: string): string {
  const flat = text.replace(/\r?\n/g, ' ⏎ ').replace(/\t/g, '  ');
  return flat.length > MAX_DRAFT_CHARS ? `${flat.slice(0, MAX_DRAFT_CHARS)}…` : flat;
}
