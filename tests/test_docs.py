"""The docs: generated pages match the code (and their renderers stay out of the wheel), examples run, links open."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import scripts
from tests.support.docs_hooks import load, renderer
from tests.support.source import top_level_names

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("page", ["reference/detected-calls.md", "reference/options.md", "reference/opentelemetry.md"])
def test_generated_page_is_up_to_date(page: str) -> None:
    # The docs build renders these pages from the code (docs/hooks/generated_pages.py); the committed
    # copies, which the repository shows, must say the same.
    generated_pages = load("generated_pages")
    assert page in generated_pages.PAGES
    assert (ROOT / "docs" / page).read_text(encoding="utf-8") == generated_pages.render(page), (
        "regenerate with: python docs/hooks/generated_pages.py"
    )


def test_the_docs_build_renders_the_generated_pages_from_the_code() -> None:
    # What mkdocs asks the hook for each page: the generated ones from their renderer, any other from its file.
    generated_pages = load("generated_pages")
    mkdocs_yml = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "  - docs/hooks/generated_pages.py" in mkdocs_yml

    class Page:
        def __init__(self, src_uri: str) -> None:
            self.file = type("File", (), {"src_uri": src_uri})()

    page = generated_pages.on_page_read_source(Page("reference/detected-calls.md"), config={})
    assert page == renderer("detected_calls").render()
    assert generated_pages.on_page_read_source(Page("quickstart.md"), config={}) is None


def test_every_detected_event_is_on_the_page() -> None:
    import aiocop

    page = renderer("detected_calls").render()
    for event in aiocop.get_blocking_events_dict():
        assert f"| `{event}` |" in page


def test_changelog_page_is_the_changelog() -> None:
    # Included whole at build time: the page can never fall behind CHANGELOG.md.
    assert (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8") == '--8<-- "CHANGELOG.md"\n'


# its subprocess is given 60 s: the test's own timeout sits above it, so that bound fires first (issue 36)
@pytest.mark.timeout(90)
def test_quickstart_example_prints_what_the_page_shows() -> None:
    result = subprocess.run(
        [sys.executable, "examples/quickstart.py"], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True
    )
    page = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    lines = result.stdout.splitlines()
    assert len(lines) == 3, lines
    for printed in lines:
        # The file's absolute path and the stall's length differ from run to run.
        shown = re.sub(r"stall of \d+ ms", "stall of 101 ms", printed.replace(str(ROOT), "/srv"))
        assert shown in page, f"docs/quickstart.md does not show: {shown}"


def test_the_site_link_check_finds_links_that_open_no_file(tmp_path: Path) -> None:
    # The docs build's hook (docs/hooks/site_links.py): the site opened from
    # disk must never land on a folder listing or a missing file.
    site_links = scripts.load("docs/hooks/site_links.py")
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "page.html").write_text('<a href="../index.html#top">home</a><img src="missing.png">')
    (tmp_path / "index.html").write_text(
        '<a href="guide/page.html">a page</a> <a href="guide/">a folder</a> <a href="https://example.org/">away</a>'
        ' <a href="#here">here</a> <script src="guide/page.html?v=1"></script>'
    )
    (tmp_path / "404.html").write_text('<a href="/anywhere.html">served at any depth</a>')
    assert sorted(site_links.broken_links(str(tmp_path))) == ["guide/page.html: missing.png", "index.html: guide/"]


def test_every_run_option_is_in_the_cli_pages_options_table() -> None:
    # --hang-after-ms was missing from the table (issue 38).
    from aiocop._commands.cli import build_parsers

    _parser, run = build_parsers()
    page = (ROOT / "docs" / "how-to" / "cli.md").read_text(encoding="utf-8")
    table = page.split("## Options", 1)[1].split("\n## ", 1)[0]
    options = {opt for action in run._actions for opt in action.option_strings if opt.startswith("--")}
    missing = sorted(opt for opt in options - {"--help"} if f"`{opt}" not in table and f"`{opt} " not in table)
    assert not missing, f"run options missing from docs/how-to/cli.md's options table: {missing}"


def test_the_quick_start_installs_this_version_not_the_one_on_pypi() -> None:
    # `pip install aiocop` installs 1.2.1 from PyPI, on which `python -m aiocop
    # run` fails: the quick start installed it (issue 38). Every install line
    # of its first step names a clone, and the page says why and how to check.
    import shlex

    page = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    install = page.split("## 1. Install", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("#", 1)[0] for line in install.splitlines() if line.startswith("pip install")]
    assert commands, "no install command in the quick start's first step"
    for command in commands:
        names = [arg for arg in shlex.split(command)[2:] if not arg.startswith("-")]
        from_pypi = [name for name in names if re.fullmatch(r"aiocop(\[[\w,]*\])?", name)]
        assert not from_pypi, f"installs {from_pypi} from PyPI (1.2.1 there): {command}"
    prose = " ".join(install.split())
    assert "`pip install aiocop` installs 1.2.1" in prose
    assert "aiocop.__version__" in prose


def test_the_docs_theme_fetches_no_web_fonts() -> None:
    # Material's default is Google's web fonts, fetched by every page of the
    # site (it worked offline only through the fallback font): the system's
    # fonts instead (issue 38).
    mkdocs_yml = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    theme = re.search(r"^theme:\n((?:(?: .*)?\n)*)", mkdocs_yml, re.MULTILINE)
    assert theme and re.search(r"^  font: false$", theme.group(1), re.MULTILINE), "mkdocs.yml: no theme.font: false"
    # With the docs tools installed: what the theme writes into each page's head.
    mkdocs_config = pytest.importorskip("mkdocs.config")
    pytest.importorskip("material")
    config = mkdocs_config.load_config(str(ROOT / "mkdocs.yml"))
    assert config.theme.name == "material" and not config.theme.custom_dir
    base = config.theme.get_env().get_template("base.html")
    fonts = "".join(base.blocks["fonts"](base.new_context({"config": config})))
    assert "fonts.googleapis.com" not in fonts and "fonts.gstatic.com" not in fonts, fonts
    assert not [path for path in config.extra_css if "://" in path]


# --- CONTRIBUTING.md's table of where each module's tests are (issue 40) ----------------------------


def _own_test_files(module: Path) -> list[Path]:
    """Where a module's own test file would be: the rule stated in CONTRIBUTING.md's "Where the tests are"."""
    parts = module.relative_to(ROOT).parts
    name = f"test_{module.stem.lstrip('_')}.py"
    if len(parts) > 2 and parts[1].startswith("_"):  # aiocop/_<part>/[<sub>/]<module>.py
        return [ROOT / "tests" / parts[1][1:] / Path(*parts[2:-1]) / name]
    folders = Path(*parts[1:-1])  # aiocop/[_]<module>.py, aiocop/{core,types}/<module>.py
    return [ROOT / "tests" / "api" / folders / name, ROOT / "tests" / "integrations" / folders / name]


def _public_names(module: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments), less the private ones."""
    return {name for name in top_level_names(module) if not name.startswith("_")}


