--- Draws one suggestion per buffer as extmark ghost text: the first line inline at the cursor, the
--- other lines as virtual lines below it. Knows nothing of LSP, requests or where the text came from.
local M = {}

M.namespace = vim.api.nvim_create_namespace('dgemma.ghost')

--- Highlight groups, defined `default` so a colorscheme can override them.
function M.define_highlights()
  local final = vim.fn.hlexists('ComplHint') == 1 and 'ComplHint' or 'Comment'
  vim.api.nvim_set_hl(0, 'DGemmaGhost', { default = true, link = final })
  -- Drafts are the model's work in progress: dimmer than a finished suggestion.
  vim.api.nvim_set_hl(0, 'DGemmaDraft', { default = true, link = 'NonText' })
end

---@param bufnr integer
---@param row integer 0-based
---@param col integer 0-based byte column
---@param text string what would be inserted at (row, col); may hold newlines
---@param hl_group string
function M.show(bufnr, row, col, text, hl_group)
  M.clear(bufnr)
  if text == '' then
    return
  end
  local lines = vim.split(text, '\n', { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], hl_group } }
  end
  vim.api.nvim_buf_set_extmark(bufnr, M.namespace, row, col, {
    virt_text = { { lines[1], hl_group } },
    virt_text_pos = 'inline',
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = 'combine',
  })
end

---@param bufnr integer
function M.clear(bufnr)
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  end
end

---@param bufnr integer
---@return boolean
function M.is_shown(bufnr)
  return #vim.api.nvim_buf_get_extmarks(bufnr, M.namespace, 0, -1, { limit = 1 }) > 0
end

return M
