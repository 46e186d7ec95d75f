/**
 * Next-edit suggestions in VS Code, with the stable API only (the proposed inline-edit API is
 * closed to published extensions).
 *
 * Owns when to ask the server for a next edit (`textDocument/copilotInlineEdit`, docs/next-edit.md),
 * how the one edit it gets is drawn, and what the keys do with it:
 * - asks once the active document has been left alone for PAUSE_MS after a change (typing, an
 *   accepted completion, an accepted edit) and no inline completion is being computed for it;
 *   never while ghost text may show: an inline completion answered for the document's current
 *   version means no request and no edit drawn (the server applies the same rule), until Escape
 *   dismisses that ghost text (`dgemma.nextEdit.hideCompletion` hides it and tells the server,
 *   `dgemma/didHideCompletion`: the stable API tells an extension nothing of a dismissal);
 * - draws the edit with decorations: the text it removes struck through on the removed-text
 *   background, the text it adds as an `after` decoration at the end of that range (line breaks
 *   drawn as ⏎: a decoration cannot open lines), and tells the server it was shown;
 * - while one is shown the context key `dgemma.nextEditVisible` is true: `dgemma.nextEdit.accept`
 *   (Tab) moves the cursor to the edit, and pressed there applies it with a WorkspaceEdit, then
 *   runs the edit's command (the server hears it was accepted); `dgemma.nextEdit.dismiss` (Escape)
 *   drops it and sends `dgemma/didRejectInlineEdit` (the server never offers it again);
 * - any change of the document, another active editor, or a newer version drops it unsaid.
 * Knows the language client only as a getter for the running one; knows nothing of settings
 * beyond `dgemma.nextEdit`.
 */
import * as vscode from 'vscode';
import { ExecuteCommandRequest, LanguageClient, State } from 'vscode-languageclient/node';
import { oneLine } from './drafts';

const REQUEST = 'textDocument/copilotInlineEdit';
const DID_SHOW = 'textDocument/didShowInlineEdit';
const DID_REJECT = 'dgemma/didRejectInlineEdit';
const DID_HIDE_COMPLETION = 'dgemma/didHideCompletion';
const CONTEXT_KEY = 'dgemma.nextEditVisible';
/** The client's pause after the last change; the server adds its own adaptive debounce (nextEditDebounceMs). */
const PAUSE_MS = 300;
const HOVER = 'DiffusionGemma next edit: Tab goes to it, Tab again applies it, Escape dismisses it';

interface WireCommand { title: string; command: string; arguments?: unknown[] }
interface WirePosition { line: number; character: number }
/** One edit of the answer: replace `range` by `text` in that version of the document. */
interface WireEdit {
  text: string;
  textDocument: { uri: string; version: number };
  range: { start: WirePosition; end: WirePosition };
  command?: WireCommand;
}

interface Shown { editor: vscode.TextEditor; version: number; range: vscode.Range; text: string; command?: WireCommand }

export class NextEdits implements vscode.Disposable {
  private readonly removed = vscode.window.createTextEditorDecorationType({
    textDecoration: 'line-through',
    backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
    rangeBehavior: vscode.DecorationRangeBehavior.ClosedClosed,
  });
  private readonly inserted = vscode.window.createTextEditorDecorationType({
    after: { backgroundColor: new vscode.ThemeColor('diffEditor.insertedTextBackground') },
    rangeBehavior: vscode.DecorationRangeBehavior.ClosedClosed,
  });
  private shown: Shown | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private asking: vscode.CancellationTokenSource | undefined;
  /** uri -> inline-completion requests in flight there. */
  private readonly completing = new Map<string, number>();
  /** uri -> the version whose inline completion came back non-empty: ghost text may be showing. */
  private readonly completionAnswered = new Map<string, number>();
  /** Documents whose pause ended while a completion was being computed: ask when it ends empty. */
  private readonly waiting = new Set<string>();
  private readonly subscriptions: vscode.Disposable[];

  constructor(private readonly client: () => LanguageClient | undefined) {
    this.subscriptions = [
      vscode.commands.registerCommand('dgemma.nextEdit.accept', () => this.accept()),
      vscode.commands.registerCommand('dgemma.nextEdit.dismiss', () => this.dismiss()),
      vscode.commands.registerCommand('dgemma.nextEdit.hideCompletion', () => this.hideCompletion()),
      vscode.workspace.onDidChangeTextDocument((event) => {
        if (event.contentChanges.length === 0) return;
        if (this.shown?.editor.document === event.document) this.drop();
        if (vscode.window.activeTextEditor?.document === event.document) this.schedule();
      }),
      vscode.window.onDidChangeActiveTextEditor(() => this.stop()),
      vscode.workspace.onDidCloseTextDocument((document) => {
        const uri = document.uri.toString();
        this.completionAnswered.delete(uri);
        this.completing.delete(uri);
        this.waiting.delete(uri);
      }),
      vscode.workspace.onDidChangeConfiguration((event) => {
        if (event.affectsConfiguration('dgemma.nextEdit') && !enabled()) this.stop();
      }),
    ];
  }

  /** An inline-completion request for `document` starts (the extension's middleware). */
  completionStarted(document: vscode.TextDocument): void {
    const uri = document.uri.toString();
    this.completing.set(uri, (this.completing.get(uri) ?? 0) + 1);
  }

  /** That request ended; `answered`: it brought at least one item, for `version`. */
  completionEnded(document: vscode.TextDocument, version: number, answered: boolean): void {
    const uri = document.uri.toString();
    const left = (this.completing.get(uri) ?? 1) - 1;
    if (left > 0) this.completing.set(uri, left);
    else this.completing.delete(uri);
    if (answered && version === document.version) {
      this.completionAnswered.set(uri, version);
      if (this.shown?.editor.document === document) this.drop(); // never beside ghost text
      this.waiting.delete(uri);
    } else if (left <= 0 && this.waiting.delete(uri)) {
      void this.ask();
    }
  }

