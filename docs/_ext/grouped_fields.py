"""Sphinx extension: a Google-style docstring row that names several fields at once,
`exp_bits, man_bits: widths of ...` in an Args or Attributes section, becomes one row per
name with the shared description, before napoleon reads it (napoleon would take
`exp_bits,` for a type and `man_bits` for the name). The source keeps its compact form,
which reads well in `help()`.
"""

from __future__ import annotations

import re

_SECTION = re.compile(r"^(\s*)(Args|Arguments|Attributes|Parameters|Keyword Args|"
                      r"Keyword Arguments|Other Parameters):\s*$")
_GROUPED = re.compile(r"^(\s*)(\*{0,2}\w+(?:,\s*\*{0,2}\w+)+)(\s*\([^)]*\))?:(\s.*|)$")


def _indent(line: str) -> int:
  return len(line) - len(line.lstrip())


def split_grouped(lines: list[str]) -> list[str]:
  """The docstring's lines with every grouped field row written once per name."""
  out, i, section = [], 0, None  # section: the header's indent while inside one
  while i < len(lines):
    line = lines[i]
    header = _SECTION.match(line)
    if header:
      section = len(header.group(1))
      out.append(line)
      i += 1
      continue
    if section is not None and line.strip() and _indent(line) <= section:
      section = None
    grouped = _GROUPED.match(line) if section is not None else None
    if grouped is None:
      out.append(line)
      i += 1
      continue
    indent, names, kind, text = grouped.groups()
    rest = []
    i += 1
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > len(indent)):
      if not lines[i].strip() and (i + 1 >= len(lines) or _indent(lines[i + 1]) <= len(indent)):
        break
      rest.append(lines[i])
      i += 1
    for name in (n.strip() for n in names.split(",")):
      out.append(f"{indent}{name}{kind or ''}:{text}")
      out.extend(rest)
  return out


def _process(app, what, name, obj, options, lines):
  lines[:] = split_grouped(lines)


def setup(app):
  app.connect("autodoc-process-docstring", _process, priority=100)  # before napoleon (500)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
