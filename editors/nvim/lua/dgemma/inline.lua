--- Inline completion for the dgemma client: streamed drafts (`dgemma/draft`) on every version, final
--- results through vim.lsp.inline_completion on 0.12+ or through the plugin's own debounced
--- `textDocument/inlineCompletion` requests (0.11, or `builtin_inline_completion = false`).
--- Owns request bookkeeping and the insert-mode autocmds; drawing and accepting live in
--- dgemma.suggestion, positions in dgemma.lsp.
local dlsp = require('dgemma.lsp')
local suggestion = require('dgemma.suggestion')
local ghost = require('dgemma.ghost')

local M = {}

local METHOD = 'textDocument/inlineCompletion'
local TRIGGER_AUTOMATIC = 2
local REQUEST_CANCELLED = -32800

---@type table
local config = {}

--- Per client: the newest inlineCompletion request id seen and whether it has finished. Request ids
--- grow per client, so a draft of any older request is stale (the server cancels those anyway).
---@type table<integer, {id: integer, finished: boolean}>
local newest = {}

--- Own path: the pending request and the debounce timer per buffer.
---@type table<integer, {client_id: integer, id: integer}>
local pending = {}
---@type table<integer, uv.uv_timer_t>
local timers = {}

--- Whether final results come from Neovim's built-in (0.12+).
function M.uses_builtin()
  return config.builtin_inline_completion ~= false and vim.lsp.inline_completion ~= nil
end

local function in_insert_mode()
  return vim.api.nvim_get_mode().mode:sub(1, 1) == 'i'
end

--- The built-in keeps drawing its last result while the user types; while our ghost text (a newer
--- draft, or what a partial accept left) is up, one ghost at the cursor is enough.
local function hide_builtin(bufnr)
  local namespace = vim.api.nvim_get_namespaces()['nvim.lsp.inline_completion']
  if namespace and ghost.is_shown(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, namespace, 0, -1)
  end
end

local function is_stale(client_id, request_id)
  local seen = newest[client_id]
  if not seen or type(request_id) ~= 'number' then
    return false
  end
  return request_id < seen.id or (request_id == seen.id and seen.finished)
end

--- `dgemma/draft` handler: {uri, version, position, requestId, step, text}.
function M.on_draft(_, params, ctx)
  local client = vim.lsp.get_client_by_id(ctx.client_id)
  if not client or type(params) ~= 'table' or type(params.text) ~= 'string' or not params.position then
    return
  end
  local bufnr = vim.fn.bufnr(vim.uri_to_fname(params.uri))
  if bufnr ~= vim.api.nvim_get_current_buf() or not in_insert_mode() then
    return
  end
  if is_stale(ctx.client_id, params.requestId) then
    return
  end
  local row = params.position.line
  suggestion.set(bufnr, {
    row = row,
    col = dlsp.byte_col(bufnr, row, params.position.character, client.offset_encoding),
    text = dlsp.sanitize(params.text),
    kind = 'draft',
    request_id = params.requestId,
  })
  suggestion.render(bufnr)
  hide_builtin(bufnr)
end

--- Turns an InlineCompletionItem into the buffer's suggestion. `position` is where the request was
--- made; an item range on that line may start before it (the item then repeats what is typed) and
--- may end after it (a full accept replaces that text too).
local function show_item(bufnr, client, item, position)
  local insert_text = item.insertText
  local text = type(insert_text) == 'table' and insert_text.value or insert_text
  if type(text) ~= 'string' then
    return
  end
  local encoding = client.offset_encoding
  local row = position.line
  local cursor_col = dlsp.byte_col(bufnr, row, position.character, encoding)
  local anchor_col, replace_after = cursor_col, 0
  local range = item.range
  if range and range.start.line == row then
    local start_col = dlsp.byte_col(bufnr, row, range.start.character, encoding)
    if start_col <= cursor_col then
      anchor_col = start_col
      if range['end'].line == row then
        replace_after = math.max(0, dlsp.byte_col(bufnr, row, range['end'].character, encoding) - cursor_col)
      end
    end
  end
  suggestion.set(bufnr, { row = row, col = anchor_col, text = text, kind = 'final', replace_after = replace_after })
  suggestion.render(bufnr)
