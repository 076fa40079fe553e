"""mkdocs hook: every link of the built site opens a file.

The site is meant to work opened from disk (`site/index.html`), where a link
to a folder shows a directory listing instead of a page: after the build,
check that every relative link and asset of every page names a file that
exists. Runs in every `mkdocs build`; a broken link fails it.
"""

from __future__ import annotations

import os
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote, urlsplit

_ATTRIBUTES = {"a": "href", "link": "href", "script": "src", "img": "src"}


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = _ATTRIBUTES.get(tag)
        self.targets.extend(value for name, value in attrs if name == wanted and value)


def broken_links(site_dir: str) -> list[str]:
    """`page: link` for each relative link of the built site that does not open a file."""
    broken = []
    for folder, _, names in os.walk(site_dir):
        for name in sorted(names):
            if not name.endswith(".html") or (folder == site_dir and name == "404.html"):
                continue  # 404.html is for a web server, which serves it at any depth: its links are absolute
            page = os.path.join(folder, name)
            parser = _Links()
            with open(page, encoding="utf-8") as html:
                parser.feed(html.read())
            for link in parser.targets:
                parts = urlsplit(link)
                if parts.scheme or parts.netloc or not parts.path:
                    continue  # another site, or an anchor in this page
                target = os.path.normpath(os.path.join(folder, unquote(parts.path)))
                if not os.path.isfile(target):
                    broken.append(f"{os.path.relpath(page, site_dir)}: {link}")
    return broken


def on_post_build(config: Any, **kwargs: Any) -> None:
    from mkdocs.exceptions import PluginError  # noqa: PLC0415 - mkdocs only at build time (the tests import this module)

    broken = broken_links(config["site_dir"])
    if broken:
        shown = "\n  ".join(broken[:20])
        raise PluginError(f"{len(broken)} link(s) of the built site open no file (a folder, or nothing):\n  {shown}")
