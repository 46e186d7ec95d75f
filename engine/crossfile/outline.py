"""A file's outline: its top-level definitions (and their members) and its imports, read with tree-sitter.

Owns what the prompt may show of another file's definition: its signature with the body
elided, the first line of its docstring or doc comment, and for a data type its fields
(struct, interface, enum: the first lines of its body); a class's (impl's, trait's) members
are definitions of their own under `parent`, so a snippet can show the members that matter.
Owns the per-grammar node types that say so, and the words (identifier parts) each
definition is found by. Imports are kept as written (`ImportRef`); resolve.py turns them
into workspace files. Knows nothing of the workspace, tokens or LSP; lines are 0-based.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import msgspec
import tree_sitter

from ..syntax.document import parse_in_chunks
from ..syntax.languages import parser_for

MAX_SIGNATURE_LINES = 3
"""A longer signature is cut: it is a reference, not code to copy."""
MAX_TYPE_LINES = 12
"""Lines of a data type's body shown (its fields)."""
MAX_LINE_CHARS = 160
"""A longer line is cut (a constant's huge initializer)."""


class Definition(msgspec.Struct, frozen=True):
    """One definition of a file, as the prompt would show it."""

    name: str
    kind: str
    """function, class, type, variable, method or field."""
    start_line: int
    end_line: int
    """One past its last line."""
    signature: str
    """Signature with the body left out (a brace language's ends where its body starts; Python's says ` ...`),
    or a data type with its fields (indented as in the file)."""
    doc: str
    """First line of its docstring or doc comment, "" when none."""
    parent: str | None
    """For a member: the class, type or trait it belongs to."""
    words: frozenset[str]
    """Lowercase identifier parts of its name and signature (what retrieval matches on)."""


class ImportRef(msgspec.Struct, frozen=True):
    """One import as written."""

    spec: str
    """Module as written: `.utils`, `a.b`, `./x`, `net/http`, `crate::a::b`, `a.b.C`, `x.h`, `mod:name`."""
    names: tuple[str, ...] = ()
    """Names imported from it (empty: the module itself)."""
    alias: str | None = None
    """The name the module is bound to in the file (`import a as b`, `import * as ns`)."""


class Outline(msgspec.Struct, frozen=True):
    """What the index keeps of one file."""

    language: str
    definitions: tuple[Definition, ...]
    imports: tuple[ImportRef, ...]
    package: str = ""
    """Go's package name, Java's package; "" elsewhere."""


_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_SUBWORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
STOPWORDS = frozenset({
    "self", "def", "return", "none", "true", "false", "null", "nil", "this", "class", "func", "function",
    "const", "let", "var", "int", "str", "string", "bool", "void", "public", "private", "static", "async",
    "await", "for", "while", "else", "elif", "import", "from", "the", "and", "not", "new", "err", "error",
    "type", "struct", "impl", "pub", "mut", "interface", "export", "default", "args", "kwargs", "cls",
})


def words_of(text: str) -> set[str]:
    """Lowercase identifier parts (`getHeaderValue`, `get_header_value` -> get, header, value)."""
    found: set[str] = set()
    for identifier in _IDENTIFIER.findall(text):
        lowered = identifier.lower()
        if len(lowered) >= 3 and lowered not in STOPWORDS:
            found.add(lowered)
        for part in _SUBWORD.findall(identifier):
            part = part.lower()
            if len(part) >= 3 and part not in STOPWORDS:
                found.add(part)
    return found


def read_outline(text: str, language: str, should_stop: Callable[[], bool] | None = None) -> Outline | None:
    """The outline of a whole file's text; None when `should_stop()` turned true while it was parsed
    (checked every few hundred bytes: a big file never holds up the thread that asks)."""
    parser = parser_for(language)
    if parser is None:
        return Outline(language, (), ())
    source = text.encode("utf-8")
    if should_stop is None:
        return outline_of_tree(parser.parse(source), source, language)
    try:  # a callback source: tree-sitter ignores progress on bytes
        tree = parse_in_chunks(parser, source, progress=lambda _offset, _error: should_stop())
    except ValueError:  # py-tree-sitter's answer to a cancelled parse
        parser.reset()
        return None
    return outline_of_tree(tree, source, language)


