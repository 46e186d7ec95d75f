--- The dgemma language client as the other modules see it: finding it for a buffer and converting
--- LSP positions (in the client's negotiated offset encoding) to and from byte columns.
--- Knows nothing of suggestions, ghost text or keymaps.
local M = {}

--- Name of the config registered with vim.lsp.config and of the running clients.
M.name = 'dgemma'

---@param bufnr integer
---@return vim.lsp.Client|nil
function M.client(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = M.name })[1]
end

---@param client_id integer
---@return boolean
function M.is_ours(client_id)
  local client = vim.lsp.get_client_by_id(client_id)
  return client ~= nil and client.name == M.name
end

local function line_text(bufnr, row)
  return vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
end

--- Byte column of an LSP character offset on a buffer line.
---@param bufnr integer
---@param row integer 0-based
---@param character integer in `encoding` units
---@param encoding string 'utf-8'|'utf-16'|'utf-32'
---@return integer
function M.byte_col(bufnr, row, character, encoding)
  local line = line_text(bufnr, row)
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  return ok and col or #line
end

--- LSP character offset of a byte column on a buffer line.
---@param bufnr integer
---@param row integer 0-based
---@param col integer byte column
---@param encoding string
---@return integer
function M.character(bufnr, row, col, encoding)
  local line = line_text(bufnr, row)
  col = math.min(col, #line)
  if encoding == 'utf-8' then
    return col
  end
  local ok, character = pcall(vim.str_utfindex, line, encoding, col, false)
  return ok and character or col
end

--- Text from the server as the editor can show it: Neovim ends virtual text at a NUL, so a NUL
--- (a random or broken model can emit one) would make the ghost text shorter than what an accept
--- inserts. Other control characters show as ^X in ghost text and in the buffer alike.
---@param text string
---@return string
function M.sanitize(text)
  return (text:gsub('%z', ''))
end

--- Sanitizes the inline completion results this client receives, whoever asked for them (the
--- plugin or vim.lsp.inline_completion, which gives no hook between response and drawing).
---@param client vim.lsp.Client
function M.sanitize_inline_results(client)
  if client.dgemma_sanitized then
    return
  end
  client.dgemma_sanitized = true
  local request = client.request
  client.request = function(self, method, params, handler, bufnr)
    if method == 'textDocument/inlineCompletion' and handler then
      local inner = handler
      handler = function(err, result, ctx)
        for _, item in ipairs(type(result) == 'table' and (result.items or result) or {}) do
          if type(item.insertText) == 'string' then
            item.insertText = M.sanitize(item.insertText)
          end
        end
        return inner(err, result, ctx)
      end
    end
    return request(self, method, params, handler, bufnr)
  end
end

return M