end

--- Own path: cancels the buffer's pending request and debounce timer.
---@param bufnr integer
function M.cancel(bufnr)
  local timer = timers[bufnr]
  if timer then
    timer:stop()
  end
  local request = pending[bufnr]
  pending[bufnr] = nil
  local client = request and vim.lsp.get_client_by_id(request.client_id)
  if client then
    client:cancel_request(request.id)
  end
end

--- Own path: asks for an inline completion at the cursor now.
---@param bufnr integer
function M.request(bufnr)
  local win = vim.api.nvim_get_current_win()
  local client = dlsp.client(bufnr)
  if not client or vim.api.nvim_win_get_buf(win) ~= bufnr or not in_insert_mode() then
    return
  end
  M.cancel(bufnr)
  local params = vim.lsp.util.make_position_params(win, client.offset_encoding)
  params.context = { triggerKind = TRIGGER_AUTOMATIC }
  local ok, id = client:request(METHOD, params, function(err, result, ctx)
    if pending[bufnr] and pending[bufnr].id == ctx.request_id then
      pending[bufnr] = nil
    end
    if err then
      if err.code ~= REQUEST_CANCELLED then
        vim.notify_once('dgemma: inline completion failed: ' .. tostring(err.message), vim.log.levels.WARN)
      end
      return
    end
    local items = result and (result.items or result) or {}
    if items[1] and in_insert_mode() and vim.api.nvim_get_current_buf() == bufnr then
      show_item(bufnr, client, items[1], params.position)
    end
  end, bufnr)
  if ok and id then
    pending[bufnr] = { client_id = client.id, id = id }
  end
end

--- Own path: asks after `debounce_ms` of quiet.
---@param bufnr integer
function M.request_debounced(bufnr)
  local timer = timers[bufnr]
  if not timer then
    timer = assert(vim.uv.new_timer())
    timers[bufnr] = timer
  end
  timer:stop()
  timer:start(config.debounce_ms or 150, 0, vim.schedule_wrap(function()
    if vim.api.nvim_buf_is_valid(bufnr) then
      M.request(bufnr)
    end
  end))
end

--- Accepts the visible suggestion, all of it or the next word or line. Our own ghost text wins
--- over the built-in's (it is the newer one when both exist). The built-in's item is taken through
--- vim.lsp.inline_completion.get{on_accept} (it runs on the next tick) and inserted by the plugin
--- too: one insertion path for every version, exact text (the built-in pastes, and a paste drops
--- control characters), and partial accepts, which the built-in lacks.
---@param how 'all'|'word'|'line'
---@return boolean accepted whether something was (or, on 0.12, will be) accepted
function M.accept(how)
  local bufnr = vim.api.nvim_get_current_buf()
  if ghost.is_shown(bufnr) and suggestion.accept(bufnr, how) then
    if M.uses_builtin() then
      -- Drops the built-in's stale item so it does not redraw next to what is left of ours.
      vim.lsp.inline_completion.get({ bufnr = bufnr, on_accept = function() return nil end })
    end
    return true
  end
  if not M.uses_builtin() then
    return false
  end
  return vim.lsp.inline_completion.get({
    bufnr = bufnr,
    on_accept = function(item)
      local text = item.insert_text
      if type(text) ~= 'string' then
        return how == 'all' and item or nil -- a snippet goes in whole, expanded by the built-in
      end
      local cursor = vim.api.nvim_win_get_cursor(0)
      local row, col = cursor[1] - 1, cursor[2]
      local anchor_col, replace_after = col, 0
      if item.range then
        local start_row, start_col, end_row, end_col = item.range:to_extmark()
        if start_row == row and start_col <= col then
          anchor_col = start_col
          replace_after = end_row == row and math.max(0, end_col - col) or 0
        end
      end
      suggestion.set(bufnr, { row = row, col = anchor_col, text = text, kind = 'final', replace_after = replace_after })
      local accepted = suggestion.accept(bufnr, how)
      if not accepted then
        -- The cursor left the item (the built-in still drew what it could): let it insert.
        suggestion.clear(bufnr)
        return how == 'all' and item or nil
      end
      local client = item.command and vim.lsp.get_client_by_id(item.client_id)
      if client and how == 'all' then
        client:exec_cmd(item.command, { bufnr = bufnr })
      end
      return nil
    end,
  })
