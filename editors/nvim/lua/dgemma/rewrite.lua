--- `:DGemmaRewrite`: rewrites a selection through the server's `refactor.rewrite` code action
--- (resolved lazily with codeAction/resolve), or its `dgemma.rewriteSelection` command when no
--- action is offered. Knows nothing of inline suggestions.
local dlsp = require('dgemma.lsp')

local M = {}

M.ACTION_KIND = 'refactor.rewrite'
M.COMMAND = 'dgemma.rewriteSelection'

--- The LSP range of lines `line1..line2` (1-based), narrowed to the last visual selection's columns
--- when that selection was characterwise and covers exactly these lines.
---@param bufnr integer
---@param line1 integer
---@param line2 integer
---@param encoding string
---@return lsp.Range
function M.range(bufnr, line1, line2, encoding)
  local start_row, end_row = line1 - 1, line2 - 1
  local end_line = vim.api.nvim_buf_get_lines(bufnr, end_row, end_row + 1, false)[1] or ''
  local start_col, end_col = 0, #end_line
  local mark_start = vim.api.nvim_buf_get_mark(bufnr, '<')
  local mark_end = vim.api.nvim_buf_get_mark(bufnr, '>')
  if vim.fn.visualmode() == 'v' and mark_start[1] == line1 and mark_end[1] == line2 then
    start_col = mark_start[2]
    -- '> points at the first byte of the last selected character; the range ends after it.
    local last_char = vim.fn.strcharpart(end_line:sub(mark_end[2] + 1), 0, 1)
    end_col = math.min(mark_end[2] + math.max(#last_char, 1), #end_line)
  end
  return {
    start = { line = start_row, character = dlsp.character(bufnr, start_row, start_col, encoding) },
    ['end'] = { line = end_row, character = dlsp.character(bufnr, end_row, end_col, encoding) },
  }
end

local function report(message, level)
  vim.notify('dgemma: ' .. message, level or vim.log.levels.INFO)
end

--- Applies a (resolved) code action: its edit, then its command.
local function apply_action(client, bufnr, action, on_done)
  if action.edit then
    vim.lsp.util.apply_workspace_edit(action.edit, client.offset_encoding)
  end
  if action.command then
    local command = type(action.command) == 'table' and action.command or action
    client:exec_cmd(command, { bufnr = bufnr }, function(err)
      if err then
        report('rewrite failed: ' .. tostring(err.message), vim.log.levels.WARN)
      end
      on_done(err == nil)
    end)
    return
  end
  on_done(action.edit ~= nil)
end

--- Rewrites `range` of the buffer. `on_done(ok)` runs once the edit is applied (or failed).
---@param bufnr integer
---@param line1 integer 1-based first line
---@param line2 integer 1-based last line
---@param on_done? fun(ok: boolean)
function M.rewrite(bufnr, line1, line2, on_done)
  on_done = on_done or function() end
  local client = dlsp.client(bufnr)
  if not client then
    report('no dgemma language server attached to this buffer', vim.log.levels.WARN)
    return on_done(false)
  end
  local range = M.range(bufnr, line1, line2, client.offset_encoding)
  local uri = vim.uri_from_bufnr(bufnr)
  local function run_command()
    client:exec_cmd({ title = 'Rewrite selection', command = M.COMMAND, arguments = { uri, range } },
      { bufnr = bufnr }, function(err)
        if err then
          report('rewrite failed: ' .. tostring(err.message), vim.log.levels.WARN)
        end
        on_done(err == nil)
      end)
  end
  local params = {
    textDocument = { uri = uri },
    range = range,
    context = { diagnostics = {}, only = { M.ACTION_KIND }, triggerKind = 1 },
  }
  client:request('textDocument/codeAction', params, function(err, actions)
    local action
    for _, candidate in ipairs(not err and actions or {}) do
      if candidate.kind and vim.startswith(candidate.kind, M.ACTION_KIND) then
        action = candidate
        break
      end
    end
    if not action then
      return run_command()
    end
    if action.edit or not client:supports_method('codeAction/resolve', bufnr) then
      return apply_action(client, bufnr, action, on_done)
    end
    client:request('codeAction/resolve', action, function(resolve_err, resolved)
      if resolve_err or not resolved then
        report('rewrite failed: ' .. tostring(resolve_err and resolve_err.message), vim.log.levels.WARN)
        return on_done(false)
      end
      apply_action(client, bufnr, resolved, on_done)
    end, bufnr)
  end, bufnr)
end

return M
