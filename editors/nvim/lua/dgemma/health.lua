--- `:checkhealth dgemma`: Neovim features, the server command and its version, and the state of
--- running clients (model, device, status). Reads state; changes nothing.
local M = {}

function M.check()
  local health = vim.health
  local dgemma = require('dgemma')
  local dlsp = require('dgemma.lsp')

  health.start('Neovim')
  local version = vim.version()
  local version_text = ('%d.%d.%d'):format(version.major, version.minor, version.patch)
  if vim.fn.has('nvim-0.11') == 1 then
    health.ok('Neovim ' .. version_text .. ' (vim.lsp.config / vim.lsp.enable)')
  else
    health.error('Neovim ' .. version_text .. ': dgemma needs 0.11 or newer')
  end
  if vim.lsp.inline_completion then
    health.ok('vim.lsp.inline_completion present: final results use the built-in')
  else
    health.info('vim.lsp.inline_completion absent (Neovim < 0.12): the plugin requests and draws completions itself')
  end

  health.start('dgemma-lsp')
  local config = dgemma.config
  if not config then
    health.warn("setup() not called", { "add require('dgemma').setup{} to your config" })
    return
  end
  local executable = config.cmd[1]
  local path = vim.fn.exepath(executable)
  if path == '' then
    health.error(('server command not found: %s'):format(executable),
      { 'install it (pip install dgemma-lsp) or set cmd in setup{}' })
  else
    health.ok(('server command: %s'):format(path))
    local result = vim.system({ path, '--version' }, { text = true }):wait(10000)
    if result.code == 0 then
      health.ok('version: ' .. vim.trim(result.stdout or ''))
    else
      health.warn(('`%s --version` exited with %s'):format(executable, tostring(result.code)))
    end
  end
  health.info('settings: ' .. vim.inspect(config.settings, { newline = ' ', indent = '' }))

  local clients = vim.lsp.get_clients({ name = dlsp.name })
  if #clients == 0 then
    health.info('no client running (it starts when a buffer of a configured filetype opens)')
  end
  for _, client in ipairs(clients) do
    local info = client.server_info or {}
    health.ok(('client %d: %s %s, position encoding %s'):format(
      client.id, info.name or '?', info.version or '', client.offset_encoding))
    local status = dgemma.status_of(client.id)
    if not status then
      health.info('model status: none reported yet')
    elseif status.state == 'error' then
      health.error(('model %s: %s'):format(tostring(status.model), tostring(status.message)))
    else
      local device = (status.device or '') ~= '' and (' on ' .. status.device) or ''
      local message = (status.message or '') ~= '' and (' (' .. status.message .. ')') or ''
      health.ok(('model %s%s: %s%s'):format(tostring(status.model), device, tostring(status.state), message))
    end
  end
end

return M
