--- Headless end-to-end scenarios of the dgemma plugin against the real server (tiny model).
--- Run: nvim --headless -u NONE -i NONE -c 'luafile editors/nvim/tests/scenarios.lua'
--- Environment: DGEMMA_NVIM_CMD (JSON list: the server command), DGEMMA_NVIM_PYLSP (JSON list: pylsp,
--- a second language server for the editor_definitions scenario), DGEMMA_NVIM_WORKDIR (a scratch
--- folder), DGEMMA_NVIM_TIMEOUT_S (global timeout, default 240), DGEMMA_NVIM_ONLY (one scenario),
--- DGEMMA_NVIM_BUILTIN=0 (0.12 without vim.lsp.inline_completion), DGEMMA_NVIM_WAIT_MS (longest wait for one
--- answer, default 30000: more on a machine shared with others).
--- Keys are typed with nvim_input, so mappings, autocmds and insert mode behave as for a user. The
--- tiny model writes random text: the checks are about behaviour (ghost text appears and changes,
--- the buffer equals before + accepted part + after), never about wording.
--- Output on stdout, one line per scenario ("ok NAME" / "FAIL NAME: why"), then "PASS"; a failure
--- or the global timeout ends with `cquit 1`.
local repo = vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h:h:h:h')
vim.opt.rtp:prepend(repo .. '/editors/nvim')
vim.o.swapfile = false
vim.cmd('filetype plugin indent on') -- as in any user config; -u NONE leaves it off
vim.o.shortmess = vim.o.shortmess .. 'F'

local api = vim.api
local cmd = vim.json.decode((assert(os.getenv('DGEMMA_NVIM_CMD'), 'DGEMMA_NVIM_CMD is not set')))
local workdir = (assert(os.getenv('DGEMMA_NVIM_WORKDIR'), 'DGEMMA_NVIM_WORKDIR is not set'))
local timeout_s = tonumber(os.getenv('DGEMMA_NVIM_TIMEOUT_S') or '240')
local only = os.getenv('DGEMMA_NVIM_ONLY')
-- DGEMMA_NVIM_BUILTIN=0 runs 0.12 on the plugin's own request path (builtin_inline_completion = false).
local use_builtin = vim.lsp.inline_completion ~= nil and os.getenv('DGEMMA_NVIM_BUILTIN') ~= '0'
if only == '' then
  only = nil
end
local WAIT_MS = tonumber(os.getenv('DGEMMA_NVIM_WAIT_MS') or '30000') -- one suggestion takes well under a second; CI machines are slow

local function out(line)
  io.stdout:write(line .. '\n')
  io.stdout:flush()
end

local finished = false
local function finish(ok, message)
  if finished then
    return
  end
  finished = true
  if message then
    out(message)
  end
  if ok then
    out('PASS')
    vim.cmd('qall!')
  else
    vim.cmd('cquit 1')
  end
end

local global_timer = assert(vim.uv.new_timer())
global_timer:start(timeout_s * 1000, 0, vim.schedule_wrap(function()
  finish(false, ('FAIL global timeout after %d s'):format(timeout_s))
end))

-- The scenarios run in a coroutine: waiting yields to the event loop, so typed keys, LSP messages
-- and timers are processed exactly as in an interactive session.
local runner
local function resume()
  local ok, err = coroutine.resume(runner)
  if not ok then
    finish(false, 'FAIL ' .. tostring(err) .. '\n' .. debug.traceback(runner))
  end
end

local function sleep(ms)
  vim.defer_fn(resume, ms)
  coroutine.yield()
end

---@param what string
---@param condition fun(): any
---@param ms? integer
local function wait_for(what, condition, ms)
  local deadline = vim.uv.now() + (ms or WAIT_MS)
  while true do
    local value = condition()
    if value then
      return value
    end
    if vim.uv.now() > deadline then
      error('timed out waiting for ' .. what, 2)
    end
    sleep(10)
  end
end

local function check(condition, message, ...)
  if not condition then
    error(message:format(...), 2)
  end
