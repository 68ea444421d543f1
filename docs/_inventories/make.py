"""Makes the intersphinx inventories in this folder from the jax and flax docs sources, so
that the docs build cross-references jax and flax objects without downloading anything.

    python docs/_inventories/make.py JAX_CHECKOUT FLAX_CHECKOUT

SOURCES names the commits they were made from.

Each inventory lists the objects those projects' API pages document (`autosummary` with
`:toctree:`, `autofunction` / `autoclass` / `autodata`, flax's `flax_module`, `automodule`)
at the address their published site gives them. Read from the reStructuredText API pages
only; the kind of each object (class or function) is asked of the installed package.
"""

from __future__ import annotations

import importlib
import inspect
import os
import posixpath
import re
import subprocess
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
_DIRECTIVE = re.compile(r"^\.\. (\w+)::\s*(\S*)\s*$")
_OPTION = re.compile(r"^\s+:(\w+):\s*(.*)$")


def _kind(fullname: str) -> str:
  """py:class, py:function or py:data, from the installed package (py:function when it
  cannot be imported)."""
  module, _, name = fullname.rpartition(".")
  try:
    obj = getattr(importlib.import_module(module), name)
  except Exception:  # noqa: BLE001 - a name this jax / flax does not have
    return "py:function"
  if inspect.isclass(obj):
    return "py:class"
  if inspect.ismodule(obj):
    return "py:module"
  return "py:function" if callable(obj) else "py:data"


def objects(docs: str, api_dirs: list[str]) -> dict[str, tuple[str, str]]:
  """fullname -> (role, address relative to the site root) of every documented object."""
  found = {}
  for api in api_dirs:
    for dirpath, _, files in os.walk(os.path.join(docs, api)):
      for file in sorted(files):
        if not file.endswith(".rst"):
          continue
        path = os.path.join(dirpath, file)
        page = posixpath.splitext(os.path.relpath(path, docs).replace(os.sep, "/"))[0]
        _read_page(open(path, encoding="utf-8").read().splitlines(), page, found)
  return found


def _read_page(lines: list[str], page: str, found: dict) -> None:
  module = None
  i = 0
  while i < len(lines):
    m = _DIRECTIVE.match(lines[i])
    i += 1
    if not m:
      continue
    directive, arg = m.groups()
    options, body = {}, []
    while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
      opt = _OPTION.match(lines[i])
      if opt and not body:
        options[opt.group(1)] = opt.group(2).strip()
      elif lines[i].strip():
        body.append(lines[i].strip())
      i += 1
    if directive in ("currentmodule", "module", "automodule"):
      module = arg
      if directive == "automodule":
        found.setdefault(arg, ("py:module", f"{page}.html#module-{arg}"))
    elif directive == "autosummary" and "toctree" in options:
      folder = posixpath.normpath(posixpath.join(posixpath.dirname(page), options["toctree"]))
      for name in body:
        full = name if module is None or name.startswith(module + ".") else f"{module}.{name}"
        found.setdefault(full, (_kind(full), f"{folder}/{full}.html#{full}"))
    elif directive in ("autofunction", "autoclass", "autodata", "autoexception"):
      full = arg if module is None or "." in arg and arg.startswith(module) else f"{module}.{arg}"
      found.setdefault(full, (_kind(full), f"{page}.html#{full}"))
    elif directive == "flax_module":
      full = f"{options.get('module', module)}.{options['class']}"
      found.setdefault(full, ("py:class", f"{page}.html#{full}"))


def write(path: str, project: str, found: dict) -> None:
  header = (f"# Sphinx inventory version 2\n# Project: {project}\n# Version: latest\n"
            "# The remainder of this file is compressed using zlib.\n")
  lines = [f"{name} {role} 1 {uri.replace('#' + name, '#$') if uri.endswith('#' + name) else uri} -"
           for name, (role, uri) in sorted(found.items())]
  with open(path, "wb") as f:
    f.write(header.encode() + zlib.compress(("\n".join(lines) + "\n").encode(), 9))
  print(f"{path}: {len(lines)} objects")


def _commit(checkout: str) -> str:
  return subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True,
                        text=True).stdout.strip() or "unknown"


def main(jax_checkout: str, flax_checkout: str) -> None:
  jax_docs = os.path.join(jax_checkout, "docs")
  jax_pages = [f for f in os.listdir(jax_docs) if f.startswith("jax") and f.endswith(".rst")]
  found = {}
  for page in sorted(jax_pages):
    _read_page(open(os.path.join(jax_docs, page), encoding="utf-8").read().splitlines(),
               page[:-4], found)
  write(os.path.join(HERE, "jax.inv"), "JAX", found)
  write(os.path.join(HERE, "flax.inv"), "Flax",
        objects(os.path.join(flax_checkout, "docs_nnx"), ["api_reference"]))
  write(os.path.join(HERE, "flax_linen.inv"), "Flax Linen",
        objects(os.path.join(flax_checkout, "docs"), ["api_reference"]))
  commits = {"jax": _commit(jax_checkout), "flax": _commit(flax_checkout)}
  if "unknown" not in commits.values():  # else write SOURCES by hand
    with open(os.path.join(HERE, "SOURCES"), "w") as f:
      f.write("".join(f"{k} {v}\n" for k, v in commits.items()))


if __name__ == "__main__":
  main(*sys.argv[1:3])
