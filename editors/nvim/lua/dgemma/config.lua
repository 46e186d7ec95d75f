--- Defaults of `require('dgemma').setup{}` and how user options merge into them.
--- Knows no LSP client, buffer or editor state.
local M = {}

M.defaults = {
  -- Command that starts the language server over stdio.
  cmd = { 'dgemma-lsp', '--stdio' },
  -- Where the model runs, as flags added to `cmd`: nil keeps the server's default (this machine's
  -- resident engine); 'vllm' uses a team's vLLM server at `engine_url` (nil: http://127.0.0.1:8000/v1).
  engine = nil,
  engine_url = nil,
  -- That server's API key, handed to the server process as $DGEMMA_LSP_API_KEY (never on its
  -- command line); nil inherits Neovim's environment. E.g. `api_key = os.getenv('TEAM_GPU_KEY')`.
  api_key = nil,
  -- Filetypes the server attaches to.
  filetypes = {
    'python', 'javascript', 'javascriptreact', 'typescript', 'typescriptreact',
    'go', 'rust', 'c', 'cpp', 'java', 'lua',
    'cs', 'ruby', 'php', 'kotlin', 'swift', 'sh', 'bash', 'scala',
    'json', 'jsonc', 'yaml', 'toml', 'html', 'css',
  },
  -- Files or folders that mark a project root; with none found the server runs in single-file mode.
  root_markers = { '.git' },
  -- Server settings, sent as initializationOptions (camelCase, as the server reads them):
  -- drafts, maxCandidates, steps, maxTokens, seed, debounceMs, contextTokens, crossFile, crossFileTokens, rewriteStrength,
  -- promptCacheMB.
  -- `drafts = true` asks for streamed `dgemma/draft` notifications, drawn while the model denoises.
  settings = { drafts = true },
  -- Neovim 0.11 only (0.12's built-in has a fixed 200 ms): wait this long after the last keystroke
  -- before asking. The server coalesces bursts too, so this only saves requests.
  debounce_ms = 150,
  -- On Neovim 0.12+, let vim.lsp.inline_completion request and draw final results; false uses the
  -- plugin's own requests and renderer on every version.
  builtin_inline_completion = true,
  -- Insert-mode keymaps. `keymaps = false` sets none; a single key set to false skips that one.
  -- When there is nothing to accept or dismiss, the key does what it did before.
  keymaps = {
    accept = '<Tab>', -- accept the whole suggestion
    accept_word = '<M-Right>', -- accept up to the next word boundary
    accept_line = '<M-C-Right>', -- accept up to the end of the suggestion's current line
    dismiss = '<C-]>', -- hide the suggestion and cancel pending requests
  },
  -- Answer the server's `dgemma/definitions` request with what the buffer's other language servers
  -- find for the names near the cursor (definitions' first lines go into the prompt, docs/context.md).
  -- false: the server never asks; `settings = { crossFile = false }` sends no other file at all.
  editor_definitions = true,
  -- Next-edit suggestions (docs/next-edit.md), in normal mode: asked for once the buffer has been
  -- left alone for `debounce_ms` after an edit; `keymaps.accept` jumps to the edit, then applies it;
  -- `keymaps.dismiss` dismisses it (never shown again). Without an edit the keys do what they did.
  next_edit = {
    enabled = true,
    debounce_ms = 300,
    keymaps = { accept = '<Tab>', dismiss = '<Esc>' },
  },
}

--- Merges user options into a fresh copy of the defaults. Lists (cmd, filetypes, root_markers)
--- replace the default list as a whole; `settings`, `keymaps` and `next_edit` merge key by key.
---@param opts table|nil
---@return table
function M.merge(opts)
  opts = opts or {}
  local merged = vim.deepcopy(M.defaults)
  for key, value in pairs(opts) do
    if (key == 'settings' or key == 'keymaps') and type(value) == 'table' then
      merged[key] = vim.tbl_extend('force', merged[key], value)
    elseif key == 'next_edit' and type(value) == 'table' then
      merged[key] = vim.tbl_deep_extend('force', merged[key], value)
    else
      merged[key] = vim.deepcopy(value)
    end
  end
  return merged
end

--- The server command: `cmd` plus the engine flags of `engine` / `engine_url`.
---@param cfg table a merged config
---@return string[]
function M.command(cfg)
  local command = vim.deepcopy(cfg.cmd)
  if cfg.engine then
    vim.list_extend(command, { '--engine', cfg.engine })
  end
  if cfg.engine_url then
    vim.list_extend(command, { '--engine-url', cfg.engine_url })
  end
  return command
end

--- Extra environment of the server process (the API key), or nil.
---@param cfg table a merged config
---@return table<string, string>|nil
function M.command_env(cfg)
  return cfg.api_key and { DGEMMA_LSP_API_KEY = cfg.api_key } or nil
end

return M
