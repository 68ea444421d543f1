"""The documentation is tested: the site builds in strict mode, the API reference renders
every public name, and every ```python block of docs/*.md and README.md runs.

Blocks of one page run in order in one namespace (a page is one script); each page gets
a fresh namespace. All pages run in one child process (one jax import), from a
temporary directory, with the mxjax the tests use (`conftest.child_env`). A block opts out
only with the line `<!-- docs-test: skip -->` right above its fence, for what cannot run
here (a multi-process launch).
"""

from __future__ import annotations

import ast
import glob
import html
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = "<!-- docs-test: skip -->"
PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
API_MODULES = ("mxjax", "mxjax.linen", "mxjax.nnx", "mxjax.rules", "mxjax.state")
_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    re.M | re.S)


def code_blocks(path: str) -> list[tuple[int, str, bool]]:
  """(first line number, source, skipped) of every ```python block of a page."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  blocks = []
  for m in _FENCE.finditer(text):
    if m.group("lang") != "python":
      continue
    before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
    line = text.count("\n", 0, m.start()) + 2
    body = "\n".join(l[len(m.group("indent")):] for l in m.group("body").splitlines())
    blocks.append((line, body, before == SKIP))
  return blocks


_RUNNER = r'''
import json, sys, traceback
pages = json.load(open(sys.argv[1]))
results = {}
for page, blocks in pages.items():
  namespace = {"__name__": "__main__"}
  results[page] = {"ran": 0, "error": None}
  for line, source in blocks:
    try:
      exec(compile(source, f"{page}:{line}", "exec"), namespace)
    except BaseException:
      results[page]["error"] = f"block at line {line}:\n" + traceback.format_exc(limit=8)
      break
    results[page]["ran"] += 1
json.dump(results, open(sys.argv[2], "w"))
'''


@pytest.fixture(scope="module")
def page_results(tmp_path_factory):
  """Runs every page's blocks in one child process; page name -> {"ran", "error"}."""
  tmp = tmp_path_factory.mktemp("docs_run")
  pages = {os.path.relpath(p, ROOT): [(line, src) for line, src, skip in code_blocks(p)
                                      if not skip] for p in PAGES}
  (tmp / "pages.json").write_text(json.dumps(pages))
  (tmp / "runner.py").write_text(_RUNNER)
  proc = subprocess.run([sys.executable, str(tmp / "runner.py"), str(tmp / "pages.json"),
                         str(tmp / "results.json")], cwd=tmp, capture_output=True, text=True,
                        timeout=600, env=child_env(MPLBACKEND="Agg"))
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads((tmp / "results.json").read_text())


@pytest.mark.parametrize("page", [os.path.relpath(p, ROOT) for p in PAGES])
def test_code_blocks_run(page, page_results):
  result = page_results[page]
  assert result["error"] is None, f"{page}: {result['error']}"
  expected = sum(not skip for _, _, skip in code_blocks(os.path.join(ROOT, page)))
  assert result["ran"] == expected


def test_few_blocks_skip():
  """Opting out stays the exception: at most one skipped block per page, three in all."""
  skipped = {p: sum(skip for *_, skip in code_blocks(p)) for p in PAGES}
  assert all(n <= 1 for n in skipped.values()) and sum(skipped.values()) <= 3, skipped


def test_block_extraction():
  """The extractor sees a fenced python block, its line, indented fences and the skip
  marker, and leaves other languages alone (what the runner executes is what it finds)."""
  import tempfile  # noqa: PLC0415
  text = ("# t\n\n```python\nx = 1\n```\n\n```sh\nls\n```\n\n" + SKIP +
          "\n```python\nraise SystemExit\n```\n\n- item\n\n    ```python\n    y = x\n    ```\n")
  with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False) as f:
    f.write(text)
  try:
    assert code_blocks(f.name) == [(4, "x = 1", False), (13, "raise SystemExit", True),
                                   (19, "y = x", False)]
  finally:
    os.unlink(f.name)


def _all(module: str) -> list[str]:
  """A module's literal `__all__`, read from its source as the docs hook reads it."""
  base = os.path.join(ROOT, *module.split("."))
  path = base + ".py" if os.path.exists(base + ".py") else os.path.join(base, "__init__.py")
  for node in ast.parse(open(path, encoding="utf-8").read()).body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                            for t in node.targets):
      return list(ast.literal_eval(node.value))
  raise AssertionError(f"{module} has no literal __all__")


@pytest.mark.parametrize("module", ["mxjax", "mxjax.linen", "mxjax.nnx"])
def test_all_lists_every_public_name(module):
  """A namespace module's `__all__` names every public object it exports (modules and
  `__version__` aside), so the API reference cannot miss a new one."""
  import importlib  # noqa: PLC0415
  import types  # noqa: PLC0415
  mod = importlib.import_module(module)
  public = {n for n, v in vars(mod).items()
            if not n.startswith("_") and not isinstance(v, types.ModuleType)}
  assert set(_all(module)) == public
  assert all(hasattr(mod, n) for n in _all(module))


def test_mkdocs_build_strict(tmp_path):
  """`mkdocs build --strict` succeeds (a broken link, reference or docstring fails it), and
  the API reference has a heading for every name in the five modules' `__all__`."""
  site = tmp_path / "site"
  proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                         os.path.join(ROOT, "mkdocs.yml"), "-d", str(site)],
                        cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  assert "WARNING" not in proc.stderr, proc.stderr[-5000:]  # (-q would hide them from --strict)
  for module in API_MODULES:
    page = site / "api" / ("mxjax" if module == "mxjax" else module.split(".")[1]) / "index.html"
    headings = {html.unescape(re.sub(r"<[^>]+>", " ", h)).split()[0]  # the name, not labels
                for h in re.findall(r"<h2[^>]*>(.*?)</h2>", page.read_text(), re.S)}
    missing = [n for n in _all(module) if f"{module}.{n}" not in headings]
    assert not missing, (module, missing)
