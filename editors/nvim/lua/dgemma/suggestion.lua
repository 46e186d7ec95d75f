--- The plugin's own suggestion per buffer (a draft, a final result on Neovim 0.11, or what is left
--- after a partial accept): where it is anchored, what it inserts, and how much of it to accept.
--- Knows nothing of LSP requests; positions are 0-based rows and byte columns.
local ghost = require('dgemma.ghost')

local M = {}

---@class dgemma.Suggestion
---@field row integer 0-based row of the anchor
---@field col integer 0-based byte column of the anchor (the text is inserted there)
---@field text string the whole text to insert at the anchor; may hold newlines
---@field kind 'draft'|'final'
---@field replace_after? integer bytes after the request's cursor that a full accept replaces
---@field request_id? integer|string

---@type table<integer, dgemma.Suggestion>
local by_buffer = {}

---@param bufnr integer
---@param suggestion dgemma.Suggestion|nil
function M.set(bufnr, suggestion)
  by_buffer[bufnr] = suggestion
end

---@param bufnr integer
---@return dgemma.Suggestion|nil
function M.get(bufnr)
  return by_buffer[bufnr]
end

---@param bufnr integer
function M.clear(bufnr)
  by_buffer[bufnr] = nil
  ghost.clear(bufnr)
end

local function in_insert_mode()
  return vim.api.nvim_get_mode().mode:sub(1, 1) == 'i'
end

--- The part of the suggestion still ahead of the cursor, or nil when the cursor left it: typing
--- what the suggestion says keeps it alive (no flicker), typing anything else drops it.
---@param suggestion dgemma.Suggestion
---@param bufnr integer
---@param win integer
---@return string|nil
function M.remaining(suggestion, bufnr, win)
  local cursor = vim.api.nvim_win_get_cursor(win)
  local row, col = cursor[1] - 1, cursor[2]
  if row ~= suggestion.row or col < suggestion.col then
    return nil
  end
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  local typed = line:sub(suggestion.col + 1, col)
  local first_line = suggestion.text:match('^[^\n]*')
  if #typed > #first_line or first_line:sub(1, #typed) ~= typed then
    return nil
  end
  return suggestion.text:sub(#typed + 1)
end

--- Redraws the buffer's suggestion at the cursor of the current window, or clears it.
---@param bufnr integer
function M.render(bufnr)
  local suggestion = by_buffer[bufnr]
  local win = vim.api.nvim_get_current_win()
  if not suggestion or vim.api.nvim_win_get_buf(win) ~= bufnr or not in_insert_mode() then
    ghost.clear(bufnr)
    return
  end
  local rest = M.remaining(suggestion, bufnr, win)
  if not rest or rest == '' then
    M.clear(bufnr)
    return
  end
  local cursor = vim.api.nvim_win_get_cursor(win)
  ghost.show(bufnr, cursor[1] - 1, cursor[2], rest, suggestion.kind == 'draft' and 'DGemmaDraft' or 'DGemmaGhost')
end

--- Leading whitespace and then one word, one run of punctuation, or one line break with the next
--- line's indentation: what "accept word" takes, like VS Code's and Copilot's.
---@param text string
---@return string
function M.next_word(text)
  for _, pattern in ipairs({ '^[ \t]*[%w_]+', '^[ \t]*[^%w_%s]+', '^[ \t]*\n[ \t]*' }) do
    local piece = text:match(pattern)
    if piece then
      return piece
    end
  end
  return text
end

--- The rest of the current line; when the suggestion continues on a new line, that line break and
--- the next line.
---@param text string
---@return string
function M.next_line(text)
  local first_break = text:find('\n', 1, true)
  if not first_break then
    return text
  end
  if first_break > 1 then
    return text:sub(1, first_break - 1)
  end
  local second_break = text:find('\n', 2, true)
  return second_break and text:sub(1, second_break - 1) or text
end

--- Inserts text at the cursor and moves the cursor to its end.
---@param bufnr integer
---@param win integer
---@param text string
---@param replace_after integer bytes after the cursor that the text replaces
local function insert_at_cursor(bufnr, win, text, replace_after)
  local cursor = vim.api.nvim_win_get_cursor(win)
  local row, col = cursor[1] - 1, cursor[2]
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  local end_col = math.min(col + replace_after, #line)
  local lines = vim.split(text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, row, col, row, end_col, lines)
  local new_col = (#lines == 1 and col or 0) + #lines[#lines]
  vim.api.nvim_win_set_cursor(win, { row + #lines, new_col })
end

--- Accepts all or part of the visible suggestion. What is left stays shown, anchored at the new
--- cursor, so the next partial accept continues from there.
---@param bufnr integer
---@param how 'all'|'word'|'line'
---@return boolean accepted false when no suggestion is visible at the cursor
function M.accept(bufnr, how)
  local suggestion = by_buffer[bufnr]
  local win = vim.api.nvim_get_current_win()
  if not suggestion or vim.api.nvim_win_get_buf(win) ~= bufnr then
    return false
  end
  local rest = M.remaining(suggestion, bufnr, win)
  if not rest or rest == '' then
    M.clear(bufnr)
    return false
  end
  local piece = how == 'word' and M.next_word(rest) or how == 'line' and M.next_line(rest) or rest
  local whole = piece == rest
  -- Text the suggestion replaces after the cursor goes only when the whole suggestion goes in.
  insert_at_cursor(bufnr, win, piece, whole and (suggestion.replace_after or 0) or 0)
  if whole then
    M.clear(bufnr)
  else
    local cursor = vim.api.nvim_win_get_cursor(win)
    by_buffer[bufnr] = {
      row = cursor[1] - 1,
      col = cursor[2],
      text = rest:sub(#piece + 1),
      kind = 'final',
      replace_after = suggestion.replace_after,
    }
    M.render(bufnr)
  end
  return true
end

return M
