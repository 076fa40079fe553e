"""The docs page of detected calls is generated from the rules table, never edited by hand."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from aiocop import _docs, _docs_options

ROOT = Path(__file__).resolve().parent.parent


def test_detected_calls_page_is_up_to_date() -> None:
    page = ROOT / "docs" / "reference" / "detected-calls.md"
    assert page.read_text(encoding="utf-8") == _docs.render(), (
        "regenerate with: python -m aiocop._docs > docs/reference/detected-calls.md"
    )


def test_options_page_is_up_to_date() -> None:
    page = ROOT / "docs" / "reference" / "options.md"
    assert page.read_text(encoding="utf-8") == _docs_options.render(), (
        "regenerate with: python -m aiocop._docs_options > docs/reference/options.md"
    )


def test_every_detected_event_is_on_the_page() -> None:
    import aiocop

    page = _docs.render()
    for event in aiocop.get_blocking_events_dict():
        assert f"| `{event}` |" in page


def test_changelog_page_is_the_changelog() -> None:
    # Included whole at build time: the page can never fall behind CHANGELOG.md.
    assert (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8") == '--8<-- "CHANGELOG.md"\n'


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
    spec = importlib.util.spec_from_file_location("site_links", ROOT / "docs" / "hooks" / "site_links.py")
    assert spec is not None and spec.loader is not None
    site_links = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site_links)
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "page.html").write_text('<a href="../index.html#top">home</a><img src="missing.png">')
    (tmp_path / "index.html").write_text(
        '<a href="guide/page.html">a page</a> <a href="guide/">a folder</a> <a href="https://example.org/">away</a>'
        ' <a href="#here">here</a> <script src="guide/page.html?v=1"></script>'
    )
    (tmp_path / "404.html").write_text('<a href="/anywhere.html">served at any depth</a>')
    assert sorted(site_links.broken_links(str(tmp_path))) == ["guide/page.html: missing.png", "index.html: guide/"]


def test_opentelemetry_page_is_up_to_date() -> None:
    from aiocop import _docs_otel

    page = ROOT / "docs" / "reference" / "opentelemetry.md"
    assert page.read_text(encoding="utf-8") == _docs_otel.render(), (
        "regenerate with: python -m aiocop._docs_otel > docs/reference/opentelemetry.md"
    )