def outline_of_tree(tree: tree_sitter.Tree, source: bytes, language: str) -> Outline:
    """The outline of a parsed file (`source`: the UTF-8 bytes it was parsed from)."""
    reader = _Reader(source, language)
    reader.visit(tree.root_node.children)
    if language == "python":  # imports inside functions (lazy, or against import cycles) count too
        for node in _descendants(tree.root_node, "import_from_statement", skip=("import_from_statement",)):
            if node.parent is not None and node.parent.type != "module":
                reader._python_import(node)
    return Outline(language, tuple(reader.definitions), tuple(reader.imports), reader.package)


class _Reader:
    def __init__(self, source: bytes, language: str) -> None:
        self.source, self.language = source, language
        self.definitions: list[Definition] = []
        self.imports: list[ImportRef] = []
        self.package = ""
        self.visit_node = {
            "python": self._python, "go": self._go, "rust": self._rust, "java": self._java,
            "c": self._c, "cpp": self._c, "lua": self._lua,
        }.get(language, self._js)

    def visit(self, nodes) -> None:
        for node in nodes:
            if node.is_named:
                self.visit_node(node)

    # -- helpers -------------------------------------------------------------------------

    def text(self, node: tree_sitter.Node | None) -> str:
        return "" if node is None else self.source[node.start_byte:node.end_byte].decode("utf-8", "replace")

    def line_start(self, node: tree_sitter.Node) -> int:
        """Where the node's text starts: its line's start (keeping the indentation), or the node's
        own start when other code precedes it on that line."""
        start = self.source.rfind(b"\n", 0, node.start_byte) + 1
        return start if not self.source[start:node.start_byte].strip() else node.start_byte

    def head(self, node: tree_sitter.Node, body: tree_sitter.Node | None, elide: str) -> str:
        """The node's text up to its body (from its line's start), capped, with the body elided."""
        start = self.line_start(node)
        if body is None:
            return _cap(self.source[start:node.end_byte].decode("utf-8", "replace"), MAX_SIGNATURE_LINES)
        end = body.start_byte
        for child in node.children:  # comments between the header and the body are not the header's
            if child.start_byte >= body.start_byte:
                break
            if "comment" not in child.type:
                end = child.end_byte
        text = self.source[start:end].decode("utf-8", "replace").rstrip()
        return _cap(text, MAX_SIGNATURE_LINES) + elide

    def whole(self, node: tree_sitter.Node, lines: int = MAX_TYPE_LINES) -> str:
        return _cap(self.source[self.line_start(node):node.end_byte].decode("utf-8", "replace"), lines)

    def add(self, name: str | None, kind: str, node: tree_sitter.Node, signature: str, doc: str = "",
            parent: str | None = None) -> None:
        if not name:
            return
        words = words_of(name + " " + signature)
        self.definitions.append(Definition(
            name=name, kind=kind, start_line=node.start_point.row, end_line=node.end_point.row + 1,
            signature=signature, doc=doc, parent=parent, words=frozenset(words)))

    def comment_doc(self, node: tree_sitter.Node) -> str:
        """The first line of the comment block right above `node` (Go, Rust, Java, C, JS doc comments)."""
        previous = node.prev_sibling
        lines: list[str] = []
        row = node.start_point.row
        while previous is not None and "comment" in previous.type and previous.end_point.row >= row - 1:
            lines.insert(0, self.text(previous))
            row = previous.start_point.row
            previous = previous.prev_sibling
        for line in "\n".join(lines).split("\n"):
            line = line.strip().lstrip("/*!#-").strip().rstrip("*/").strip()
            if line and not line.startswith("@"):
                return line[:MAX_LINE_CHARS]
        return ""

    # -- Python ----------------------------------------------------------------------------

    def _python(self, node: tree_sitter.Node, parent: str | None = None) -> None:
        kind = node.type
        if kind == "decorated_definition":
            inner = node.child_by_field_name("definition")
            if inner is not None:
                self._python(inner, parent)
        elif kind == "function_definition":
            body = node.child_by_field_name("body")
            self.add(self.text(node.child_by_field_name("name")), "method" if parent else "function", node,
                     self.head(node, body, " ..."), _python_doc(self, body), parent)
        elif kind == "class_definition":
            body = node.child_by_field_name("body")
            name = self.text(node.child_by_field_name("name"))
            self.add(name, "class", node, self.head(node, body, ""), _python_doc(self, body), parent)
            if parent is None and body is not None:
                for child in body.named_children:
                    self._python(child, name)
        elif kind == "expression_statement" and node.named_child_count == 1:
            assignment = node.named_children[0]
            if assignment.type == "assignment":
                left = assignment.child_by_field_name("left")
                if left is not None and left.type == "identifier":
                    self.add(self.text(left), "field" if parent else "variable", node,
                             _cap(self.whole(node, 1), 1), "", parent)
        elif kind in ("import_statement", "import_from_statement") and parent is None:
            self._python_import(node)

    def _python_import(self, node: tree_sitter.Node) -> None:
        if node.type == "import_statement":
            for child in node.named_children:
                if child.type == "aliased_import":
                    self.imports.append(ImportRef(self.text(child.child_by_field_name("name")),
                                                  alias=self.text(child.child_by_field_name("alias"))))
                elif child.type == "dotted_name":
                    spec = self.text(child)
                    self.imports.append(ImportRef(spec, alias=spec.split(".")[0]))
            return
        module = self.text(node.child_by_field_name("module_name"))
        names = []
        for child in node.children_by_field_name("name"):
            if child.type == "aliased_import":
                child = child.child_by_field_name("name")
            names.append(self.text(child))
        self.imports.append(ImportRef(module, tuple(names) or ("*",)))

    # -- JavaScript / TypeScript -------------------------------------------------------------

    def _js(self, node: tree_sitter.Node) -> None:
        kind = node.type
        if kind == "export_statement":
            declaration = node.child_by_field_name("declaration")
            source = node.child_by_field_name("source")
            if declaration is not None:
                self._js_definition(declaration, node)
            elif source is not None:  # export ... from "x": a re-export is an import too
                self.imports.append(ImportRef(_unquote(self.text(source)), ("*",)))
            else:
                for child in node.named_children:
                    if child.type in _JS_DEFINITION_NODES:
                        self._js_definition(child, node)
        elif kind == "import_statement":
            self._js_import(node)
        else:
            self._js_definition(node, node)

    def _js_definition(self, node: tree_sitter.Node, outer: tree_sitter.Node) -> None:
        kind = node.type
        doc = self.comment_doc(outer)
        if kind in ("function_declaration", "generator_function_declaration", "function_signature"):
            self.add(self.text(node.child_by_field_name("name")), "function", node,
                     self.head(node, node.child_by_field_name("body"), ""), doc)
        elif kind in ("class_declaration", "abstract_class_declaration", "class"):
            body = node.child_by_field_name("body")
            name = self.text(node.child_by_field_name("name"))
            self.add(name, "class", node, self.head(node, body, ""), doc)
            for member in body.named_children if body is not None else ():
                self._js_member(member, name)
        elif kind in ("interface_declaration", "type_alias_declaration", "enum_declaration"):
            self.add(self.text(node.child_by_field_name("name")), "type", node, self.whole(node), doc)
        elif kind in ("lexical_declaration", "variable_declaration"):
            for declarator in node.named_children:
                if declarator.type != "variable_declarator":
                    continue
                name = declarator.child_by_field_name("name")
                value = declarator.child_by_field_name("value")
                if name is None or name.type != "identifier":
                    continue
                if value is not None and value.type in ("arrow_function", "function_expression", "function"):
                    body = value.child_by_field_name("body")
                    if body is not None and body.type != "statement_block":  # `(a) => a + 1`: one expression
                        body = None
                    self.add(self.text(name), "function", node, self.head(node, body, ""), doc)
                elif value is not None and value.type == "class":
                    self._js_definition(value, outer)
                else:
                    self.add(self.text(name), "variable", node, _cap(self.whole(node, 1), 1), doc)

    def _js_member(self, member: tree_sitter.Node, parent: str) -> None:
        kind = member.type
        name = member.child_by_field_name("name") or member.child_by_field_name("property")
        if name is None:
            return
        if kind in ("method_definition", "method_signature", "abstract_method_signature"):
            self.add(self.text(name), "method", member,
                     self.head(member, member.child_by_field_name("body"), ""), "", parent)
        elif kind in ("public_field_definition", "field_definition", "property_signature"):
            self.add(self.text(name), "field", member, _cap(self.whole(member, 1), 1), "", parent)

    def _js_import(self, node: tree_sitter.Node) -> None:
        source = node.child_by_field_name("source")
        if source is None:
            return
        spec = _unquote(self.text(source))
        names: list[str] = []
        alias = None
        for clause in node.named_children:
            if clause.type != "import_clause":
                continue
            for part in clause.named_children:
                if part.type == "identifier":
                    names.append("default")
                    alias = self.text(part)
                elif part.type == "namespace_import":
                    alias = self.text(part.named_children[-1]) if part.named_children else None
                elif part.type == "named_imports":
                    for specifier in part.named_children:
                        if specifier.type == "import_specifier":
                            names.append(self.text(specifier.child_by_field_name("name")))
        self.imports.append(ImportRef(spec, tuple(names), alias))

    # -- Go ------------------------------------------------------------------------------------

    def _go(self, node: tree_sitter.Node) -> None:
        kind = node.type
        if kind == "package_clause":
            self.package = self.text(node.named_children[0]) if node.named_children else ""
        elif kind == "import_declaration":
            for spec in _descendants(node, "import_spec"):
                alias = spec.child_by_field_name("name")
                self.imports.append(ImportRef(_unquote(self.text(spec.child_by_field_name("path"))),
                                              alias=self.text(alias) if alias is not None else None))
        elif kind == "function_declaration":
            self.add(self.text(node.child_by_field_name("name")), "function", node,
                     self.head(node, node.child_by_field_name("body"), ""), self.comment_doc(node))
        elif kind == "method_declaration":
            receiver = node.child_by_field_name("receiver")
            self.add(self.text(node.child_by_field_name("name")), "method", node,
                     self.head(node, node.child_by_field_name("body"), ""), self.comment_doc(node),
                     _go_receiver_type(self, receiver))
        elif kind == "type_declaration":
            doc = self.comment_doc(node)
            specs = [c for c in node.named_children if c.type in ("type_spec", "type_alias")]
            for spec in specs:
                text = self.whole(node) if len(specs) == 1 else "type " + self.whole(spec)
                self.add(self.text(spec.child_by_field_name("name")), "type", spec, text, doc)
        elif kind in ("const_declaration", "var_declaration"):
            keyword = "const" if kind == "const_declaration" else "var"
            for spec in _descendants(node, "const_spec" if keyword == "const" else "var_spec"):
                for name in spec.children_by_field_name("name"):
                    self.add(self.text(name), "variable", spec, f"{keyword} " + _cap(self.text(spec), 1),
                             self.comment_doc(spec))

    # -- Rust ------------------------------------------------------------------------------------

    def _rust(self, node: tree_sitter.Node, parent: str | None = None) -> None:
        kind = node.type
        doc = self.comment_doc(node)
        if kind in ("function_item", "function_signature_item"):
            self.add(self.text(node.child_by_field_name("name")), "method" if parent else "function", node,
                     self.head(node, node.child_by_field_name("body"), ""), doc, parent)
        elif kind in ("struct_item", "enum_item", "union_item", "type_item"):
            self.add(self.text(node.child_by_field_name("name")), "type", node, self.whole(node), doc, parent)
        elif kind in ("const_item", "static_item"):
            self.add(self.text(node.child_by_field_name("name")), "variable", node, _cap(self.whole(node, 1), 1),
                     doc, parent)
        elif kind in ("trait_item", "impl_item") and parent is None:
            body = node.child_by_field_name("body")
            if kind == "trait_item":
                name = self.text(node.child_by_field_name("name"))
                self.add(name, "class", node, self.head(node, body, ""), doc)
            else:
                name = _last_identifier(self.text(node.child_by_field_name("type")))
            for member in body.named_children if body is not None else ():
                self._rust(member, name)
        elif kind == "mod_item" and parent is None and node.child_by_field_name("body") is None:
            self.imports.append(ImportRef("mod:" + self.text(node.child_by_field_name("name"))))
        elif kind == "use_declaration" and parent is None:
            self._rust_use(self.text(node.child_by_field_name("argument")))

    def _rust_use(self, text: str) -> None:
        text = re.sub(r"\s+", "", text)
        if "::{" in text:
            prefix, _, inside = text.partition("::{")
            names = [part.split("::")[-1].split("as")[0] for part in inside.rstrip("}").split(",") if part]
            self.imports.append(ImportRef(prefix, tuple(n for n in names if n and n != "self")))
            for part in inside.rstrip("}").split(","):  # `use a::{b::C}`: modules under the prefix
                if "::" in part:
                    self.imports.append(ImportRef(prefix + "::" + part.rsplit("::", 1)[0],
                                                  (part.rsplit("::", 1)[1].split("as")[0],)))
        elif "::" in text:
            prefix, _, last = text.rpartition("::")
            self.imports.append(ImportRef(prefix, (last.split("as")[0],)))

    # -- Java ------------------------------------------------------------------------------------

    def _java(self, node: tree_sitter.Node, parent: str | None = None) -> None:
        kind = node.type
        if kind == "package_declaration":
            self.package = self.text(node).removeprefix("package").strip().rstrip(";").strip()
        elif kind == "import_declaration":
            spec = self.text(node).removeprefix("import").strip().rstrip(";").strip().removeprefix("static ")
            self.imports.append(ImportRef(spec.strip()))
        elif kind in ("class_declaration", "interface_declaration", "enum_declaration", "record_declaration"):
            body = node.child_by_field_name("body")
            name = self.text(node.child_by_field_name("name"))
            self.add(name, "class", node, self.head(node, body, ""), self.comment_doc(node), parent)
            if parent is None and body is not None:
                for member in body.named_children:
                    self._java(member, name)
        elif kind in ("method_declaration", "constructor_declaration") and parent:
            self.add(self.text(node.child_by_field_name("name")), "method", node,
                     self.head(node, node.child_by_field_name("body"), ""), self.comment_doc(node), parent)
        elif kind in ("field_declaration", "constant_declaration") and parent:
            for declarator in node.children_by_field_name("declarator"):
                self.add(self.text(declarator.child_by_field_name("name")), "field", node,
                         _cap(self.whole(node, 1), 1), self.comment_doc(node), parent)

    # -- C / C++ -----------------------------------------------------------------------------------

    def _c(self, node: tree_sitter.Node, parent: str | None = None) -> None:
        kind = node.type
        if kind == "preproc_include":
            path = node.child_by_field_name("path")
            if path is not None and path.type == "string_literal":
                self.imports.append(ImportRef(_unquote(self.text(path))))
        elif kind in ("namespace_definition", "linkage_specification", "preproc_ifdef", "preproc_if",
                      "preproc_else", "declaration_list"):
            body = node.child_by_field_name("body")
            self.visit_children_c(body.named_children if body is not None else node.named_children, parent)
        elif kind == "template_declaration":
            for child in node.named_children:
                if child.type in ("function_definition", "class_specifier", "struct_specifier", "declaration"):
                    self._c(child, parent)
        elif kind == "function_definition":
            self.add(_c_name(self, node.child_by_field_name("declarator")), "method" if parent else "function",
                     node, self.head(node, node.child_by_field_name("body"), ""), self.comment_doc(node),
                     parent)
        elif kind in ("declaration", "field_declaration"):
            declarator = node.child_by_field_name("declarator")
            specifier = node.child_by_field_name("type")
            if specifier is not None and specifier.type in _C_TYPES and specifier.child_by_field_name("body"):
                self._c(specifier, parent)
            if declarator is not None:
                is_function = declarator.type == "function_declarator" or bool(
                    _descendants(declarator, "function_declarator"))
                self.add(_c_name(self, declarator), ("method" if parent else "function") if is_function else
                         ("field" if parent else "variable"), node, _cap(self.whole(node, MAX_SIGNATURE_LINES),
                                                                          MAX_SIGNATURE_LINES), self.comment_doc(node),
                         parent)
        elif kind in _C_TYPES and node.child_by_field_name("body") is not None:
            name = self.text(node.child_by_field_name("name"))
            body = node.child_by_field_name("body")
            if self.language == "cpp" and kind in ("class_specifier", "struct_specifier") and parent is None:
                self.add(name, "class", node, self.head(node, body, ""), self.comment_doc(node))
                self.visit_children_c(body.named_children, name)
            else:
                self.add(name, "type", node, self.whole(node), self.comment_doc(node), parent)
        elif kind == "type_definition":
            declarator = node.child_by_field_name("declarator")
            self.add(_last_identifier(self.text(declarator)), "type", node, self.whole(node, 6),
                     self.comment_doc(node), parent)
        elif kind in ("preproc_def", "preproc_function_def"):
            self.add(self.text(node.child_by_field_name("name")), "variable", node, _cap(self.whole(node, 1), 1),
                     self.comment_doc(node), parent)
        elif kind == "expression_statement" and node.named_children and node.named_children[0].type in _C_TYPES:
            self._c(node.named_children[0], parent)

    def visit_children_c(self, children, parent: str | None) -> None:
        for child in children:
            if child.is_named:
                self._c(child, parent)

    # -- Lua ---------------------------------------------------------------------------------------

    def _lua(self, node: tree_sitter.Node) -> None:
        if node.type == "function_declaration":
            name = self.text(node.child_by_field_name("name"))
            self.add(_last_identifier(name), "function", node,
                     self.head(node, node.child_by_field_name("body"), " ... end"), self.comment_doc(node))