end

local function type_keys(keys)
  api.nvim_input(keys)
  sleep(1) -- nvim_input only queues; let the loop take the keys
end

local function buffer_text()
  return table.concat(api.nvim_buf_get_lines(0, 0, -1, false), '\n')
end

local function namespace(name)
  return api.nvim_get_namespaces()[name]
end

--- Ghost text currently drawn by the plugin or by Neovim's built-in inline completion, as
--- {row, col, text, source, hl} — read back from the extmarks, as a user would see it.
local function ghost()
  for _, source in ipairs({ 'dgemma.ghost', 'nvim.lsp.inline_completion' }) do
    local ns = namespace(source)
    if ns then
      for _, mark in ipairs(api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })) do
        local details = mark[4]
        local lines, hl = {}, nil
        local first = {}
        for _, chunk in ipairs(details.virt_text or {}) do
          first[#first + 1] = chunk[1]
          hl = hl or chunk[2]
        end
        lines[1] = table.concat(first)
        for _, virt_line in ipairs(details.virt_lines or {}) do
          local parts = {}
          for _, chunk in ipairs(virt_line) do
            parts[#parts + 1] = chunk[1]
          end
          lines[#lines + 1] = table.concat(parts)
        end
        return { row = mark[2], col = mark[3], text = table.concat(lines, '\n'), source = source, hl = hl }
      end
    end
  end
end

--- Text as ghost text shows it: Neovim draws control and other unprintable characters in virtual
--- text as ^X or <xx> (tabs stay), so a random model's answer is compared in that form. (A NUL
--- is dropped here only so that strtrans can take the string: the plugin never inserts one.)
local function display(text)
  return (text:gsub('%z', ''):gsub('[^\t\n]+', vim.fn.strtrans))
end

--- What was inserted at the ghost text's position: checks that the text before and after it is
--- untouched and returns the (raw) inserted piece.
local function inserted_piece(lines, g, now)
  local line = lines[g.row + 1]
  local head = table.concat(vim.list_slice(lines, 1, g.row), '\n') .. (g.row > 0 and '\n' or '') .. line:sub(1, g.col)
  local tail = line:sub(g.col + 1) .. (g.row + 1 < #lines and '\n' or '') .. table.concat(vim.list_slice(lines, g.row + 2), '\n')
  check(#now >= #head + #tail and vim.startswith(now, head) and vim.endswith(now, tail),
    'the text around the cursor changed:\n%s', now)
  local piece = now:sub(#head + 1, #now - #tail)
  check(not piece:find('%z'), 'a NUL character reached the buffer: %q', piece)
  return piece
end

local function in_insert_mode()
  return api.nvim_get_mode().mode == 'i'
end

local function client()
  return vim.lsp.get_clients({ bufnr = 0, name = 'dgemma' })[1]
end

--- Types `keys` at the end of the buffer's last line and waits for a non-empty final suggestion:
--- the built-in's on 0.12, the plugin's own on 0.11. A random model sometimes offers nothing at a
--- spot: then one more character is typed, a few times.
local function suggestion_with_retries(keys)
  local builtin = use_builtin
  for attempt = 1, 5 do
    type_keys('<Esc>')
    wait_for('normal mode', function() return api.nvim_get_mode().mode == 'n' end)
    type_keys('GA' .. (attempt == 1 and keys or 'x'))
    wait_for('insert mode', in_insert_mode)
    local ok, found = pcall(wait_for, 'a final suggestion', function()
      local g = ghost()
      if g and g.text ~= '' and (builtin and g.source == 'nvim.lsp.inline_completion'
          or not builtin and g.hl == 'DGemmaGhost') then
        return g
      end
    end, attempt < 5 and 10000 or WAIT_MS)
    if ok then
      return found
    end
  end
  error('no suggestion after 5 tries', 2)
end

local function word_class(char)
  if char:match('[%w_]') then
    return 'word'
  elseif char:match('%s') then
    return 'space'
  end
  return 'punct'
end

--- Waits until the buffer differs from `before` and returns the new text.
local function changed_from(before)
  return wait_for('the buffer to change', function()
    local now = buffer_text()
    return now ~= before and now
  end)
end

local scenarios = {}

scenarios[#scenarios + 1] = { 'setup_attaches', function()
  local dgemma = require('dgemma')
  -- setup() twice: the second call replaces the first; one client, one set of keymaps.
  dgemma.setup({ cmd = { 'false' }, keymaps = { accept = '<F2>' } })
  dgemma.setup({
    cmd = cmd,
    filetypes = { 'python' },
    settings = { drafts = true, steps = 8, maxTokens = 32, nextEditDebounceMs = 0, nextEditStrength = 0.6 },
    builtin_inline_completion = use_builtin,
    next_edit = { debounce_ms = 50 },
  })
  vim.cmd.edit(vim.fn.fnameescape(workdir .. '/sample.py'))
  check(vim.bo.filetype == 'python', 'filetype is %s', vim.bo.filetype)
  -- A user who starts typing at once: these keys go in while the client is still starting.
  local before = buffer_text()
  type_keys('GA<CR>count = ')
  wait_for('insert mode', in_insert_mode)
  local early = client()
  check(not (early and early.initialized), 'the client was ready before the first keystroke')
  local c = wait_for('the dgemma client to initialize', function()
    local it = client()
    return it and it.initialized and it
  end)
  -- No key after the client is ready: what was typed before must still get a suggestion.
  local g = wait_for('a suggestion for what was typed before the client was ready', function()
    local shown = ghost()
    return shown and shown.text ~= '' and shown
  end)
  out(('  typed before ready, then answered with %q (%s)'):format(g.text, g.source))
  type_keys('<Esc>')
  wait_for('normal mode', function() return api.nvim_get_mode().mode == 'n' end)
  api.nvim_buf_set_lines(0, 0, -1, false, vim.split(before, '\n', { plain = true }))
  check(#vim.lsp.get_clients({ name = 'dgemma' }) == 1, 'expected one dgemma client')
  check(c.config.cmd[1] == cmd[1], 'the second setup() did not replace cmd')
  check(vim.fn.maparg('<F2>', 'i') == '', 'the first setup()\'s keymap survived the second')
  check(vim.fn.maparg('<Tab>', 'i') ~= '', 'default <Tab> keymap missing')
  out('  server ' .. vim.inspect(c.server_info) .. ', offset encoding ' .. c.offset_encoding)
end }

scenarios[#scenarios + 1] = { 'drafts_appear_and_change', function()
  -- Every draft notification is observed right after the plugin handled it: what it drew.
  local c = assert(client())
  local seen, texts = {}, {}
  local handle = c.handlers['dgemma/draft'] or vim.lsp.handlers['dgemma/draft']
  check(handle ~= nil, 'no dgemma/draft handler registered')
  c.handlers['dgemma/draft'] = function(...)
    handle(...)
    local g = ghost()
    if g and g.source == 'dgemma.ghost' and g.hl == 'DGemmaDraft' then
      seen[#seen + 1] = g
      if not vim.tbl_contains(texts, g.text) then
        texts[#texts + 1] = g.text
      end
    end
  end
  type_keys('GA<CR>def add(a, b):<CR>')
  wait_for('insert mode', in_insert_mode)
  for _, key in ipairs({ 'r', 'e', 't', 'u', 'r', 'n', ' ', 'a' }) do
    type_keys(key)
    sleep(60)
  end
  wait_for('draft ghost text that changes', function() return #texts >= 2 end)
  c.handlers['dgemma/draft'] = handle
  local cursor = api.nvim_win_get_cursor(0)
  local last = seen[#seen]
  check(last.row <= cursor[1] - 1, 'draft drawn below the cursor line')
  out(('  %d drafts drawn, %d distinct texts'):format(#seen, #texts))
end }

scenarios[#scenarios + 1] = { 'accept_all_with_tab', function()
  local g = suggestion_with_retries(' + ')
  local lines = api.nvim_buf_get_lines(0, 0, -1, false)
  local cursor = api.nvim_win_get_cursor(0)
  check(g.row == cursor[1] - 1 and g.col == cursor[2], 'ghost text is not at the cursor')
  type_keys('<Tab>')
  local piece = inserted_piece(lines, g, changed_from(table.concat(lines, '\n')))
  check(display(piece) == g.text, 'inserted %q, the ghost text showed %q', piece, g.text)
  local inserted = vim.split(piece, '\n', { plain = true })
  local end_row = g.row + #inserted
  local end_col = (#inserted == 1 and g.col or 0) + #inserted[#inserted]
  local after = api.nvim_win_get_cursor(0)
  check(after[1] == end_row and after[2] == end_col, 'cursor at %d:%d, expected %d:%d', after[1], after[2], end_row, end_col)
  check(in_insert_mode(), 'left insert mode')
  check(ghost() == nil or ghost().text ~= g.text, 'the accepted suggestion is still shown')
end }

--- Checks a partial accept: a non-empty prefix of the suggestion went in at the cursor, and what
--- is left is shown right away for the next accept. Returns the accepted piece and the rest.
local function check_partial(g, lines, piece)
  check(#piece > 0 and vim.startswith(g.text, display(piece)), 'accepted %q is not a prefix of %q', piece, g.text)
  local rest = ''
  if display(piece) ~= g.text then
    local shown = ghost()
    check(shown and display(piece) .. shown.text == g.text, 'the rest of %q is not shown after accepting %q: %s',
      g.text, piece, vim.inspect(shown))
    rest = shown.text
  end
  return rest
end

scenarios[#scenarios + 1] = { 'accept_word', function()
  local g = suggestion_with_retries('<CR>value = add(1, ')
  local lines = api.nvim_buf_get_lines(0, 0, -1, false)
  type_keys('<M-Right>')
  local piece = inserted_piece(lines, g, changed_from(table.concat(lines, '\n')))
  local rest = check_partial(g, lines, piece)
  -- The piece ends at a word boundary: the next character is of another kind (word, space,
  -- punctuation), or the piece took a line break.
  if rest ~= '' then
    check(word_class(piece:sub(-1)) ~= word_class(rest:sub(1, 1)) or piece:find('\n'),
      'accepted %q stops inside a word of %q', piece, g.text)
  end
  out(('  accepted %q of %q'):format(piece, g.text))
end }

scenarios[#scenarios + 1] = { 'accept_line', function()
  local g = suggestion_with_retries('<CR>total = add(2, ')
  local lines = api.nvim_buf_get_lines(0, 0, -1, false)
  check(require('dgemma').accept_line(), 'accept_line() found nothing to accept')
  local piece = inserted_piece(lines, g, changed_from(table.concat(lines, '\n')))
  local rest = check_partial(g, lines, piece)
  check(rest == '' or rest:sub(1, 1) == '\n', 'accepted %q does not end at a line end of %q', piece, g.text)
  check(select(2, piece:gsub('\n', '')) <= 1, 'accepted more than one line: %q', piece)
  out(('  accepted %q of %q'):format(piece, g.text))
end }

scenarios[#scenarios + 1] = { 'dismiss', function()
  suggestion_with_retries('<CR>print(add(3, ')
  local before = buffer_text()
  type_keys('<C-]>')
  wait_for('the ghost text to go', function() return ghost() == nil end)
  check(buffer_text() == before, 'dismiss changed the buffer')
  check(in_insert_mode(), 'left insert mode')
  -- With nothing to accept, <Tab> does what it always did: indent.
  local lines = api.nvim_buf_get_lines(0, 0, -1, false)
  local cursor = api.nvim_win_get_cursor(0)
  type_keys('<Tab>')
  local piece = inserted_piece(lines, { row = cursor[1] - 1, col = cursor[2] }, changed_from(before))
  check(piece:match('^[ \t]+$'), '<Tab> without a suggestion inserted %q', piece)
end }

scenarios[#scenarios + 1] = { 'non_ascii_line', function()
  -- Multi-byte characters before the cursor: positions must go through the negotiated encoding.
  local g = suggestion_with_retries('<CR>greeting = "héllo wörld ✓" + ')
  local cursor = api.nvim_win_get_cursor(0)
  check(g.row == cursor[1] - 1 and g.col == cursor[2], 'ghost text at %d:%d, cursor at %d:%d',
    g.row, g.col, cursor[1] - 1, cursor[2])
  local lines = api.nvim_buf_get_lines(0, 0, -1, false)
  check(require('dgemma').accept(), 'accept() found nothing to accept')
  local piece = inserted_piece(lines, g, changed_from(table.concat(lines, '\n')))
  check(display(piece) == g.text, 'inserted %q, the ghost text showed %q', piece, g.text)
end }

scenarios[#scenarios + 1] = { 'rewrite_visual_selection', function()
  type_keys('<Esc>')
  wait_for('normal mode', function() return api.nvim_get_mode().mode == 'n' end)
  api.nvim_buf_set_lines(0, 0, -1, false, {
    'def scale(values, factor):',
    '    result = [v * factor for v in values]',
    '    return result',
    '',
    'print(scale([1, 2, 3], 2))',
  })
  local before = buffer_text()
  -- Select from "[v" on line 2 to the end of "return" on line 3, characterwise, and rewrite it.
  api.nvim_win_set_cursor(0, { 2, 13 })
  type_keys('vj0we:DGemmaRewrite<CR>')
  local now = changed_from(before)
  local head = 'def scale(values, factor):\n    result = '
  local tail = ' result\n\nprint(scale([1, 2, 3], 2))'
  check(vim.startswith(now, head), 'text before the selection changed:\n%s', now)
  check(vim.endswith(now, tail), 'text after the selection changed:\n%s', now)
  out(('  rewrote to %q'):format(now:sub(#head + 1, #now - #tail)))
end }

--- The next edit drawn in the buffer, read back from its extmarks: {deleted = {row, col, end_row,
--- end_col} or nil, inserted = {row, col, text} or nil}.
local function next_edit_marks()
  local ns = namespace('dgemma.nextedit')
  local found = {}
  for _, mark in ipairs(ns and api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true }) or {}) do
    local details = mark[4]
    if details.hl_group == 'DGemmaNextEditDelete' then
      found.deleted = { mark[2], mark[3], details.end_row, details.end_col }
    elseif details.virt_text then
      local lines = { details.virt_text[1][1] }
      for _, virt_line in ipairs(details.virt_lines or {}) do
        lines[#lines + 1] = virt_line[1][1]
      end
      found.inserted = { mark[2], mark[3], table.concat(lines, '\n') }
    end
  end
  return (found.deleted or found.inserted) and found or nil
end

local NEXT_EDIT_SOURCE = {
  'def load(path, mode):',
  '    """Read the file at path."""',
  '    with open(path, mode) as handle:',
  '        return handle.read()',
}

--- Renames the parameter in normal mode (`ciw`) and waits for a next edit; a random model
--- sometimes proposes none (or one the server filters): then another name, a few times.
local function next_edit_with_retries()
  type_keys('<Esc>')
  wait_for('normal mode', function() return api.nvim_get_mode().mode == 'n' end)
  api.nvim_buf_set_lines(0, 0, -1, false, NEXT_EDIT_SOURCE)
  for attempt, name in ipairs({ 'filename', 'source', 'where', 'origin', 'target' }) do
    api.nvim_win_set_cursor(0, { 1, 9 })
    type_keys('ciw' .. name .. '<Esc>')
    local ok, edit = pcall(wait_for, 'a next edit', function() return require('dgemma').next_edit() end,
      attempt < 5 and 20000 or WAIT_MS)
    if ok then
      return edit
    end
  end
  error('no next edit after 5 tries', 2)
end

local function byte_offset(lines, row, col)
  local offset = col
  for i = 1, row do
    offset = offset + #lines[i] + 1
  end
  return offset
end

scenarios[#scenarios + 1] = { 'next_edit_jump_and_apply', function()
  local edit = next_edit_with_retries()
  local marks = next_edit_marks()
  check(marks ~= nil, 'a next edit is known but nothing is drawn')
  if edit.row ~= edit.end_row or edit.col ~= edit.end_col then
    check(vim.deep_equal(marks.deleted, { edit.row, edit.col, edit.end_row, edit.end_col }),
      'the deletion is highlighted at %s, the edit replaces %s', vim.inspect(marks.deleted), vim.inspect(edit))
  end
  if edit.text ~= '' then
    check(marks.inserted and marks.inserted[1] == edit.end_row and marks.inserted[2] == edit.end_col
      and marks.inserted[3] == edit.text, 'the insertion is drawn as %s, the edit inserts %q',
      vim.inspect(marks.inserted), edit.text)
  end
  local lines = api.nvim_buf_get_lines(0, 0, -1, false)
  local before = table.concat(lines, '\n')
  local expected = before:sub(1, byte_offset(lines, edit.row, edit.col)) .. edit.text
    .. before:sub(byte_offset(lines, edit.end_row, edit.end_col) + 1)
  -- Away from the edit, the first <Tab> jumps to it and changes nothing.
  api.nvim_win_set_cursor(0, { edit.row == 3 and 1 or 4, 0 })
  type_keys('<Tab>')
  wait_for('the cursor at the edit', function()
    local cursor = api.nvim_win_get_cursor(0)
    return cursor[1] - 1 == edit.row and cursor[2] == edit.col
  end)
  check(buffer_text() == before, 'the first <Tab> changed the buffer')
  type_keys('<Tab>')
  local now = changed_from(before)
  check(now == expected, 'applied:\n%s\nexpected:\n%s', now, expected)
  check(require('dgemma').next_edit() == nil or require('dgemma').next_edit() ~= edit, 'the applied edit is still shown')
  out(('  replaced %d:%d-%d:%d with %q'):format(edit.row, edit.col, edit.end_row, edit.end_col, edit.text))
end }

scenarios[#scenarios + 1] = { 'next_edit_dismiss', function()
  next_edit_with_retries()
  local before = buffer_text()
  type_keys('<Esc>')
  wait_for('the next edit to go', function() return next_edit_marks() == nil end)
  check(require('dgemma').next_edit() == nil, 'a dismissed edit is still current')
  check(buffer_text() == before, 'dismissing changed the buffer')
  check(api.nvim_get_mode().mode == 'n', 'left normal mode')
end }

--- Sends `method` with the client's own request (not request_sync: the server's requests to the
--- plugin must keep flowing while this waits) and returns its result.
local function request(c, method, params, bufnr)
  local done, answer = false, nil
  c:request(method, params, function(err, result)
    check(not err, '%s failed: %s', method, vim.inspect(err))
    done, answer = true, result
  end, bufnr)
  wait_for(method, function() return done end)
  return answer
end

scenarios[#scenarios + 1] = { 'editor_definitions', function()
  -- A second, real language server (pylsp) beside dgemma-lsp on a file that calls into a vendored
  -- module: the workspace index skips vendor/, so the definition of `charge` can reach the prompt
  -- only through the plugin's answer to `dgemma/definitions` (asked of pylsp, never of dgemma).
  local pylsp = vim.json.decode((assert(os.getenv('DGEMMA_NVIM_PYLSP'), 'DGEMMA_NVIM_PYLSP is not set')))
  type_keys('<Esc>')
  wait_for('normal mode', function() return api.nvim_get_mode().mode == 'n' end)
  vim.fn.mkdir(workdir .. '/vendor', 'p')
  vim.fn.writefile({}, workdir .. '/vendor/__init__.py')
  vim.fn.writefile({ '"""A vendored payments client."""', '', '',
    'def charge(invoice, currency="EUR"):', '    """Charge the invoice."""', '    return {"id": 1}' },
    workdir .. '/vendor/payments.py')
  vim.fn.writefile({ 'from vendor.payments import charge', '', '', 'def bill(invoice):',
    '    receipt = charge(invoice)' }, workdir .. '/report.py')
  vim.cmd.edit(vim.fn.fnameescape(workdir .. '/report.py'))
  local bufnr = api.nvim_get_current_buf()
  local other = vim.lsp.start({ name = 'pylsp', cmd = pylsp, root_dir = workdir }, { bufnr = bufnr })
  check(other, 'pylsp did not start')
  local c = wait_for('dgemma on report.py', function()
    local it = vim.lsp.get_clients({ bufnr = bufnr, name = 'dgemma' })[1]
    return it and it.initialized and it
  end)
  wait_for('pylsp to initialize', function()
    local it = vim.lsp.get_client_by_id(other)
    return it and it.initialized
  end)
  type_keys('GA<CR>    total = ')
  wait_for('insert mode', in_insert_mode)
  local uri = vim.uri_from_bufnr(bufnr)
  local deadline = vim.uv.now() + 2 * WAIT_MS
  local snippets, found
  while not found do
    check(vim.uv.now() < deadline, 'no snippet from the editor in the prompt: %s', vim.inspect(snippets))
    -- A keystroke, as a user goes on typing: an answer that came after the previous prompt serves the
    -- next one (a repeated request at the same text would be answered from the completion cache).
    type_keys('x')
    local cursor = api.nvim_win_get_cursor(0)
    local character = require('dgemma.lsp').character(bufnr, cursor[1] - 1, cursor[2], c.offset_encoding)
    request(c, 'textDocument/inlineCompletion', { textDocument = { uri = uri },
      position = { line = cursor[1] - 1, character = character }, context = { triggerKind = 1 } }, bufnr)
    snippets = request(c, 'workspace/executeCommand', { command = 'dgemma.contextSnippets', arguments = { uri } }, bufnr)
    for _, snippet in ipairs(snippets or {}) do
      if snippet.source == 'editor' and snippet.text:find('charge', 1, true) then
        found = snippet
      end
    end
    if not found then
      sleep(300)
    end
  end
  check(found.path == 'vendor/payments.py', 'editor snippet from %s', found.path)
  check(found.text == 'def charge(invoice, currency="EUR"):', 'editor snippet %q', found.text)
  check(found.startLine == 3, 'editor snippet at line %s', tostring(found.startLine))
  for _, snippet in ipairs(snippets) do
    check(snippet.path ~= 'report.py', 'a snippet of the file the window shows: %s', vim.inspect(snippet))
  end
  out(('  %s:%d from pylsp: %q'):format(found.path, found.startLine + 1, found.text))
  type_keys('<Esc>')
  local pylsp_client = vim.lsp.get_client_by_id(other)
  if pylsp_client then
    pylsp_client:stop(true)
  end
end }

scenarios[#scenarios + 1] = { 'checkhealth', function()
  vim.cmd('checkhealth dgemma')
  local report = buffer_text()
  vim.cmd('bwipeout!')
  check(report:find('OK', 1, true), 'no OK line in checkhealth:\n%s', report)
  check(not report:find('ERROR', 1, true), 'checkhealth reports an error:\n%s', report)
  check(report:find('server command', 1, true), 'checkhealth does not name the server command:\n%s', report)
end }

runner = coroutine.create(function()
  out(('nvim %s'):format(tostring(vim.version())))
  for _, scenario in ipairs(scenarios) do
    local name, run = scenario[1], scenario[2]
    if not only or name == only or name == 'setup_attaches' then
      local started = vim.uv.hrtime()
      local ok, err = pcall(run)
      if not ok then
        out(('FAIL %s: %s'):format(name, tostring(err)))
        out('  buffer:\n' .. buffer_text())
        out('  ghost: ' .. vim.inspect(ghost()))
        finish(false)
        return
      end
      out(('ok %s (%.1f s)'):format(name, (vim.uv.hrtime() - started) / 1e9))
    end
  end
  finish(true)
end)

vim.schedule(resume)