  /** Waits PAUSE_MS from now, then asks for the active editor (a newer change starts over). */
  private schedule(): void {
    this.cancel();
    if (!enabled()) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      const uri = vscode.window.activeTextEditor?.document.uri.toString();
      if (uri && (this.completing.get(uri) ?? 0) > 0) this.waiting.add(uri);
      else void this.ask();
    }, PAUSE_MS);
  }

  private async ask(): Promise<void> {
    const editor = vscode.window.activeTextEditor;
    const client = this.client();
    if (!editor || !client || client.state !== State.Running || !enabled()) return;
    const document = editor.document;
    const version = document.version;
    if (this.completionAnswered.get(document.uri.toString()) === version) return;
    this.cancel();
    const asking = this.asking = new vscode.CancellationTokenSource();
    const params = {
      textDocument: { uri: client.code2ProtocolConverter.asUri(document.uri), version },
      position: client.code2ProtocolConverter.asPosition(editor.selection.active),
    };
    let edit: WireEdit | undefined;
    let cancelled = false;
    try {
      const answer = await client.sendRequest<{ edits?: WireEdit[] } | null>(REQUEST, params, asking.token);
      edit = answer?.edits?.[0];
    } catch (error) {
      if (!asking.token.isCancellationRequested) client.warn(`next edit failed: ${String(error)}`, undefined, false);
      return;
    } finally {
      cancelled = asking.token.isCancellationRequested;
      if (this.asking === asking) this.asking = undefined;
      asking.dispose();
    }
    if (!edit || cancelled || vscode.window.activeTextEditor !== editor
        || document.version !== version || edit.textDocument?.version !== version
        || this.completionAnswered.get(document.uri.toString()) === version) {
      return; // nothing, or for a text or an editor that is gone
    }
    const range = client.protocol2CodeConverter.asRange(edit.range);
    if (!document.validateRange(range).isEqual(range)) return;
    this.show({ editor, version, range, text: edit.text ?? '', command: edit.command });
  }

  private show(shown: Shown): void {
    this.shown = shown;
    const { editor, range, text } = shown;
    editor.setDecorations(this.removed, range.isEmpty ? [] : [{ range, hoverMessage: HOVER }]);
    editor.setDecorations(this.inserted, text ? [{
      range: new vscode.Range(range.end, range.end),
      renderOptions: { after: { contentText: oneLine(text) } },
      hoverMessage: HOVER,
    }] : []);
    void vscode.commands.executeCommand('setContext', CONTEXT_KEY, true);
    void this.client()?.sendNotification(DID_SHOW, { item: { command: shown.command } });
  }

  /** Tab: go to the edit; at the edit, apply it. */
  private async accept(): Promise<void> {
    const shown = this.shown;
    const editor = vscode.window.activeTextEditor;
    if (!shown || editor !== shown.editor || editor.document.version !== shown.version) {
      this.drop();
      return;
    }
    const start = shown.range.start;
    if (!editor.selection.isEmpty || !editor.selection.active.isEqual(start)) {
      editor.selection = new vscode.Selection(start, start);
      editor.revealRange(shown.range, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
      return;
    }
    this.drop();
    const edit = new vscode.WorkspaceEdit();
    edit.replace(editor.document.uri, shown.range, shown.text);
    // The change itself schedules the next request: after an accepted edit, the one that follows.
    if (!await vscode.workspace.applyEdit(edit) || !shown.command) return;
    const client = this.client();
    const { command, arguments: args } = shown.command;
    await client?.sendRequest(ExecuteCommandRequest.type, { command, arguments: args })
      .catch((error) => client.warn(`accepting the next edit: ${String(error)}`, undefined, false));
  }

  /** Escape: the user does not want this edit; the server remembers it. */
  private dismiss(): void {
    const shown = this.shown;
    this.drop();
    if (shown?.command) void this.client()?.sendNotification(DID_REJECT, { item: { command: shown.command } });
  }

  /** Escape over ghost text: hide it as VS Code would, and say so, so that a next edit may come. */
  private async hideCompletion(): Promise<void> {
    await vscode.commands.executeCommand('editor.action.inlineSuggest.hide');
    const document = vscode.window.activeTextEditor?.document;
    const uri = document?.uri.toString();
    if (!document || !uri || this.completionAnswered.get(uri) !== document.version) return;
    this.completionAnswered.delete(uri);
    const client = this.client();
    if (client?.state !== State.Running) return;
    void client.sendNotification(DID_HIDE_COMPLETION, {
      textDocument: { uri: client.code2ProtocolConverter.asUri(document.uri), version: document.version },
    });
    this.schedule();
  }

  /** Takes the shown edit away without a word to the server (it was computed for another text). */
  private drop(): void {
    const shown = this.shown;
    if (!shown) return;
    this.shown = undefined;
    shown.editor.setDecorations(this.removed, []);
    shown.editor.setDecorations(this.inserted, []);
    void vscode.commands.executeCommand('setContext', CONTEXT_KEY, false);
  }

  private cancel(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    this.waiting.clear();
    this.asking?.cancel();
  }

  /** Nothing pending, nothing shown (another editor, the server restarts, the feature turned off). */
  stop(): void {
    this.cancel();
    this.drop();
  }

  dispose(): void {
    this.stop();
    this.removed.dispose();
    this.inserted.dispose();
    for (const s of this.subscriptions) s.dispose();
  }
}

function enabled(): boolean {
  return vscode.workspace.getConfiguration('dgemma').get<boolean>('nextEdit', true);
}
