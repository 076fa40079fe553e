"""The HTML report: one self-contained page drawn from the report's model (`_timeline.build`).

The page is a small template (`html_report.html`) and script (`html_report.js`),
package data files, with the model embedded as JSON, each step with its
stacks' weights in loop time (`flame.py`) for the flame graph. Nothing from the
program is ever written as markup: the model sits in a
`<script type="application/json">` element with every `<`, `>` and `&`
escaped (so no name can close that element), the title is HTML-escaped,
and the script sets texts with `textContent`. The page's Content Security
Policy fetches nothing and runs only its own script (by its hash), so an
injected script would not run even if some text did get through.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from importlib import resources
from typing import Any

from aiocop._reporting.flame import weighed_steps

_MARKER = re.compile(r"\{\{(title|script_hash|data|script)\}\}")


def _asset(name: str) -> str:
    return resources.files("aiocop._reporting").joinpath(name).read_text(encoding="utf-8")


def embed_json(value: Any) -> str:
    """`value` as JSON that is safe inside a `<script>` element: only ASCII, no `<`, `>` or `&` outside escapes."""
    text = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_data(model: dict[str, Any]) -> dict[str, Any]:
    """`model` with each step's flame graph stacks (`flame`): which of its samples or calls, and their ms.

    Weighed here, once, as speedscope and folded stacks weigh them: the page
    only adds them up.
    """
    steps = [
        {**step, "flame": [{"from": s.source, "index": s.index, "ms": round(s.ms, 3)} for s in stacks]}
        for step, stacks in zip(model["steps"], weighed_steps(model), strict=True)
    ]
    return {**model, "steps": steps}


def render(model: dict[str, Any]) -> str:
    """The report page for `model`."""
    script = _asset("html_report.js")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    values = {
        "title": html.escape(f"aiocop report: {model['facts']['command']}"),
        "script_hash": f"sha256-{digest}",
        "data": embed_json(page_data(model)),
        "script": script,
    }
    # One pass: a value is never searched for markers itself.
    return _MARKER.sub(lambda match: values[match.group(1)], _asset("html_report.html"))