def _tests_module(test_file: Path, module: Path) -> bool:
    """Whether a test file imports the module (in any form), names it dotted, or uses one of its public
    names through an import from aiocop (`aiocop.configure(...)`, `from aiocop import configure`)."""
    dotted = ".".join(module.relative_to(ROOT).with_suffix("").parts)
    package, _, leaf = dotted.rpartition(".")
    source = test_file.read_text(encoding="utf-8")
    if re.search(re.escape(dotted) + r"(?!\w)", source):
        return True
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # a local name bound by an import from aiocop -> the name it imported
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == dotted or alias.name.startswith(dotted + "."):
                    return True
                if alias.name.partition(".")[0] == "aiocop":
                    bound[alias.asname or "aiocop"] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.partition(".")[0] == "aiocop":
            for alias in node.names:
                if node.module == dotted or (node.module == package and alias.name == leaf):
                    return True
                bound[alias.asname or alias.name] = alias.name
    public = _public_names(module)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and bound.get(node.id) in public and isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, ast.Attribute) and node.attr in public:
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                return True
    return False


def _tests_index() -> dict[str, list[str]]:
    """CONTRIBUTING.md's table: module -> the test files its row names."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    begin, end = "<!-- tests index: begin (tests/test_docs.py) -->", "<!-- tests index: end -->"
    assert begin in text and end in text, "CONTRIBUTING.md lost the markers around its table of tests"
    rows: dict[str, list[str]] = {}
    for line in text.split(begin)[1].split(end)[0].splitlines():
        cells = line.strip().strip("|").split("|")
        if len(cells) != 2 or not cells[0].strip().startswith("`aiocop/"):
            continue
        module = cells[0].strip().strip("`")
        assert module not in rows, f"CONTRIBUTING.md: {module} has two rows"
        rows[module] = re.findall(r"`(tests/[\w/]+\.py)`", cells[1])
    return rows


def test_every_module_without_a_test_file_of_its_name_has_a_row_naming_the_files_that_test_it() -> None:
    # A newcomer finds a module's tests by its name, or by its row in CONTRIBUTING.md's table (issue 40).
    rows = _tests_index()
    modules = {
        p.relative_to(ROOT).as_posix(): p for p in sorted((ROOT / "aiocop").rglob("*.py")) if p.name != "__init__.py"
    }
    problems = []
    for name, module in modules.items():
        if not any(f.is_file() for f in _own_test_files(module)) and name not in rows:
            problems.append(f"{name}: no test file of its name and no row in the table")
    for name, files in rows.items():
        if name not in modules:
            problems.append(f"{name}: a row for a module that does not exist")
            continue
        own = [f for f in _own_test_files(modules[name]) if f.is_file()]
        if own:
            problems.append(f"{name}: has its own {own[0].relative_to(ROOT)} now, so its row must go")
        if not files:
            problems.append(f"{name}: its row names no test file")
        for file in files:
            if not (ROOT / file).is_file():
                problems.append(f"{name}: {file} does not exist")
            elif not _tests_module(ROOT / file, modules[name]):
                problems.append(
                    f"{name}: {file} neither imports it, names it nor uses any of its public names through aiocop"
                )
    assert not problems, "CONTRIBUTING.md, 'Where the tests are':\n  " + "\n  ".join(problems)
