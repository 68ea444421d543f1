"""Sphinx extension: `<!-- api-members: MODULE -->` in a page becomes MODULE's API
reference, one entry per name of its `__all__`, so a name added to `__all__` appears by
itself: a table (one name per line, its summary) and the entry of each name, rendered by
autodoc from its docstring under its public name (`mxjax.quantize`, not the module that
defines it).

A name that a deeper documented module also exports (`mxjax.Dense` is `mxjax.linen.Dense`)
is rendered once, on that module's page; the other page keeps a short entry that links
there, so either name is a cross-reference target.
"""

from __future__ import annotations

import glob
import importlib
import inspect
import os
import re
import sys

from sphinx.pycode import ModuleAnalyzer

MARKER = re.compile(r"<!--\s*api-members:\s*([\w.]+)\s*-->")


def documented_modules(srcdir: str) -> list[str]:
  """Every module an API page expands (its marker), from docs/api/*.md."""
  found = []
  for page in sorted(glob.glob(os.path.join(srcdir, "api", "*.md"))):
    with open(page, encoding="utf-8") as f:
      found += MARKER.findall(f.read())
  return found


def public_names(module: str) -> list[str]:
  return list(importlib.import_module(module).__all__)


def owner(module: str, name: str, modules: list[str]) -> str | None:
  """`other.name2`, where a documented module deeper than `module` exports the same object."""
  obj = getattr(importlib.import_module(module), name)
  for other in modules:
    if other != module and other.startswith(module + "."):
      mod = importlib.import_module(other)
      for other_name in mod.__all__:
        if getattr(mod, other_name) is obj:
          return f"{other}.{other_name}"
  return None


def _kind(obj) -> str:
  if inspect.isclass(obj):
    return "class"
  if callable(obj):
    return "function"
  return "data"


def data_doc(name: str, obj) -> str:
  """The `#:` comment above the assignment of a module constant, from the mxjax module
  that binds `name` to `obj` (a re-export has none of its own)."""
  for modname in sorted(m for m in sys.modules if m == "mxjax" or m.startswith("mxjax.")):
    if getattr(sys.modules[modname], name, None) is not obj:
      continue
    try:
      docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
    except Exception:  # noqa: BLE001 - an extension module, no source
      continue
    if ("", name) in docs:
      return "\n".join(docs["", name]).strip()
  return ""


def summary(doc: str) -> str:
  """The first sentence of a docstring, on one line (a table cell)."""
  first = " ".join(doc.strip().split("\n\n", 1)[0].split())
  for m in re.finditer(r"[.:](\s|$)", first):
    if first[:m.start()].count("`") % 2 == 0:  # not inside a `literal`
      return first[:m.start()] + "."
  return first


def entries(module: str, modules: list[str]) -> str:
  """The reStructuredText of a module's reference: a table of its names (one per row, with
  the first sentence of each docstring), then one entry per name."""
  mod = importlib.import_module(module)
  table = [".. list-table::", "   :widths: 30 70", ""]
  body = [f".. currentmodule:: {module}", ""]
  for name in mod.__all__:
    obj = getattr(mod, name)
    full, kind = f"{module}.{name}", _kind(obj)
    doc = data_doc(name, obj) if kind == "data" else (inspect.getdoc(obj) or "")
    table += [f"   * - :py:obj:`{full}`", f"     - {summary(doc) or ' '}"]
    target = owner(module, name, modules)
    if target is not None:
      body += [f".. py:{kind}:: {name}", "   :no-index-entry:", "",
               f"   The same {'object' if kind == 'data' else kind} as :py:obj:`{target}`.", ""]
    elif kind == "class":
      body += [f".. autoclass:: {name}", "   :members:", ""]
    elif kind == "function":
      body += [f".. autofunction:: {name}", ""]
    else:
      value = repr(obj)
      body += [f".. py:data:: {name}"] + ([f"   :value: {value}"] if len(value) < 70 else [])
      body += [""] + ["   " + line if line else "" for line in doc.splitlines()] + [""]
  return "\n".join(table + [""] + body)


def _expand(app, docname: str, source: list[str]) -> None:
  if not docname.startswith("api/"):
    return
  modules = documented_modules(app.srcdir)
  source[0] = MARKER.sub(lambda m: "```{eval-rst}\n" + entries(m.group(1), modules) + "\n```",
                         source[0])


def setup(app):
  app.connect("source-read", _expand)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
