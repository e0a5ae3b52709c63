"""The documentation site: API reference coverage, figures, tables and links.

The strict Sphinx build itself is the last step of the README's test command; the
pages' and docstrings' examples run as doctests (pyproject.toml).
"""

import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

import jaxgrad

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(p for p in DOCS.glob("*.md") if p.name != "README.md")


def make_figures():
    spec = importlib.util.spec_from_file_location("make_figures", DOCS / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_name_is_in_the_api_reference():
    documented = re.findall(
        r"^\.\. autofunction:: jaxgrad\.(\w+)$", (DOCS / "api.md").read_text(), re.M
    )
    missing = sorted(set(jaxgrad.__all__) - set(documented))
    assert not missing, f"docs/api.md lacks an autofunction entry for {missing}"
    unknown = sorted(set(documented) - set(jaxgrad.__all__))
    assert not unknown, f"docs/api.md documents names not in jaxgrad.__all__: {unknown}"
    assert len(documented) == len(set(documented)), "docs/api.md documents a name twice"


def test_every_page_is_in_a_table_of_contents():
    index = (DOCS / "index.md").read_text()
    listed = set(re.findall(r"^(\w+)$", index, re.M))
    assert {p.stem for p in PAGES} - {"index"} <= listed


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_point_to_existing_files(page):
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


# The training page shows what the main job writes: python examples/train.py --out docs/images
TRAINING_OUTPUTS = {"loss.png", "samples.png"}


def test_every_image_shown_exists_and_is_made_by_a_script():
    shown = {
        pathlib.Path(target).name
        for page in PAGES
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())
    }
    for name in shown:
        assert (DOCS / "images" / name).exists(), f"docs/images/{name} is not committed"
    made = set(make_figures().figures())
    drawn = shown - TRAINING_OUTPUTS
    assert drawn <= made, f"pages show images no script makes: {sorted(drawn - made)}"
    assert made <= drawn, f"figures no page shows: {sorted(made - drawn)}"


def test_figure_script_draws_every_figure(tmp_path):
    module = make_figures()
    written = module.write_figures(tmp_path)
    assert sorted(p.name for p in written) == sorted(module.figures())
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path.name
        assert path.stat().st_size > 5_000, f"{path.name} looks empty"


def test_performance_tables_match_the_benchmark_json():
    module = make_figures()
    text = module.PERFORMANCE_PAGE.read_text()
    tables = re.findall(r"<!-- table: (\w+) -->", text)
    # Every benchmark has a table, and every table is a benchmark's run (another
    # machine's run of one is a table of its own).
    commands = [module.load_benchmark(table)["command"] for table in tables]
    scripts = [re.match(r"python benchmarks/(\w+)\.py ", command)[1] for command in commands]
    assert sorted(set(scripts)) == sorted(module.BENCHMARKS), scripts
    assert module.performance_page(text) == text, (
        "docs/performance.md is stale: run python docs/make_figures.py"
    )


def test_readme_links_to_the_site_and_keeps_its_commands():
    readme = (DOCS.parent / "README.md").read_text()
    assert "docs/index.md" in readme
    ci = (DOCS.parent / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in readme, ".ci/run must run exactly the README's test command"
    assert ci in (DOCS / "index.md").read_text(), "the getting-started page shows the same command"


def test_the_oldest_jax_and_numpy_supported_are_the_same_everywhere():
    # pyproject.toml's floors, the README's command that runs the suite on them, and
    # the requirements that the README and the getting-started page state.
    pyproject = (DOCS.parent / "pyproject.toml").read_text()
    oldest = re.search(r'"jax>=([\d.]+)"', pyproject)[1]
    numpy = re.search(r'"numpy>=([\d.]+)"', pyproject)[1]
    assert f'"jaxlib>={oldest}"' in pyproject
    readme = (DOCS.parent / "README.md").read_text()
    command = f'"jax=={oldest}" "jaxlib=={oldest}" "numpy=={numpy}.0" && pytest'  # 2.0.0
    assert command in readme
    assert f"`jax` and `jaxlib` >= {oldest}, `numpy` >= {numpy}." in readme
    started = (DOCS / "index.md").read_text()
    assert f"`jax` and `jaxlib` {oldest} or later, and NumPy {numpy} or later." in started


@pytest.mark.parametrize("page", [*PAGES, DOCS.parent / "README.md"], ids=lambda p: p.name)
def test_link_texts_are_words_not_file_names(page):
    # "see [Performance](performance.md)", not "see [performance.md](performance.md)".
    texts = re.findall(r"(?<!!)\[([^\]]+)\]\([^)]+\)", page.read_text())
    file_names = [t for t in texts if re.fullmatch(r"[\w./-]+\.(md|py|json)", t.strip("`"))]
    assert not file_names, f"{page.name} has links named after files: {file_names}"


def test_the_built_site_loads_no_script_from_the_network(tmp_path):
    # Formulas must render offline: MathJax is served from the site's _static.
    # In a subprocess: pytest turns Sphinx's own deprecation warnings into errors.
    out = tmp_path / "html"
    build = [sys.executable, "-m", "sphinx", "-q", "-b", "html", str(DOCS), str(out)]
    result = subprocess.run(build, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    pages = sorted(out.glob("*.html"))
    assert pages
    for page in pages:
        sources = re.findall(r"<script[^>]*\ssrc=\"([^\"]+)\"", page.read_text())
        remote = [s for s in sources if re.match(r"(https?:)?//", s)]
        assert not remote, f"{page.name} loads scripts from the network: {remote}"
    math_pages = [p for p in pages if "mathjax" in p.read_text()]
    assert math_pages, "no page loads MathJax: the check above checked nothing"
    for page in math_pages:
        for source in re.findall(r"src=\"([^\"]*mathjax[^\"]*)\"", page.read_text()):
            assert (out / source).is_file(), f"{page.name} loads missing {source}"
