"""The documentation is tested: the site builds in strict mode (`sphinx-build -W`), the
API reference renders every public name, and every ```python block of docs/*.md and
README.md runs, alone, without a warning.

Each block runs in a fresh namespace (a block is a script a reader pastes on its own:
imports included). All blocks run in one child process (one jax import), from a
temporary directory, with the mxjax the tests use (`conftest.child_env`). A warning a block
emits (`warnings.warn`, or a `logging` record of level WARNING or above) fails it, unless
the block states it with a comment line `# expected warning: TEXT` (TEXT: a part of the
message); a stated warning that does not come fails it too. A block opts out of running
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
import urllib.parse

import pytest
from conftest import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = "<!-- docs-test: skip -->"
EXPECTED = re.compile(r"^\s*# expected warning: (.+?)\s*$", re.M)
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


def block_indents(path: str) -> list[int]:
  """The indent of every ```python fence of a page (0: not inside a list item)."""
  with open(path, encoding="utf-8") as f:
    return [len(m.group("indent")) for m in _FENCE.finditer(f.read())
            if m.group("lang") == "python"]


_RUNNER = r'''
import json, logging, sys, traceback, warnings

class Records(logging.Handler):
  def __init__(self):
    super().__init__(logging.WARNING)
    self.messages = []
  def emit(self, record):
    self.messages.append(f"logging {record.levelname}: {record.getMessage()}")

pages = json.load(open(sys.argv[1]))
results = {}
for page, blocks in pages.items():
  results[page] = {"ran": 0, "errors": []}
  for line, source, expected in blocks:
    namespace = {"__name__": "__main__"}  # every block alone, as a reader pastes it
    records = Records()
    logging.getLogger().addHandler(records)
    error = None
    try:
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(source, f"{page}:{line}", "exec"), namespace)
    except BaseException:
      error = traceback.format_exc(limit=8)
    finally:
      logging.getLogger().removeHandler(records)
    got = [f"{w.category.__name__}: {w.message}" for w in caught] + records.messages
    unexpected = [m for m in got if not any(e in m for e in expected)]
    missing = [e for e in expected if not any(e in m for m in got)]
    if error is None and unexpected:
      error = "warnings the block does not state (# expected warning: ...):\n" + "\n".join(unexpected)
    if error is None and missing:
      error = "stated warnings that did not come:\n" + "\n".join(missing)
    if error is None:
      results[page]["ran"] += 1
    else:
      results[page]["errors"].append(f"block at line {line}:\n{error}")
json.dump(results, open(sys.argv[2], "w"))
'''


@pytest.fixture(scope="module")
def page_results(tmp_path_factory):
  """Runs every block, each alone, in one child process; page -> {"ran", "errors"}."""
  tmp = tmp_path_factory.mktemp("docs_run")
  pages = {os.path.relpath(p, ROOT): [(line, src, EXPECTED.findall(src))
                                      for line, src, skip in code_blocks(p) if not skip]
           for p in PAGES}
  (tmp / "pages.json").write_text(json.dumps(pages))
  (tmp / "runner.py").write_text(_RUNNER)
  proc = subprocess.run([sys.executable, str(tmp / "runner.py"), str(tmp / "pages.json"),
                         str(tmp / "results.json")], cwd=tmp, capture_output=True, text=True,
                        timeout=900, env=child_env(MPLBACKEND="Agg"))
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads((tmp / "results.json").read_text())


@pytest.mark.parametrize("page", [os.path.relpath(p, ROOT) for p in PAGES])
def test_code_blocks_run_alone_without_warnings(page, page_results):
  """Every block of the page runs in a fresh namespace and emits no warning it does not
  state; no block is indented inside a list item (it could not be pasted as it is)."""
  result = page_results[page]
  assert not result["errors"], f"{page}:\n" + "\n\n".join(result["errors"])
  expected = sum(not skip for _, _, skip in code_blocks(os.path.join(ROOT, page)))
  assert result["ran"] == expected
  assert not any(block_indents(os.path.join(ROOT, page))), f"{page}: an indented python block"


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


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  """The site, built as the docs say: `sphinx-build -W -b html docs OUT` (warnings are
  errors; autodoc imports the mxjax the tests use)."""
  out = tmp_path_factory.mktemp("site") / "html"
  proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                         "html", os.path.join(ROOT, "docs"), str(out)],
                        cwd=out.parent, capture_output=True, text=True, timeout=600,
                        env=child_env())
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  assert "WARNING" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr[-5000:]
  return out


def test_api_reference_has_an_entry_for_every_public_name(site):
  """Each of the five modules' pages has an entry (an anchor `module.name`) for every name
  in its `__all__`, and a table row linking to it, one name per row."""
  for module in API_MODULES:
    page = (site / "api" / f"{'mxjax' if module == 'mxjax' else module.split('.')[1]}.html")
    text = page.read_text()
    anchors = set(re.findall(r'<dt[^>]* id="([\w.]+)"', text))
    missing = [n for n in _all(module) if f"{module}.{n}" not in anchors]
    assert not missing, (module, missing)
    rows = re.findall(r'<tr class="row-(?:odd|even)"><td><p><a [^>]*href="#([\w.]+)"', text)
    assert rows == [f"{module}.{n}" for n in _all(module)], (module, rows)


def test_attribute_rows_name_one_field_each(site):
  """A docstring row naming several fields (`exp_bits, man_bits: ...`) renders as one row
  per name: `ElementFormat`'s fields are each a name of their own."""
  text = html.unescape(re.sub(r"<[^>]+>", "", (site / "api" / "mxjax.html").read_text()))
  for name in ("exp_bits", "man_bits", "has_inf", "has_nan"):
    assert re.search(rf"\n{name} (\(\w+\) )?\u2013", text), name
  assert not re.search(r"\n\w+,[\w, ]*(\([^)]*\) )?\u2013", text)  # no "a, b – ..." row
  assert "(exp_bits,)" not in text and "(has_inf,)" not in text  # nor "b (a,) – ..."


def test_site_browses_from_disk(site):
  """Every link between pages names an .html file (file:// shows no directory listings),
  each such file exists, and jax / flax names link to their docs (intersphinx, from the
  inventories in docs/_inventories)."""
  pages = sorted(p for p in site.rglob("*.html") if "_static" not in p.parts)
  assert len(pages) >= 17
  external = set()
  for page in pages:
    for href in re.findall(r'href="([^"]+)"', page.read_text()):
      if href.startswith(("http://", "https://", "mailto:")):
        external.add(href)
        continue
      target = href.split("#", 1)[0].split("?", 1)[0]
      if not target:
        continue
      assert not target.endswith("/"), (page.name, href)
      assert (page.parent / target).exists(), (page.name, href)
  assert "https://docs.jax.dev/en/latest/_autosummary/jax.lax.dot_general.html#jax.lax.dot_general" in external
  assert any(h.startswith("https://flax.readthedocs.io/") for h in external)


def test_site_serves_from_a_local_server(site):
  """`python -m http.server -d docs/_build/html` serves the pages and the theme's files
  (on 127.0.0.1, a port the system picks; stopped at the end)."""
  import functools  # noqa: PLC0415
  import http.server  # noqa: PLC0415
  import threading  # noqa: PLC0415
  import urllib.request  # noqa: PLC0415

  class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
      pass

  server = http.server.ThreadingHTTPServer(
      ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    for path in ("index.html", "api/mxjax.html", "ways-into-a-model.html"):
      with urllib.request.urlopen(base + path, timeout=10) as response:
        page = response.read().decode()
      assert response.status == 200 and "mxjax" in page, path
      for css in re.findall(r'<link[^>]+href="([^"]+\.css)[^"]*"', page):
        target = urllib.parse.urljoin(base + path, css)
        with urllib.request.urlopen(target, timeout=10) as response:
          assert response.status == 200, target
  finally:
    server.shutdown()
    server.server_close()


def test_runner_fails_a_block_on_a_warning_it_does_not_state(tmp_path):
  """The runner fails a block that warns (warnings module or logging) unless a comment
  line states the warning, fails a stated warning that does not come, and runs every
  block in a fresh namespace (a name from an earlier block is a NameError)."""
  blocks = {
      "silent": "x = 1",
      "warns": "import warnings\nwarnings.warn('something odd')",
      "stated": "import warnings\n# expected warning: something odd\nwarnings.warn('something odd')",
      "logs": "import logging\nlogging.getLogger('lib').warning('careful')",
      "missing": "# expected warning: never comes\ny = 2",
      "alone": "print(x)",
  }
  pages = {name: [[1, src, EXPECTED.findall(src)]] for name, src in blocks.items()}
  (tmp_path / "pages.json").write_text(json.dumps(pages))
  (tmp_path / "runner.py").write_text(_RUNNER)
  subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "pages.json"),
                  str(tmp_path / "results.json")], check=True, cwd=tmp_path, timeout=60)
  results = json.loads((tmp_path / "results.json").read_text())
  ran = {name: r["ran"] for name, r in results.items()}
  assert ran == {"silent": 1, "warns": 0, "stated": 1, "logs": 0, "missing": 0, "alone": 0}
  assert "UserWarning: something odd" in results["warns"]["errors"][0]
  assert "logging WARNING: careful" in results["logs"]["errors"][0]
  assert "never comes" in results["missing"]["errors"][0]
  assert "NameError" in results["alone"]["errors"][0]
