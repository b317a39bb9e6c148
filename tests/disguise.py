"""A mechanical disguise of a module for the similarity tests: every local name and argument
renamed, and the top-level functions in reverse order (what a student hiding a copy does first)."""

from __future__ import annotations

import ast
import builtins


def disguise(source: str) -> str:
    tree = ast.parse(source)
    keep = set(dir(builtins)) | {"torch", "triton", "tl", "math"}
    top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    imported = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            if node.id not in keep | top | imported:
                node.id = "my_" + node.id[::-1]
            return node

        def visit_arg(self, node: ast.arg) -> ast.arg:
            node.arg = "my_" + node.arg[::-1]
            return node

    tree = Rename().visit(tree)
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    tree.body = [n for n in tree.body if not isinstance(n, ast.FunctionDef)] + functions[::-1]
    return ast.unparse(tree)
