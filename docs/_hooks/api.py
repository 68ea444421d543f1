"""MkDocs hook: expands `<!-- api-members: MODULE -->` in a page into one mkdocstrings
block per name in MODULE's `__all__`, so a name added to `__all__` appears in the API
reference by itself.

Each name is rendered from the module that defines it (read statically from the `from ...
import` statements, nothing imported) under the heading `MODULE.name`: a re-exported
function whose defining module has its own name (`mxjax.quantize`, the function, lives in
the module `mxjax.quantize`) is then still the function.
"""

from __future__ import annotations

import ast
import os
import re

_MARKER = re.compile(r"<!--\s*api-members:\s*([\w.]+)\s*-->")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _source(module: str) -> str | None:
  base = os.path.join(_ROOT, *module.split("."))
  for path in (base + ".py", os.path.join(base, "__init__.py")):
    if os.path.exists(path):
      return path
  return None


def _tree(module: str) -> ast.Module:
  path = _source(module)
  if path is None:
    raise ValueError(f"api-members: no source file for module {module!r}")
  with open(path, encoding="utf-8") as f:
    return ast.parse(f.read(), path)


def _defined(module: str) -> set[str]:
  """Names a module binds by assignment, def, class or import (not its submodules)."""
  names = set()
  for node in _tree(module).body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, ast.Assign):
      names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    elif isinstance(node, (ast.AnnAssign,)) and isinstance(node.target, ast.Name):
      names.add(node.target.id)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names.update((a.asname or a.name).split(".")[0] for a in node.names)
  return names


def public_names(module: str) -> list[str]:
  """The module's `__all__` (a literal list or tuple of strings)."""
  for node in _tree(module).body:
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
        return list(ast.literal_eval(node.value))
  raise ValueError(f"api-members: module {module!r} has no literal __all__")


def canonical(module: str, name: str) -> str:
  """The dotted path of the object `module.name` where it is defined."""
  for node in _tree(module).body:
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for alias in node.names:
        if (alias.asname or alias.name) == name:
          inner = f"{node.module}.{alias.name}"
          if _source(inner) is not None and alias.name not in _defined(node.module):
            return inner  # a submodule (`from mxjax import linen`)
          return canonical(node.module, alias.name)
  return f"{module}.{name}"


def _documented_modules() -> list[str]:
  """Every module an API page expands (its marker), from docs/api/*.md."""
  api = os.path.join(_ROOT, "docs", "api")
  found = []
  for page in sorted(os.listdir(api)):
    if page.endswith(".md"):
      with open(os.path.join(api, page), encoding="utf-8") as f:
        found += _MARKER.findall(f.read())
  return found


def _owner(module: str, path: str) -> str | None:
  """Another documented module, deeper than `module`, whose `__all__` holds `path`'s
  object: that page renders it, and `module`'s page links there."""
  for other in _documented_modules():
    if other != module and other.startswith(module + "."):
      for name in public_names(other):
        if canonical(other, name) == path:
          return other + "." + name
  return None


def _blocks(module: str) -> str:
  out = []
  for name in public_names(module):
    path = canonical(module, name)
    owner = _owner(module, path)
    if owner is not None:  # rendered once, on its own module's page
      out.append(f"## `{module}.{name}` {{ #{module}.{name} }}\n\n"
                 f"The same object as [`{owner}`][{path}].\n")
      continue
    out.append(f"::: {path}\n"
               f"    options:\n"
               f"      heading: \"{module}.{name}\"\n"
               f"      toc_label: \"{name}\"\n"
               f"      show_root_heading: true\n"
               f"      heading_level: 2\n")
  return "\n".join(out)


def on_page_markdown(markdown: str, **kwargs) -> str:
  del kwargs
  return _MARKER.sub(lambda m: _blocks(m.group(1)), markdown)
