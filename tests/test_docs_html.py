"""The built docs site reads as rendered pages, not as source text.

Builds the site once (Sphinx, warnings as errors) into a temporary directory, or reads
the one ``make docs`` built when ``POSENC_DOCS_SITE`` names it, and checks the HTML with
the standard library: no reST or MyST markup shown literally, formulas as math nodes
typeset by a local MathJax, parameter tables that name real parameters, every public
name documented. No browser needed. Beside the site: every Python block of the pages that is
not a doctest runs as written.
"""

from __future__ import annotations

import html.parser
import importlib
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAMILY_PAGES = ["absolute.html", "relative.html", "rotary.html"]
API_PAGES = ["api/absolute.html", "api/relative.html", "api/rotary.html", "api/torch.html", "api/core.html"]
GENERATED = {"genindex.html", "search.html", "py-modindex.html"}
# What a reader must never see: reST roles and directives, MyST roles, doubled backticks.
LITERAL_MARKUP = [":math:", ".. math::", ":func:", ":mod:", ":class:", ":meth:", ":attr:", "{math}", "``"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    given = os.environ.get("POSENC_DOCS_SITE")
    if given:
        return pathlib.Path(given)
    for module in ("sphinx", "numpydoc", "myst_parser", "pydata_sphinx_theme", "matplotlib"):
        pytest.importorskip(module)
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", "-E", str(ROOT / "docs"), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


class Page(html.parser.HTMLParser):
    """Visible text, math nodes, scripts and emphasis that starts inside a word."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.math: list[str] = []
        self.scripts: list[str] = []
        self.external: list[str] = []
        self.midword_emphasis: list[str] = []
        self._skip = 0  # inside <script> or <style>
        self._math_depth = 0
        self._last_data = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "style"):
            self._skip += 1
            if attrs.get("src"):
                self.scripts.append(attrs["src"])
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            if value.startswith(("http:", "https:", "//")) and (tag in ("script", "img") or attrs.get("rel") == ["stylesheet"] or "stylesheet" in str(attrs.get("rel"))):
                self.external.append(value)
        if tag in ("strong", "em", "b", "i") and self._last_data[-1:].isalnum():
            self.midword_emphasis.append(self._last_data[-20:])
        if tag in ("span", "div") and "math" in (attrs.get("class") or "").split():
            self._math_depth = 1
            self.math.append("")
        elif self._math_depth:
            self._math_depth += 1
        self._last_data = ""

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1
        if self._math_depth:
            self._math_depth -= 1
        self._last_data = ""

    def handle_data(self, data):
        if self._skip:
            return
        if self._math_depth:
            self.math[-1] += data
        else:
            self.text.append(data)
        self._last_data = data


def parse(path: pathlib.Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def pages(site):
    return [p for p in sorted(site.rglob("*.html")) if "_static" not in p.parts and p.name not in GENERATED]


def test_no_page_shows_markup_literally(site):
    found = []
    for path in pages(site):
        page = parse(path)
        text = "".join(page.text)
        for markup in LITERAL_MARKUP:
            if markup in text:
                at = text.index(markup)
                found.append(f"{path.relative_to(site)}: {markup!r} in ...{text[max(0, at - 60): at + 60]!r}")
        for dollars in re.findall(r"\$[^$\s][^$\n]{0,80}\$", text):
            found.append(f"{path.relative_to(site)}: unrendered $-math {dollars!r}")
        for before in page.midword_emphasis:
            found.append(f"{path.relative_to(site)}: bold/italic starting inside a word after {before!r} (a ** or * read as emphasis)")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", FAMILY_PAGES + API_PAGES[:3])
def test_formulas_are_math_typeset_by_a_local_mathjax(site, name):
    page = parse(site / name)
    assert len(page.math) >= 10, f"{name}: {len(page.math)} math nodes"
    mathjax = [src for src in page.scripts if "mathjax" in src.lower()]
    assert mathjax and not any(src.startswith(("http", "//")) for src in mathjax), mathjax
    assert ((site / name).parent / mathjax[0].split("?")[0]).resolve().is_file()
    assert not page.external, page.external


def test_every_page_with_math_loads_mathjax_from_the_site(site):
    for path in pages(site):
        page = parse(path)
        assert not page.external, (path, page.external)
        if page.math:
            (mathjax,) = [src for src in page.scripts if "mathjax" in src.lower()]
            assert (path.parent / mathjax.split("?")[0]).resolve().is_file(), (path, mathjax)


def test_math_nodes_hold_latex(site):
    rotary = parse(site / "rotary.html").math + parse(site / "api/rotary.html").math
    assert any(r"\theta_i" in m for m in rotary)
    assert any("2^{24}" in m for m in parse(site / "precision.html").math)
    assert any("2^{24}" in m for m in parse(site / "index.html").math)


def documented_objects(site):
    """``{object id: the HTML of its description}`` over the API pages."""
    objects = {}
    for name in API_PAGES:
        text = (site / name).read_text(encoding="utf-8")
        parts = re.split(r'<dt class="sig sig-object py" id="([\w.]+)">', text)
        for object_id, body in zip(parts[1::2], parts[2::2]):
            objects[object_id] = body
    return objects


def resolve(object_id):
    """The object an id names, importing the submodules on its way (``posenc.torch.extrapolation``
    is not an attribute of ``posenc.torch`` until something imports it)."""
    head, *attrs = object_id.split(".")
    obj = importlib.import_module(head)
    for attr in attrs:
        if not hasattr(obj, attr) and inspect.ismodule(obj):
            importlib.import_module(f"{obj.__name__}.{attr}")
        obj = getattr(obj, attr)
    return obj


def parameter_entries(body):
    """``[(names, description)]`` of the Parameters field of one description."""
    match = re.search(r'>Parameters<span class="colon">:</span></dt>\s*<dd class="field-\w+">(.*?</dd>)\s*(?:<dt class="field-|</dl>\s*</dd>|$)', body, re.S)
    if not match:
        return []
    entries = re.findall(r"<dt><strong>(.*?)</strong>.*?</dt><dd>(.*?)</dd>", match.group(1), re.S)
    return [(re.sub(r"<.*?>", "", names), re.sub(r"\s+", " ", re.sub(r"<.*?>", "", text)).strip()) for names, text in entries]


def test_parameter_tables_name_real_parameters(site):
    problems = []
    checked = 0
    for object_id, body in documented_objects(site).items():
        entries = parameter_entries(body)
        if not entries:
            continue
        obj = resolve(object_id)
        try:
            signature = set(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            continue
        descriptions = [text for _, text in entries if text]
        if len(descriptions) != len(set(descriptions)):
            problems.append(f"{object_id}: one description repeated for several entries")
        for names, _ in entries:
            for name in names.split(", "):
                checked += 1
                if name.lstrip("*") not in signature:
                    problems.append(f"{object_id}: documented parameter {name!r} is not in the signature {sorted(signature)}")
    assert checked > 100
    assert not problems, "\n".join(problems)


def test_every_public_name_is_in_the_reference(site):
    import posenc
    import posenc.torch

    ids = set(documented_objects(site))
    expected = {f"posenc.{n}" for n in posenc.__all__ if n != "scaling"}
    expected |= {f"posenc.scaling.{n}" for n in posenc.scaling.__all__}
    expected |= {f"posenc.torch.{n}" for n in posenc.torch.__all__}
    assert not expected - ids, sorted(expected - ids)


def test_figures_page_shows_every_figure(site):
    from posenc import plots

    text = (site / "figures.html").read_text(encoding="utf-8")
    for name in plots.FIGURES:
        (src,) = re.findall(rf'<img[^>]*src="([^"]*{re.escape(name)})"', text)
        assert (site / src).is_file()


def python_blocks():
    """The ```python blocks of the README and the docs pages that are not doctests (the
    doctests run with the suite: ``--doctest-glob=*.md``), as ``(page:line, code)``."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for block in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            if ">>>" not in block.group(1):
                yield f"{page.relative_to(ROOT)}:{text[: block.start()].count(chr(10)) + 1}", block.group(1)


@pytest.mark.parametrize("where, code", list(python_blocks()), ids=[where for where, _ in python_blocks()])
def test_every_python_block_runs_as_written(where, code, tmp_path):
    """A reader copies a block alone: it has its own imports and runs in a fresh process."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{where}:\n{proc.stderr[-3000:]}"


def test_readme_counts_the_architectures_the_transformers_table_covers():
    readme = (ROOT / "README.md").read_text()
    table = (ROOT / "docs" / "transformers.md").read_text()
    (said,) = re.findall(r"checks them at patch time: (\d+) causal-LM architectures", readme)
    (covered,) = re.findall(r"^(\d+) of \d+ buildable tiny causal-LM architectures covered", table, re.M)
    assert said == covered


def top_level_keywords(args):
    """The ``name=`` keywords at the top level of a call's argument text."""
    depth, top = 0, []
    for char in args:
        depth += char in "([{"
        depth -= char in ")]}"
        top.append(char if depth == 0 else " ")
    return re.findall(r"(?:^|,)\s*\**([A-Za-z_]\w*)\s*=(?!=)", "".join(top))


def test_inline_signatures_name_real_keywords():
    """A call shown inline in the README or a docs page (```pe.rope(x, offset=3)```, a
    table's ```Llama3(s, L, low_freq_factor=1)```) of a public function or scaling class
    uses keywords it takes: a reader copies them."""
    import posenc as pe

    public = {name: getattr(pe, name) for name in pe.__all__ if callable(getattr(pe, name))}
    public |= {name: getattr(pe.scaling, name) for name in pe.scaling.__all__}
    problems = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in re.finditer(r"`(?:pe\.|posenc\.)?(?:scaling\.)?([A-Za-z_]\w*)\(([^`]*)\)`", page.read_text()):
            name, args = match.groups()
            if name not in public:
                continue
            parameters = inspect.signature(public[name]).parameters
            if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
                continue
            problems += [f"{page.name}: `{name}({args})`: no keyword {kw!r}" for kw in top_level_keywords(args) if kw not in parameters]
    assert not problems, "\n".join(problems)
