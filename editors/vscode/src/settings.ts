/**
 * Reads the `dgemma.*` settings: where the server lives and what it is told.
 *
 * Owns the mapping from VS Code settings to the server's camelCase settings
 * object (sent as initializationOptions and on workspace/didChangeConfiguration)
 * and the lookup of the `dgemma-lsp` executable. Knows nothing of the language
 * client or of rendering.
 */
import * as fs from 'fs';
import * as path from 'path';
import * as vscode from 'vscode';

/** Server settings the extension mirrors; a null value means "the server's default" and is not sent. */
const SERVER_SETTING_KEYS = [
  'enable', 'drafts', 'maxCandidates', 'steps', 'maxTokens', 'seed',
  'debounceMs', 'contextTokens', 'crossFile', 'crossFileTokens', 'rewriteStrength', 'promptCacheMB',
  'nextEdit', 'nextEditStrength', 'nextEditDebounceMs',
] as const;

export function serverSettings(): Record<string, unknown> {
  const config = vscode.workspace.getConfiguration('dgemma');
  const settings: Record<string, unknown> = {};
  for (const key of SERVER_SETTING_KEYS) {
    const value = config.get(key);
    if (value !== null && value !== undefined) settings[key] = value;
  }
  // The status bar always wants `dgemma/status`, drafts or not.
  settings.status = true;
  return settings;
}

/** True when a change touches how the server is started (needs a restart, not a settings push). */
export function affectsServerLaunch(event: vscode.ConfigurationChangeEvent): boolean {
  // Whether the extension answers `dgemma/definitions` is a client capability, sent at start only.
  return event.affectsConfiguration('dgemma.server') || event.affectsConfiguration('dgemma.editorDefinitions');
}

export interface ServerLaunch { command: string; args: string[] }

/**
 * Finds the executable: an absolute path as given, else the name on PATH, else
 * in a workspace folder's `.venv/bin` (where `make` installs it). Returns
 * undefined when nothing executable is found, so the caller can explain.
 */
export function resolveServer(): ServerLaunch | undefined {
  const config = vscode.workspace.getConfiguration('dgemma');
  const configured = config.get<string>('server.path', 'dgemma-lsp').trim() || 'dgemma-lsp';
  const args = [...config.get<string[]>('server.args', []), ...engineArgs(config), '--stdio'];
  const candidates: string[] = [];
  if (path.isAbsolute(configured)) {
    candidates.push(configured);
  } else if (configured.includes('/') || configured.includes('\\')) {
    for (const folder of vscode.workspace.workspaceFolders ?? []) {
      candidates.push(path.join(folder.uri.fsPath, configured));
    }
  } else {
    const suffixes = process.platform === 'win32' ? ['.exe', '.cmd', ''] : [''];
    for (const dir of (process.env.PATH ?? '').split(path.delimiter).filter(Boolean)) {
      for (const suffix of suffixes) candidates.push(path.join(dir, configured + suffix));
    }
    const venvBin = process.platform === 'win32' ? path.join('.venv', 'Scripts') : path.join('.venv', 'bin');
    for (const folder of vscode.workspace.workspaceFolders ?? []) {
      for (const suffix of suffixes) candidates.push(path.join(folder.uri.fsPath, venvBin, configured + suffix));
    }
  }
  const command = candidates.find(isExecutable);
  return command ? { command, args } : undefined;
}

/** `--engine` (and, for a vLLM server, `--engine-url`) when not the server's default. */
function engineArgs(config: vscode.WorkspaceConfiguration): string[] {
  const engine = config.get<string>('server.engine', 'auto');
  if (engine === 'auto') return [];
  const url = config.get<string>('server.engineUrl', '').trim();
  return engine === 'vllm' && url ? ['--engine', engine, '--engine-url', url] : ['--engine', engine];
}

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}
