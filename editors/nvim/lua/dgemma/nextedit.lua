--- Next-edit suggestions: after the user changes one place, the edit the server proposes elsewhere.
--- Asks `textDocument/copilotInlineEdit` (Copilot's shape, docs/next-edit.md) once the buffer has
--- been left alone for `next_edit.debounce_ms` in normal mode (after leaving insert mode, after a
--- normal-mode change, after accepting a completion or an edit), never while ghost text shows.
--- Shows the one edit it gets: the text it deletes highlighted (DGemmaNextEditDelete), the text it
--- inserts as virtual text after it (DGemmaNextEditInsert). <Tab> jumps to the edit, <Tab> again
--- applies it (then runs the edit's command, which tells the server it was accepted); <Esc>
--- dismisses it (`dgemma/didRejectInlineEdit`: the server never offers it again). Any change to
--- the buffer drops a shown edit (it was computed for the text before). Normal mode only: insert
--- mode belongs to completions. Knows the LSP client; draws its own extmarks.
local dlsp = require('dgemma.lsp')
local ghost = require('dgemma.ghost')

local M = {}

M.namespace = vim.api.nvim_create_namespace('dgemma.nextedit')

--- Per buffer: the edit shown {row, col, end_row, end_col, text, command, client_id, version}.
---@type table<integer, table>
local shown = {}
--- Per buffer: the pending timer and the id of the request in flight.
local timers, requests = {}, {}
local cfg = { debounce_ms = 300, enabled = true }
local group = vim.api.nvim_create_augroup('dgemma.nextedit', { clear = true })

function M.define_highlights()
  vim.api.nvim_set_hl(0, 'DGemmaNextEditDelete', { default = true, link = 'DiffDelete' })
  vim.api.nvim_set_hl(0, 'DGemmaNextEditInsert', { default = true, link = 'DiffAdd' })
end

---@param bufnr integer
---@return table|nil the shown edit (0-based rows, byte columns), or nil
function M.current(bufnr)
  return shown[bufnr]
end

local function clear(bufnr)
  shown[bufnr] = nil
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  end
end

local function cancel(bufnr)
  if timers[bufnr] then
    timers[bufnr]:stop()
    timers[bufnr]:close()
    timers[bufnr] = nil
  end
  local pending = requests[bufnr]
  if pending then
    requests[bufnr] = nil
    local client = vim.lsp.get_client_by_id(pending.client_id)
    if client then
      client:cancel_request(pending.id)
    end
  end
end

local function completion_showing(bufnr)
  if ghost.is_shown(bufnr) then
    return true
  end
  local builtin = vim.api.nvim_get_namespaces()['nvim.lsp.inline_completion']
  return builtin ~= nil and #vim.api.nvim_buf_get_extmarks(bufnr, builtin, 0, -1, { limit = 1 }) > 0
end

local function draw(bufnr, edit)
  vim.api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  if edit.row ~= edit.end_row or edit.col ~= edit.end_col then
    vim.api.nvim_buf_set_extmark(bufnr, M.namespace, edit.row, edit.col, {
      end_row = edit.end_row, end_col = edit.end_col, hl_group = 'DGemmaNextEditDelete',
    })
  end
  if edit.text ~= '' then
    local lines = vim.split(edit.text, '\n', { plain = true })
    local virt_lines = {}
    for i = 2, #lines do
      virt_lines[#virt_lines + 1] = { { lines[i], 'DGemmaNextEditInsert' } }
    end
    vim.api.nvim_buf_set_extmark(bufnr, M.namespace, edit.end_row, edit.end_col, {
      virt_text = { { lines[1], 'DGemmaNextEditInsert' } },
      virt_text_pos = 'inline',
      virt_lines = #virt_lines > 0 and virt_lines or nil,
    })
  end
end

local function on_result(bufnr, client, version, result)
  local edit = type(result) == 'table' and type(result.edits) == 'table' and result.edits[1] or nil
  if not edit or not vim.api.nvim_buf_is_valid(bufnr) or vim.lsp.util.buf_versions[bufnr] ~= version
      or vim.api.nvim_get_mode().mode ~= 'n' or completion_showing(bufnr) then
    return -- nothing, or for a text or a moment that is gone
  end
  local encoding = client.offset_encoding
  local range = edit.range
  local row, end_row = range.start.line, range['end'].line
  if end_row >= vim.api.nvim_buf_line_count(bufnr) then
    return
  end
  local item = {
    row = row,
    col = dlsp.byte_col(bufnr, row, range.start.character, encoding),
    end_row = end_row,
    end_col = dlsp.byte_col(bufnr, end_row, range['end'].character, encoding),
    text = dlsp.sanitize(edit.text or ''),
    range = range,
    command = edit.command,
    client_id = client.id,
    version = version,
  }
  shown[bufnr] = item
  draw(bufnr, item)
  client:notify('textDocument/didShowInlineEdit', { item = { command = edit.command } })
end

--- Asks the server for a next edit at the cursor now (the timer calls this; so can a user).
---@param bufnr? integer
function M.request(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local client = dlsp.client(bufnr)
  if not client or not cfg.enabled or completion_showing(bufnr) then
    return
  end
  cancel(bufnr)
  local version = vim.lsp.util.buf_versions[bufnr]
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.textDocument.version = version
  local ok, id = client:request('textDocument/copilotInlineEdit', params, function(err, result)
    if requests[bufnr] and requests[bufnr].id == id then
      requests[bufnr] = nil
    end
    if not err then
      on_result(bufnr, client, version, result)
    end
  end, bufnr)
  if ok then
    requests[bufnr] = { id = id, client_id = client.id }
  end
end

--- Schedules a request once the buffer has been left alone for debounce_ms.
---@param bufnr integer
function M.schedule(bufnr)
  cancel(bufnr)
  if not cfg.enabled then
    return
  end
  local timer = assert(vim.uv.new_timer())
  timers[bufnr] = timer
  timer:start(cfg.debounce_ms, 0, vim.schedule_wrap(function()
    if timers[bufnr] == timer then
      timers[bufnr] = nil
      timer:close()
      if vim.api.nvim_buf_is_valid(bufnr) and vim.api.nvim_get_current_buf() == bufnr
          and vim.api.nvim_get_mode().mode == 'n' then
        M.request(bufnr)
      end
    end
  end))
end

--- <Tab>: jump to the shown edit, or apply it when the cursor is already there. False: no edit.
---@return boolean
function M.tab()
  local bufnr = vim.api.nvim_get_current_buf()
  local edit = shown[bufnr]
  if not edit then
    return false
  end
  local cursor = vim.api.nvim_win_get_cursor(0)
  if cursor[1] - 1 ~= edit.row or cursor[2] ~= edit.col then
    vim.api.nvim_win_set_cursor(0, { edit.row + 1, edit.col })
    return true
  end
  local client = vim.lsp.get_client_by_id(edit.client_id)
  clear(bufnr)
  if not client or vim.lsp.util.buf_versions[bufnr] ~= edit.version then
    return true
  end
  vim.lsp.util.apply_text_edits({ { range = edit.range, newText = edit.text } }, bufnr, client.offset_encoding)
  if edit.command then
    client:request('workspace/executeCommand', { command = edit.command.command, arguments = edit.command.arguments },
      function() end, bufnr)
  end
  M.schedule(bufnr) -- after an accepted edit, the next one
  return true
end

--- <Esc>: dismiss the shown edit; the server remembers it as rejected. False: no edit.
---@return boolean
function M.dismiss()
  local bufnr = vim.api.nvim_get_current_buf()
  local edit = shown[bufnr]
  if not edit then
    return false
  end
  clear(bufnr)
  local client = vim.lsp.get_client_by_id(edit.client_id)
  if client and edit.command then
    client:notify('dgemma/didRejectInlineEdit', { item = { command = edit.command } })
  end
  return true
end

local mapped = {}

---@param config table the merged plugin config (its `next_edit` table)
function M.setup(config)
  local options = config.next_edit or {}
  cfg = { enabled = options.enabled ~= false, debounce_ms = options.debounce_ms or 300 }
  M.define_highlights()
  vim.api.nvim_clear_autocmds({ group = group })
  for _, lhs in ipairs(mapped) do
    pcall(vim.keymap.del, 'n', lhs)
  end
  mapped = {}
  if not cfg.enabled then
    return
  end
  vim.api.nvim_create_autocmd({ 'InsertLeave', 'TextChanged' }, {
    group = group,
    callback = function(args)
      if not dlsp.client(args.buf) then
        return
      end
      if args.event == 'TextChanged' then
        clear(args.buf) -- computed for the text before this change
      end
      M.schedule(args.buf)
    end,
  })
  vim.api.nvim_create_autocmd({ 'InsertEnter', 'TextChangedI' }, {
    group = group,
    callback = function(args)
      cancel(args.buf)
      clear(args.buf)
    end,
  })
  vim.api.nvim_create_autocmd('BufUnload', {
    group = group,
    callback = function(args)
      cancel(args.buf)
      shown[args.buf] = nil
    end,
  })
  for name, action in pairs({ accept = M.tab, dismiss = M.dismiss }) do
    local lhs = options.keymaps and options.keymaps[name]
    if lhs then
      local fallback = vim.keycode(lhs)
      vim.keymap.set('n', lhs, function()
        if not action() then
          vim.api.nvim_feedkeys(fallback, 'n', false)
        end
      end, { desc = 'dgemma: next edit ' .. name })
      mapped[#mapped + 1] = lhs
    end
  end
end

return M
