--- dgemma for Neovim ≥ 0.11: registers `dgemma-lsp` with vim.lsp.config / vim.lsp.enable, and
--- offers accept / accept_word / accept_line / dismiss, next edits (accept_next_edit / dismiss_next_edit),
--- `:DGemmaRewrite` and `:checkhealth dgemma`.
--- This module wires things together; the work is in dgemma.inline (requests, drafts), dgemma.nextedit,
--- dgemma.suggestion (ghost text state, partial accept), dgemma.rewrite, dgemma.definitions (the other
--- language servers' definitions the server asks for) and dgemma.health.
local config = require('dgemma.config')
local definitions = require('dgemma.definitions')
local dlsp = require('dgemma.lsp')
local ghost = require('dgemma.ghost')
local inline = require('dgemma.inline')
local nextedit = require('dgemma.nextedit')

local M = {}

--- The merged config of the last setup() call; nil before.
---@type table|nil
M.config = nil

--- Last `dgemma/status` params per client id: {state, model, device, message, ...}.
---@type table<integer, table>
local statuses = {}

--- Insert-mode keymaps set by the last setup(), so a later setup() can remove them.
---@type string[]
local mapped = {}

---@param client_id integer
---@return table|nil
function M.status_of(client_id)
  return statuses[client_id]
end

--- A short status for a statusline, e.g. "dgemma: ready" ('' when no client runs in this buffer).
---@return string
function M.status()
  local client = dlsp.client(vim.api.nvim_get_current_buf())
  local status = client and statuses[client.id]
  if not client then
    return ''
  end
  return 'dgemma: ' .. (status and tostring(status.state) or 'starting')
end

local function on_status(_, params, ctx)
  if type(params) ~= 'table' then
    return
  end
  local previous = statuses[ctx.client_id]
  statuses[ctx.client_id] = params
  -- An error is worth one message each time it starts; the statusline shows the rest.
  if params.state == 'error' and (not previous or previous.state ~= 'error') then
    vim.notify('dgemma: ' .. tostring(params.message or 'the model failed'), vim.log.levels.WARN)
  end
end

--- Accepts the whole visible suggestion. Returns false when there is none.
---@return boolean
function M.accept()
  return inline.accept('all')
end

--- Accepts the suggestion up to the next word boundary.
---@return boolean
function M.accept_word()
  return inline.accept('word')
end

--- Accepts the suggestion up to the end of its current line.
---@return boolean
function M.accept_line()
  return inline.accept('line')
end

--- Hides the suggestion and cancels pending requests.
---@return boolean
function M.dismiss()
  return inline.dismiss()
end

--- The next edit shown in the current buffer: {row, col, end_row, end_col, text} (0-based rows,
--- byte columns: the span it replaces and what it inserts), or nil.
---@return table|nil
function M.next_edit()
  return nextedit.current(vim.api.nvim_get_current_buf())
end

--- Asks for a next edit at the cursor now (they are also asked for by themselves after edits).
function M.request_next_edit()
  nextedit.request(vim.api.nvim_get_current_buf())
end

--- Jumps to the shown next edit, or applies it when the cursor is there. False: none is shown.
---@return boolean
function M.accept_next_edit()
  return nextedit.tab()
end

--- Dismisses the shown next edit (the server never offers it again). False: none is shown.
---@return boolean
function M.dismiss_next_edit()
  return nextedit.dismiss()
end

--- Rewrites lines line1..line2 (the visual selection's columns when it was characterwise).
---@param line1 integer
---@param line2 integer
---@param on_done? fun(ok: boolean)
function M.rewrite(line1, line2, on_done)
  require('dgemma.rewrite').rewrite(vim.api.nvim_get_current_buf(), line1, line2, on_done)
end

local function set_keymaps(keymaps)
  for _, lhs in ipairs(mapped) do
    pcall(vim.keymap.del, 'i', lhs)
  end
  mapped = {}
  if not keymaps then
    return
  end
  local actions = { accept = M.accept, accept_word = M.accept_word, accept_line = M.accept_line, dismiss = M.dismiss }
  for name, action in pairs(actions) do
    local lhs = keymaps[name]
    if lhs then
      -- Without a suggestion the key does what it would have done (a Tab inserts a tab).
      local fallback = vim.keycode(lhs)
      vim.keymap.set('i', lhs, function()
        if not action() then
          vim.api.nvim_feedkeys(fallback, 'n', false)
        end
      end, { desc = 'dgemma: ' .. name:gsub('_', ' ') })
      mapped[#mapped + 1] = lhs
    end
  end
end

--- Registers the server and the plugin's autocmds, keymaps and commands. Calling it again replaces
--- the previous configuration (running clients get the new settings via didChangeConfiguration).
---@param opts table|nil see dgemma.config.defaults
function M.setup(opts)
  local cfg = config.merge(opts)
  M.config = cfg
  ghost.define_highlights()
  -- Assigning (rather than calling vim.lsp.config()) replaces the config: a deep merge would mix
  -- an old, longer `cmd` list into a new one.
  vim.lsp.config[dlsp.name] = {
    cmd = config.command(cfg),
    cmd_env = config.command_env(cfg),
    filetypes = cfg.filetypes,
    root_markers = cfg.root_markers,
    init_options = cfg.settings,
    settings = { dgemma = cfg.settings },
    -- Deep-merged into Neovim's own capabilities: says the plugin answers `dgemma/definitions`.
    capabilities = { experimental = { dgemmaDefinitions = cfg.editor_definitions ~= false } },
    handlers = {
      ['dgemma/draft'] = inline.on_draft,
      ['dgemma/status'] = on_status,
      ['dgemma/definitions'] = definitions.handle,
    },
  }
  vim.lsp.enable(dlsp.name)
  inline.setup(cfg)
  set_keymaps(cfg.keymaps)
  nextedit.setup(cfg)
  for _, client in ipairs(vim.lsp.get_clients({ name = dlsp.name })) do
    client.settings = { dgemma = cfg.settings }
    client:notify('workspace/didChangeConfiguration', { settings = client.settings })
  end

  vim.api.nvim_create_user_command('DGemmaRewrite', function(args)
    M.rewrite(args.line1, args.line2)
  end, { range = true, force = true, desc = 'dgemma: rewrite the selection' })
end

return M