end

--- Hides every suggestion in the current buffer and cancels what is pending.
---@return boolean dismissed whether anything was shown or pending
function M.dismiss()
  local bufnr = vim.api.nvim_get_current_buf()
  local had = ghost.is_shown(bufnr) or pending[bufnr] ~= nil
  suggestion.clear(bufnr)
  M.cancel(bufnr)
  if M.uses_builtin() then
    had = vim.lsp.inline_completion.get({ bufnr = bufnr, on_accept = function() return nil end }) or had
  end
  return had
end

local function on_lsp_request(args)
  local data = args.data
  local request = data and data.request
  if not request or request.method ~= METHOD or not dlsp.is_ours(data.client_id) then
    return
  end
  local seen = newest[data.client_id]
  if request.type == 'pending' then
    if not seen or data.request_id > seen.id then
      newest[data.client_id] = { id = data.request_id, finished = false }
    end
    return
  end
  -- 'complete' or 'cancel': this request's drafts are over; its final result (if any) is drawn by
  -- the built-in, or by our own handler right after this event.
  if seen and seen.id == data.request_id then
    seen.finished = true
  end
  local bufnr = request.bufnr
  local current = bufnr and suggestion.get(bufnr)
  if current and current.kind == 'draft' and (type(current.request_id) ~= 'number' or current.request_id <= data.request_id) then
    suggestion.clear(bufnr)
  end
  -- With the built-in, a finished request also replaces what a partial accept left.
  if current and current.kind == 'final' and M.uses_builtin() and request.type == 'complete' then
    suggestion.clear(bufnr)
  end
end

--- Creates the autocmds (idempotent: the group is cleared first).
---@param opts table merged config
function M.setup(opts)
  config = opts
  local group = vim.api.nvim_create_augroup('dgemma.inline', { clear = true })
  local function ours(bufnr)
    return dlsp.client(bufnr) ~= nil
  end

  vim.api.nvim_create_autocmd('LspRequest', { group = group, callback = on_lsp_request })

  vim.api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if not client or client.name ~= dlsp.name then
        return
      end
      dlsp.sanitize_inline_results(client)
      if M.uses_builtin() then
        vim.lsp.inline_completion.enable(true, { client_id = client.id })
      end
      -- What the user typed while the client started found nobody to ask, and the built-in asks
      -- only on the next keystroke: if they are still typing here, ask once now (own path, both
      -- versions; the built-in takes over from the next keystroke on).
      if args.buf == vim.api.nvim_get_current_buf() and in_insert_mode() then
        M.request(args.buf)
      end
    end,
  })

  vim.api.nvim_create_autocmd({ 'InsertEnter', 'TextChangedI', 'CursorMovedI' }, {
    group = group,
    callback = function(args)
      if not ours(args.buf) then
        return
      end
      if args.event ~= 'InsertEnter' then
        suggestion.render(args.buf)
        if M.uses_builtin() then
          -- The built-in redraws its stale ghost in its own CursorMovedI handler, after this one.
          vim.schedule(function()
            if vim.api.nvim_buf_is_valid(args.buf) then
              hide_builtin(args.buf)
            end
          end)
        end
      end
      if not M.uses_builtin() then
        M.request_debounced(args.buf)
      end
    end,
  })

  vim.api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave', 'LspDetach' }, {
    group = group,
    callback = function(args)
      suggestion.clear(args.buf)
      M.cancel(args.buf)
    end,
  })

  vim.api.nvim_create_autocmd('BufWipeout', {
    group = group,
    callback = function(args)
      M.cancel(args.buf)
      local timer = timers[args.buf]
      if timer then
        timers[args.buf] = nil
        timer:close()
      end
      suggestion.set(args.buf, nil)
    end,
  })

  -- A setup() after clients started (re-setup, lazy loading) enables the built-in for them too.
  if M.uses_builtin() then
    for _, client in ipairs(vim.lsp.get_clients({ name = dlsp.name })) do
      dlsp.sanitize_inline_results(client)
      vim.lsp.inline_completion.enable(true, { client_id = client.id })
    end
  end
end

return M
