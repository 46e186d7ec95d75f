"""Which tree-sitter grammar serves a document, and the few facts per grammar the planner needs.

Owns the normalized language ids (python, javascript, typescript, tsx, go, rust, c,
cpp, java, lua, csharp, ruby, php, kotlin, swift, bash, scala, json, yaml, toml, html,
css, plaintext), the mapping from LSP language ids / file extensions to them, cached
parsers built from the published grammar wheels, and small per-grammar tables (which
node types hold statements, which are imports or definitions). Knows nothing of
documents, cursors, tokens or LSP.

Grammars come from the single-language wheels on PyPI (`tree-sitter-python`,
`tree-sitter-c-sharp`, ...), one dependency per language, not from
`tree-sitter-language-pack`: the pack's 1.x downloads its grammars at run time, which
fails on a machine with no internet and puts a network fetch on a keystroke's path,
while a wheel carries its compiled grammar and loads offline. The wheels chosen load
under tree-sitter 0.25/0.26 (language ABI 14 or 15). PHP's wheel has two grammars and
we take `language_php_only` (PHP code, `<?php` tag optional), not `language_php` (HTML
with PHP islands): a bounded reparse parses a region of the file on its own, and to the
HTML grammar a region without its `<?php` is text. Pure-PHP files (classes, scripts)
parse the same; an HTML template with PHP in it parses with errors. Kotlin's is the tree-sitter-grammars 1.x grammar; Swift's is alex-pinkus's.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading

import tree_sitter

LANGUAGES = ("python", "javascript", "typescript", "tsx", "go", "rust", "c", "cpp", "java", "lua",
             "csharp", "ruby", "php", "kotlin", "swift", "bash", "scala",
             "json", "yaml", "toml", "html", "css")
"""Languages with a grammar. Anything else is `plaintext`."""

PLAINTEXT = "plaintext"

_ALIASES = {
    # LSP language identifiers (the spec's table) and common names.
    "python": "python", "py": "python", "python3": "python",
    "javascript": "javascript", "js": "javascript", "javascriptreact": "javascript", "jsx": "javascript",
    "node": "javascript", "mjs": "javascript", "cjs": "javascript",
    "typescript": "typescript", "ts": "typescript",
    "typescriptreact": "tsx", "tsx": "tsx",
    "go": "go", "golang": "go",
    "rust": "rust", "rs": "rust",
    "c": "c",
    "cpp": "cpp", "c++": "cpp", "cxx": "cpp", "cuda-cpp": "cpp", "cuda": "cpp",
    "java": "java",
    "lua": "lua",
    "csharp": "csharp", "c#": "csharp", "cs": "csharp",
    "ruby": "ruby", "rb": "ruby",
    "php": "php",
    "kotlin": "kotlin", "kt": "kotlin", "kts": "kotlin",
    "swift": "swift",
    "shellscript": "bash", "bash": "bash", "sh": "bash", "shell": "bash", "zsh": "bash",
    "scala": "scala", "sbt": "scala",
    # jsonc: the JSON grammar takes comments; json5/jsonl are not JSON enough to parse as it.
    "json": "json", "jsonc": "json",
    "yaml": "yaml", "yml": "yaml",
    "toml": "toml",
    "html": "html", "htm": "html", "xhtml": "html",
    # scss/less stay plaintext: their nesting and variables are errors to the CSS grammar.
    "css": "css",
}

_EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".pyw": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".c++": "cpp", ".hpp": "cpp", ".hh": "cpp",
    ".hxx": "cpp", ".h++": "cpp", ".ipp": "cpp", ".inl": "cpp", ".cu": "cpp", ".cuh": "cpp",
    ".java": "java",
    ".lua": "lua",
    ".cs": "csharp", ".csx": "csharp",
    ".rb": "ruby", ".rake": "ruby", ".gemspec": "ruby", ".ru": "ruby",
    ".php": "php", ".phtml": "php",
    ".kt": "kotlin", ".kts": "kotlin",
    ".swift": "swift",
    ".sh": "bash", ".bash": "bash", ".zsh": "bash", ".ksh": "bash",
    ".scala": "scala", ".sc": "scala", ".sbt": "scala",
    ".json": "json", ".jsonc": "json",
    ".yaml": "yaml", ".yml": "yaml",
    ".toml": "toml",
    ".html": "html", ".htm": "html", ".xhtml": "html",
    ".css": "css",
}


def normalize_language(lsp_language_id_or_name: str) -> str:
    """The normalized id for an LSP language id or a common name; `plaintext` when unsupported."""
    key = (lsp_language_id_or_name or "").strip().lower()
    return _ALIASES.get(key, PLAINTEXT)


def language_for_path(path: str) -> str:
    """The normalized id for a file path, by its extension; `plaintext` when unknown."""
    _, ext = os.path.splitext(path)
    return _EXTENSIONS.get(ext.lower(), PLAINTEXT)


_WHEEL_MODULES = {
    "csharp": "tree_sitter_c_sharp", "ruby": "tree_sitter_ruby", "kotlin": "tree_sitter_kotlin",
    "swift": "tree_sitter_swift", "bash": "tree_sitter_bash", "scala": "tree_sitter_scala",
    "json": "tree_sitter_json", "yaml": "tree_sitter_yaml", "toml": "tree_sitter_toml",
    "html": "tree_sitter_html", "css": "tree_sitter_css",
}
"""Grammar wheels whose module has the one `language()` function."""


@functools.cache
def grammar_for(language: str) -> tree_sitter.Language | None:
    """The tree-sitter Language of a normalized id, or None for plaintext. Imported lazily."""
    if language == "python":
        import tree_sitter_python as grammar
    elif language == "javascript":
        import tree_sitter_javascript as grammar
    elif language in ("typescript", "tsx"):
        import tree_sitter_typescript as ts_grammar

        raw = ts_grammar.language_tsx() if language == "tsx" else ts_grammar.language_typescript()
        return tree_sitter.Language(raw)
    elif language == "go":
        import tree_sitter_go as grammar
    elif language == "rust":
        import tree_sitter_rust as grammar
    elif language == "c":
        import tree_sitter_c as grammar
    elif language == "cpp":
        import tree_sitter_cpp as grammar
    elif language == "java":
        import tree_sitter_java as grammar
    elif language == "lua":
        import tree_sitter_lua as grammar
    elif language == "php":
        import tree_sitter_php as php_grammar

        return tree_sitter.Language(php_grammar.language_php_only())
    elif language in _WHEEL_MODULES:
        grammar = importlib.import_module(_WHEEL_MODULES[language])
    else:
        return None
    return tree_sitter.Language(grammar.language())


class _ParserCache(threading.local):
    """Parsers are stateful and not thread-safe: one cache per thread."""

    def __init__(self) -> None:
        self.parsers: dict[str, tree_sitter.Parser] = {}


_PARSERS = _ParserCache()


def parser_for(language: str) -> tree_sitter.Parser | None:
    """A cached parser for a normalized id (one per thread), or None for plaintext."""
    parser = _PARSERS.parsers.get(language)
    if parser is None:
        grammar = grammar_for(language)
        if grammar is None:
            return None
        parser = tree_sitter.Parser(grammar)
        _PARSERS.parsers[language] = parser
    return parser


# --- Per-grammar node tables -------------------------------------------------------
# Node types whose named children are statements (or members): window cuts and
# "statement" holes live between their children.
_C_LIKE_BLOCKS = frozenset({"translation_unit", "compound_statement", "field_declaration_list",
                            "declaration_list", "enumerator_list", "case_statement"})
BLOCK_TYPES: dict[str, frozenset[str]] = {
    "python": frozenset({"module", "block"}),
    "javascript": frozenset({"program", "statement_block", "class_body", "switch_case", "switch_default"}),
    "typescript": frozenset({"program", "statement_block", "class_body", "switch_case", "switch_default",
                             "interface_body", "object_type", "enum_body"}),
    "go": frozenset({"source_file", "block", "statement_list", "field_declaration_list",
                     "expression_case", "default_case", "type_case", "communication_case"}),
    "rust": frozenset({"source_file", "block", "declaration_list", "field_declaration_list",
                       "match_block", "enum_variant_list"}),
    "c": _C_LIKE_BLOCKS,
    "cpp": _C_LIKE_BLOCKS,
    "java": frozenset({"program", "block", "class_body", "interface_body", "enum_body",
                       "switch_block_statement_group", "constructor_body", "switch_block"}),
    "lua": frozenset({"chunk", "block"}),
    "csharp": frozenset({"compilation_unit", "declaration_list", "block", "switch_body", "switch_section",
                         "enum_member_declaration_list", "accessor_list"}),
    "ruby": frozenset({"program", "body_statement", "then", "else", "begin", "ensure", "block_body", "do"}),
    "php": frozenset({"program", "compound_statement", "declaration_list", "switch_block", "case_statement",
                      "default_statement", "enum_declaration_list"}),
    "kotlin": frozenset({"source_file", "class_body", "block", "lambda_literal", "when_expression",
                         "enum_class_body"}),
    "swift": frozenset({"source_file", "statements", "class_body", "protocol_body", "enum_class_body",
                        "switch_statement"}),
    "bash": frozenset({"program", "compound_statement", "do_group", "if_statement", "elif_clause",
                       "else_clause", "case_item", "subshell"}),
    "scala": frozenset({"compilation_unit", "template_body", "block", "case_block", "indented_block",
                        "case_clause", "enum_body"}),
    # Data and markup: members, items, pairs and elements play the statements' part.
    "json": frozenset({"document", "object", "array"}),
    "yaml": frozenset({"stream", "block_mapping", "block_sequence"}),
    "toml": frozenset({"document", "table", "table_array_element"}),
    "html": frozenset({"document", "element"}),
    "css": frozenset({"stylesheet", "block"}),
}
BLOCK_TYPES["tsx"] = BLOCK_TYPES["typescript"]

BRACE_BODY_TYPES: dict[str, frozenset[str]] = {
    "swift": frozenset({"function_body", "if_statement", "for_statement", "while_statement",
                        "repeat_while_statement", "guard_statement", "do_statement", "catch_block",
                        "lambda_literal", "computed_property", "else"}),
    "kotlin": frozenset({"function_body", "control_structure_body"}),
}
"""Node types whose own `{ }` hold a body although their statements hang one level down (Swift
puts them in `statements`): an auto-closed `{|}` of theirs is a block, not an expression."""

IMPORT_TYPES: dict[str, frozenset[str]] = {
    "python": frozenset({"import_statement", "import_from_statement", "future_import_statement"}),
    "javascript": frozenset({"import_statement"}),
    "typescript": frozenset({"import_statement"}),
    "go": frozenset({"package_clause", "import_declaration"}),
    "rust": frozenset({"use_declaration", "extern_crate_declaration"}),
    "c": frozenset({"preproc_include"}),
    "cpp": frozenset({"preproc_include", "using_declaration"}),
    "java": frozenset({"package_declaration", "import_declaration"}),
    "lua": frozenset(),
    "csharp": frozenset({"using_directive", "extern_alias_directive"}),
    "php": frozenset({"namespace_definition", "namespace_use_declaration"}),
    "kotlin": frozenset({"package_header", "import", "import_list"}),
    "swift": frozenset({"import_declaration"}),
    "scala": frozenset({"package_clause", "import_declaration"}),
    "css": frozenset({"import_statement"}),
}
IMPORT_TYPES["tsx"] = IMPORT_TYPES["typescript"]

_JS_DEFINITIONS = frozenset({"function_declaration", "generator_function_declaration", "class_declaration",
                             "method_definition", "abstract_class_declaration", "interface_declaration",
                             "enum_declaration", "type_alias_declaration", "module", "internal_module"})
DEFINITION_TYPES: dict[str, frozenset[str]] = {
    "python": frozenset({"function_definition", "class_definition", "decorated_definition"}),
    "javascript": _JS_DEFINITIONS,
    "typescript": _JS_DEFINITIONS,
    "tsx": _JS_DEFINITIONS,
    "go": frozenset({"function_declaration", "method_declaration", "type_declaration"}),
    "rust": frozenset({"function_item", "impl_item", "trait_item", "struct_item", "enum_item", "mod_item"}),
    "c": frozenset({"function_definition", "struct_specifier"}),
    "cpp": frozenset({"function_definition", "class_specifier", "struct_specifier", "namespace_definition",
                      "template_declaration"}),
    "java": frozenset({"class_declaration", "interface_declaration", "enum_declaration", "method_declaration",
                       "constructor_declaration", "record_declaration"}),
    "lua": frozenset({"function_declaration"}),
    "csharp": frozenset({"class_declaration", "struct_declaration", "interface_declaration", "enum_declaration",
                         "record_declaration", "method_declaration", "constructor_declaration",
                         "namespace_declaration"}),
    "ruby": frozenset({"method", "singleton_method", "class", "module", "singleton_class"}),
    "php": frozenset({"class_declaration", "interface_declaration", "trait_declaration", "enum_declaration",
                      "function_definition", "method_declaration"}),
    "kotlin": frozenset({"class_declaration", "object_declaration", "function_declaration"}),
    "swift": frozenset({"class_declaration", "protocol_declaration", "function_declaration", "init_declaration"}),
    "bash": frozenset({"function_definition"}),
    "scala": frozenset({"class_definition", "object_definition", "trait_definition", "function_definition",
                        "enum_definition"}),
}

BODY_FIELDS = ("body", "consequence", "alternative")
"""Field names under which grammars hang a definition's or statement's body."""


_NO_BRACE_BLOCKS = frozenset({"python", "lua", "ruby", "yaml", "toml", "html", PLAINTEXT})

INDENT_SCOPED = frozenset({"python", "yaml", PLAINTEXT})
"""Languages whose blocks end where the indentation does (plain text: its fallback's stops): a line
left of a body's indentation is past the body, whatever it says. Elsewhere a closer or a word ends a
block, and a line at column 0 inside one is only a style (C's labels, C++'s `public:`)."""

DATA_LANGUAGES = frozenset({"json", "yaml", "toml"})
"""Languages of values, not statements: a `{|}` there is an object to fill in, never a body."""


def uses_braces(language: str) -> bool:
    """Whether blocks are delimited by `{ }` (Ruby's `{ |x| }` blocks aside, not so in Python, Lua,
    Ruby, YAML, TOML and HTML)."""
    return language not in _NO_BRACE_BLOCKS
