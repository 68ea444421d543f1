"""docs/formats.md's feature x format table names real test cases: every ✔ is a test id
that pytest collects, and every case of each test the table names has its ✔."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROW = re.compile(r"^\|[^|]*\| `(test_every_format_\w+\.py::\w+)` \|(.*)\|\s*$")
_CASE = re.compile(r"✔ `\[([\w-]+)\]`")


def _table_ids() -> set[str]:
  with open(os.path.join(ROOT, "docs", "formats.md"), encoding="utf-8") as f:
    rows = [m for line in f if (m := _ROW.match(line))]
  assert len(rows) >= 9, "the table lost its rows"
  ids = set()
  for m in rows:
    cells = m.group(2).split("|")
    assert len(cells) == 6, m.group(0)
    for cell in cells:
      case = _CASE.search(cell)
      assert case, f"a format without its ✔ in {m.group(1)}: {cell!r}"
      ids.add(f"tests/{m.group(1)}[{case.group(1)}]")
  return ids


def test_every_checkmark_is_a_collected_test_case():
  ids = _table_ids()
  functions = sorted({i.split("[")[0] for i in ids})
  files = sorted({f.split("::")[0] for f in functions})
  out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                        "-p", "no:cacheprovider", "-n", "0", *files],
                       cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
  collected = {line.strip() for line in out.stdout.splitlines() if "::" in line}
  assert collected, out.stdout + out.stderr
  assert ids <= collected, sorted(ids - collected)
  named = {c for c in collected if c.split("[")[0] in functions}
  assert named <= ids, sorted(named - ids)  # no case of a named test left out
