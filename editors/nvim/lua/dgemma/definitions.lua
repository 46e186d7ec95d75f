--- Answers dgemma-lsp's `dgemma/definitions` request (docs/context.md): for each position it sends
--- (names used near the cursor), the definitions that the buffer's *other* language servers find
--- (`textDocument/definition`, never asked of dgemma-lsp itself), each with the text of its first
--- `maxLines` lines, read from the buffer when the file is loaded, else from disk. The plugin
--- advertises the request with `capabilities.experimental.dgemmaDefinitions` (setup's
--- `editor_definitions = false` turns that off).
---
--- Neovim runs a server request's handler in a coroutine (vim.lsp.rpc), so the handler yields while
--- the other servers answer and never blocks the editor; a server that has not answered within
--- TIMEOUT_MS (or answers with an error) leaves its positions `null` ("not known yet": dgemma-lsp
--- asks again later); what the others found by then is sent.
--- Knows LSP locations and buffers; knows nothing of suggestions or ghost text.
local dlsp = require('dgemma.lsp')

local M = {}

--- How long the other servers may take, in total, before the answer goes with what they said.
M.TIMEOUT_MS = 1500

local MAX_LINES = 20

--- `count` lines of the file at `uri` from 0-based `first`, from its buffer when loaded, else from disk.
---@return string[]|nil
local function lines_of(uri, first, count)
  local ok, fname = pcall(vim.uri_to_fname, uri)
  if not ok then
    return nil
  end
  local bufnr = vim.fn.bufnr(fname)
  if bufnr ~= -1 and vim.api.nvim_buf_is_loaded(bufnr) then
    return vim.api.nvim_buf_get_lines(bufnr, first, first + count, false)
  end
  local read_ok, lines = pcall(vim.fn.readfile, fname, '', first + count)
  if not read_ok then
    return nil
  end
  return vim.list_slice(lines, first + 1, first + count)
end

--- The locations of one `textDocument/definition` result (Location, Location[] or LocationLink[]).
local function locations(result)
  if type(result) ~= 'table' then
    return {}
  end
  if result.uri or result.targetUri then
    result = { result }
  end
  local found = {}
  for _, location in ipairs(result) do
    local uri = location.targetUri or location.uri
    -- The name's line (a LocationLink's selection range): where the header is, past decorators and docs.
    local range = location.targetSelectionRange or location.range or location.targetRange
    if type(uri) == 'string' and type(range) == 'table' and type(range.start) == 'table' then
      found[#found + 1] = { uri = uri, range = range }
    end
  end
  return found
end

--- The handler of `dgemma/definitions` (registered by dgemma.setup).
function M.handle(_, params, ctx)
  if type(params) ~= 'table' or type(params.textDocument) ~= 'table' or type(params.positions) ~= 'table' then
    return nil, vim.lsp.rpc_response_error(vim.lsp.protocol.ErrorCodes.InvalidParams,
      'expected {textDocument, positions}')
  end
  local answer = {}
  for i = 1, #params.positions do
    answer[i] = vim.NIL
  end
  local ours = vim.lsp.get_client_by_id(ctx.client_id)
  local ok, fname = pcall(vim.uri_to_fname, params.textDocument.uri)
  local bufnr = ok and vim.fn.bufnr(fname) or -1
  local co = coroutine.running()
  if not ours or bufnr == -1 or not vim.api.nvim_buf_is_loaded(bufnr) or not co then
    return answer
  end
  local others = {}
  for _, other in ipairs(vim.lsp.get_clients({ bufnr = bufnr })) do
    if other.name ~= dlsp.name and other.initialized and other:supports_method('textDocument/definition', bufnr) then
      others[#others + 1] = other
    end
  end
  if #others == 0 then
    return answer
  end
  local max_lines = math.min(math.max(tonumber(params.maxLines) or 4, 1), MAX_LINES)
  local found = {}
  local waiting, resumed = 0, false
  local function resume()
    if not resumed then
      resumed = true
      coroutine.resume(co)
    end
  end
  for i, position in ipairs(params.positions) do
    if type(position) == 'table' and type(position.line) == 'number' and type(position.character) == 'number' then
      local row = position.line
      local col = dlsp.byte_col(bufnr, row, position.character, ours.offset_encoding)
      for _, other in ipairs(others) do
        local request = {
          textDocument = { uri = params.textDocument.uri },
          position = { line = row, character = dlsp.character(bufnr, row, col, other.offset_encoding) },
        }
        local sent = other:request('textDocument/definition', request, function(err, result)
          if not err then
            found[i] = found[i] or {}
            vim.list_extend(found[i], locations(result))
          end
          waiting = waiting - 1
          if waiting == 0 then
            vim.schedule(resume)
          end
        end, bufnr)
        if sent then
          waiting = waiting + 1
        end
      end
    end
  end
  if waiting > 0 then
    local timer = vim.defer_fn(resume, M.TIMEOUT_MS)
    coroutine.yield()
    if not timer:is_closing() then
      timer:stop()
      timer:close()
    end
  end
  for i = 1, #params.positions do
    -- Positions no server answered (errors, or still working at the timeout) stay null.
    if found[i] then
      local definitions, seen = {}, {}
      for _, location in ipairs(found[i] or {}) do
        local line = location.range.start.line
        local key = location.uri .. ':' .. tostring(line)
        local text = not seen[key] and lines_of(location.uri, line, max_lines)
        if text then
          seen[key] = true
          definitions[#definitions + 1] = { uri = location.uri, range = location.range, text = table.concat(text, '\n') }
        end
      end
      answer[i] = definitions
    end
  end
  return answer
end

return M
