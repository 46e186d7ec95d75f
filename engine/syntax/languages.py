"""Which tree-sitter grammar serves a document, and the few facts per grammar the planner needs.

Owns the normalized language ids (python, javascript, typescript, tsx, go, rust, c,
cpp, java, lua, plaintext), the mapping from LSP language ids / file extensions to
them, cached parsers built from the tree-sitter org's grammar wheels, and small
per-grammar tables (which node types hold statements, which are imports or
definitions). Knows nothing of documents, cursors, tokens or LSP.
"""

from __future__ import annotations

import functools
import os
import threading

import tree_sitter

LANGUAGES = ("python", "javascript", "typescript", "tsx", "go", "rust", "c", "cpp", "java", "lua")
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
}


def normalize_language(lsp_language_id_or_name: str) -> str:
    """The normalized id for an LSP language id or a common name; `plaintext` when unsupported."""
    key = (lsp_language_id_or_name or "").strip().lower()
    return _ALIASES.get(key, PLAINTEXT)


def language_for_path(path: str) -> str:
    """The normalized id for a file path, by its extension; `plaintext` when unknown."""
    _, ext = os.path.splitext(path)
    return _EXTENSIONS.get(ext.lower(), PLAINTEXT)


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
}
BLOCK_TYPES["tsx"] = BLOCK_TYPES["typescript"]

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
}

BODY_FIELDS = ("body", "consequence", "alternative")
"""Field names under which grammars hang a definition's or statement's body."""


def uses_braces(language: str) -> bool:
    """Whether blocks are delimited by `{ }` (everything here but Python and Lua)."""
    return language not in ("python", "lua", PLAINTEXT)
