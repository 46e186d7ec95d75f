/**
 * The status bar item: what the server says about itself.
 *
 * Fed by `dgemma/status` notifications ({state, model, device, message,
 * lastLatencyMs}) and by `$/progress` reports while the model loads. A click
 * shows the output channel. Knows nothing of documents or completions.
 */
import * as vscode from 'vscode';

export interface ServerStatus {
  state: 'loading' | 'ready' | 'busy' | 'error';
  model?: string;
  device?: string;
  message?: string;
  lastLatencyMs?: number;
}

const ICONS: Record<ServerStatus['state'] | 'starting' | 'stopped', string> = {
  starting: '$(loading~spin)',
  loading: '$(loading~spin)',
  ready: '$(sparkle)',
  busy: '$(sync~spin)',
  error: '$(error)',
  stopped: '$(circle-slash)',
};

export class StatusItem implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem('dgemma.status', vscode.StatusBarAlignment.Right, 100);
  private last: ServerStatus | undefined;

  constructor(showOutputCommand: string) {
    this.item.name = 'DiffusionGemma';
    this.item.command = showOutputCommand;
    this.show('starting', 'starting the server');
    this.item.show();
  }

  /** A `dgemma/status` notification. */
  update(status: ServerStatus): void {
    this.last = status;
    const details = [status.model, status.device].filter(Boolean).join(' on ');
    const latency = status.lastLatencyMs !== undefined ? `last completion ${Math.round(status.lastLatencyMs)} ms` : '';
    this.show(status.state, [status.message, details, latency].filter(Boolean).join(' · '));
  }

  /** A `$/progress` report (model loading): shown only while nothing newer says ready. */
  progress(title: string | undefined, message: string | undefined, percentage: number | undefined, done: boolean): void {
    if (done) {
      if (this.last) this.update(this.last);
      return;
    }
    const pct = percentage !== undefined ? ` ${Math.round(percentage)}%` : '';
    this.show('loading', [title, message].filter(Boolean).join(': '), pct);
  }

  stopped(reason: string): void {
    this.last = undefined;
    this.show('stopped', reason);
  }

  private show(state: keyof typeof ICONS, tooltip: string, suffix = ''): void {
    this.item.text = `${ICONS[state]} DGemma${suffix}`;
    this.item.tooltip = `DiffusionGemma: ${state}${tooltip ? ` — ${tooltip}` : ''}\nClick for the server output.`;
    this.item.accessibilityInformation = { label: `DiffusionGemma ${state}`, role: 'button' };
    this.item.backgroundColor = state === 'error' || state === 'stopped'
      ? new vscode.ThemeColor('statusBarItem.errorBackground')
      : undefined;
  }

  dispose(): void {
    this.item.dispose();
  }
}