_JS_DEFINITION_NODES = frozenset({
    "function_declaration", "generator_function_declaration", "class_declaration", "abstract_class_declaration",
    "interface_declaration", "type_alias_declaration", "enum_declaration", "lexical_declaration",
    "variable_declaration", "function_signature",
})
_C_TYPES = frozenset({"struct_specifier", "class_specifier", "union_specifier", "enum_specifier"})


def _python_doc(reader: _Reader, body: tree_sitter.Node | None) -> str:
    if body is None or not body.named_children:
        return ""
    first = body.named_children[0]
    if first.type == "expression_statement" and first.named_children and first.named_children[0].type == "string":
        for line in reader.text(first).strip("\"'rbuRBU \n").split("\n"):
            if line.strip():
                return line.strip().strip("\"'")[:MAX_LINE_CHARS]
    return ""


def _go_receiver_type(reader: _Reader, receiver: tree_sitter.Node | None) -> str | None:
    if receiver is None:
        return None
    for parameter in receiver.named_children:
        kind = parameter.child_by_field_name("type")
        if kind is not None:
            return _last_identifier(reader.text(kind).lstrip("*").split("[")[0])
    return None


def _c_name(reader: _Reader, declarator: tree_sitter.Node | None) -> str:
    """The declared name under a (function, pointer, array, reference) declarator."""
    node = declarator
    while node is not None and node.child_by_field_name("declarator") is not None:
        node = node.child_by_field_name("declarator")
    return _last_identifier(reader.text(node)) if node is not None else ""


_LEAVES = ("string", "comment", "expression_statement", "assignment", "call", "return_statement")


def _descendants(node: tree_sitter.Node, kind: str, skip: tuple[str, ...] = ()) -> list[tree_sitter.Node]:
    """Nodes of `kind` under `node` (with `skip`: not looking inside statements that cannot hold one)."""
    found = []
    stack = list(node.named_children)
    leaves = _LEAVES if skip else ()
    while stack:
        child = stack.pop()
        if child.type == kind:
            found.append(child)
        elif child.type not in leaves:
            stack.extend(child.named_children)
    found.sort(key=lambda n: n.start_byte)
    return found


def _last_identifier(text: str) -> str:
    names = _IDENTIFIER.findall(text.split("<")[0])
    return names[-1] if names else ""


def _unquote(text: str) -> str:
    return text.strip().strip("\"'`<>")


def _cap(text: str, lines: int) -> str:
    kept = text.rstrip().split("\n")
    capped = [line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " ..." for line in kept[:lines]]
    if len(kept) > lines:
        capped.append(_indent_of(kept[0]) + "    ...")
    return "\n".join(capped)


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]
