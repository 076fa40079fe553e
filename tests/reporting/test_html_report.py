"""`--html`, `--speedscope` and `--folded`: one model drawn three ways, checked as files and in a real browser.

The browser test opens the report from disk in headless Chromium (Debian's
`chromium`), driven over its DevTools pipe by the small client below. Without
chromium it skips, saying so, unless AIOCOP_REQUIRE_CHROMIUM is set, as in CI.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from aiocop._model.events import BlockingEventInfo, SlowTaskEvent
from aiocop._reporting import exports as _exports
from aiocop._reporting import html_report as _html
from aiocop._reporting import timeline as _timeline
from aiocop._reporting.report import Summary
from tests.support.pytester_args import QUIET

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "tests" / "data" / "speedscope-file-format-schema.json"
EVIL_TASK = "</script><script>document.title='pwned'</script>"
EVIL_CONTEXT = "<img src=x onerror=\"document.title='pwned2'\">"

# Stalls and calls sized in time, well past the 50 ms threshold: the same on any machine.
PLANTED = textwrap.dedent(
    f"""
    import asyncio
    import time

    import aiocop

    aiocop.register_context_provider(lambda: {{"request": {EVIL_CONTEXT!r}}})


    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:  # PLANTED-STALL
            pass


    async def blocking():
        time.sleep(0.25)  # PLANTED-CALL


    async def stalling():
        spin(0.5)


    async def main():
        await asyncio.create_task(blocking(), name={EVIL_TASK!r})
        await asyncio.create_task(stalling(), name="stalling")


    asyncio.run(main())
    """
)


def _line_of(marker: str) -> int:
    return next(n for n, line in enumerate(PLANTED.splitlines(), 1) if marker in line)


CALL_SITE = f"planted.py:{_line_of('PLANTED-CALL')}:blocking"
STALL_LINE = _line_of("PLANTED-STALL")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of the CLI on the planted program, writing every file: the folder they are in."""
    folder = tmp_path_factory.mktemp("html-report")
    (folder / "planted.py").write_text(PLANTED, encoding="utf-8")
    outputs = ["--html", "report.html", "--speedscope", "profile.json", "--folded", "stacks.folded"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiocop",
            "run",
            "--threshold-ms",
            "50",
            *outputs,
            "--json",
            "report.json",
            "planted.py",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return folder


def _embedded(page: str) -> dict[str, Any]:
    start = page.index('<script type="application/json" id="aiocop-data">') + len(
        '<script type="application/json" id="aiocop-data">'
    )
    data = page[start : page.index("</script>", start)]
    assert "<" not in data and ">" not in data and "&" not in data
    model: dict[str, Any] = json.loads(data)
    return model


def test_html_embeds_the_tables_rows_and_timed_steps(report: Path) -> None:
    model = _embedded((report / "report.html").read_text(encoding="utf-8"))
    table = json.loads((report / "report.json").read_text(encoding="utf-8"))
    # One model: the page's rows are --json's, in the CLI's order.
    assert model["summary"]["call_sites"] == table["call_sites"]
    sites = [row["call_site"] for row in model["summary"]["call_sites"]]
    assert CALL_SITE in sites
    assert model["facts"]["threshold_ms"] == 50
    assert model["facts"]["command"].startswith("python -m aiocop run ")
    by_reason = {step["reason"]: step for step in model["steps"]}
    call, stall = by_reason["io_blocking"], by_reason["cpu_blocking"]
    for step in (call, stall):
        assert 0 <= step["t0"] < step["t1"] <= model["facts"]["duration_ms"]
        assert step["rows"], step
    assert call["task"] == EVIL_TASK
    assert call["context"] == {"request": EVIL_CONTEXT}
    assert sites[call["rows"][0]] == CALL_SITE
    planted = call["calls"][0]
    assert planted["app_site"] == CALL_SITE
    assert planted["frames"][planted["app_frame"]][1] == _line_of("PLANTED-CALL")
    assert "PLANTED-CALL" in planted["source"]
    assert any(f[1] == STALL_LINE for sample in stall["samples"] for f in sample["frames"])


def test_html_never_writes_program_text_as_markup(report: Path) -> None:
    page = (report / "report.html").read_text(encoding="utf-8")
    assert EVIL_TASK not in page
    assert "<img" not in page
    assert page.isascii()
    assert _embedded(page)["steps"]  # ... yet the names are all there, as data


def test_embed_json_escapes_what_could_end_the_script() -> None:
    value = {"a</script>": "<!-- & \u2028 \ud800", "n": 1.5}
    text = _html.embed_json(value)
    assert not set(text) & set("<>&") and text.isascii()
    assert json.loads(text) == value


def test_folded_stacks_one_line_per_stack(report: Path) -> None:
    lines = (report / "stacks.folded").read_text(encoding="utf-8").splitlines()
    assert lines
    pattern = re.compile(r"^[^;\n]+(;[^;\n]+)* (\d+)$")
    total = 0
    for line in lines:
        match = pattern.match(line)
        assert match, line
        total += int(match.group(2))
    assert any(f"spin (planted.py:{STALL_LINE})" in line.rsplit(";", 1)[-1] for line in lines), lines
    # Weighed in microseconds of loop time: the steps' own, the blocking call's too (issue 37).
    model = _embedded((report / "report.html").read_text(encoding="utf-8"))
    drawn = [step for step in model["steps"] if step["flame"]]
    assert {step["reason"] for step in drawn} == {"io_blocking", "cpu_blocking"}
    assert total == pytest.approx(1000 * sum(step["elapsed_ms"] for step in drawn), abs=len(lines))


def test_frame_label_keeps_the_format_whatever_the_names() -> None:
    label = _exports.frame_label(["/app/we;ird\nname.py", 3, "f;g\u2028h"], "/app")
    assert label == "f_g_h (we_ird_name.py:3)"


def _check(value: Any, schema: dict[str, Any], root: dict[str, Any], where: str = "$") -> None:
    """A JSON-schema check of the keywords speedscope's schema uses; any other keyword fails the test."""
    known = {"$schema", "definitions", "title", "$ref", "type", "enum", "properties", "required", "items", "anyOf"}
    assert not set(schema) - known, f"the checker does not know {set(schema) - known}"
    if "$ref" in schema:
        _check(value, root["definitions"][schema["$ref"].removeprefix("#/definitions/")], root, where)
    if "anyOf" in schema:
        failures = []
        for option in schema["anyOf"]:
            try:
                _check(value, option, root, where)
                break
            except AssertionError as error:
                failures.append(str(error))
        else:
            raise AssertionError(f"{where}: matches none of anyOf: {failures}")
    types: dict[str, type | tuple[type, ...]] = {"object": dict, "array": list, "string": str, "number": (int, float)}
    if "type" in schema:
        assert isinstance(value, types[schema["type"]]) and not isinstance(value, bool), (
            f"{where}: not a {schema['type']}"
        )
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"
    for key in schema.get("required", ()):
        assert key in value, f"{where}: {key} missing"
    for key, sub in schema.get("properties", {}).items():
        if key in value:
            _check(value[key], sub, root, f"{where}.{key}")
    if "items" in schema:
        for n, item in enumerate(value):
            _check(item, schema["items"], root, f"{where}[{n}]")


def test_speedscope_file_follows_the_published_schema(report: Path) -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    document = json.loads((report / "profile.json").read_text(encoding="utf-8"))
    _check(document, schema, schema)
    with pytest.raises(AssertionError, match="unit"):  # the checker does fail a bad file
        _check({**document, "profiles": [{**document["profiles"][0], "unit": "parsecs"}]}, schema, schema)
    model = _embedded((report / "report.html").read_text(encoding="utf-8"))
    threads = {(s["loop"], s["thread"]) for s in model["steps"] if any(x["frames"] for x in s["samples"])}
    assert len(document["profiles"]) == len(threads) == 1  # one loop, one thread: one profile
    frames = document["shared"]["frames"]
    for profile in document["profiles"]:
        assert len(profile["samples"]) == len(profile["weights"])
        assert all(0 <= i < len(frames) for stack in profile["samples"] for i in stack)
        assert profile["unit"] == "milliseconds"
        drawn_ms = sum(step["elapsed_ms"] for step in model["steps"] if step["flame"])
        # (each weight rounded to the microsecond)
        assert profile["endValue"] == pytest.approx(drawn_ms, abs=0.001 * (len(profile["weights"]) + 1))
    assert {"name": "spin", "file": str(report / "planted.py"), "line": STALL_LINE} in frames


def test_a_hang_is_drawn_under_its_own_cause() -> None:
    # Another reason than aiocop's two (a newer aiocop's "hang"): kept, and named.
    summary = Summary()
    timeline = _timeline.Timeline(summary)
    timeline(SlowTaskEvent(900.0, 30.0, True, 0, "low", "hang", [], task_name="stuck"))
    timeline.finish()
    model = _timeline.build(timeline, _timeline.Facts("cmd", 30.0, "asyncio"))
    (step,) = model["steps"]
    assert step["reason"] == "hang" and model["causes"]["hang"] == "hang"
    assert step["t1"] - step["t0"] == pytest.approx(900.0, abs=1.0) or step["t0"] == 0.0
    assert "hang" in _html.render(model)


def test_a_step_past_the_bound_is_counted_not_kept() -> None:
    timeline = _timeline.Timeline(Summary(), limit=1)
    for _ in range(3):
        timeline(SlowTaskEvent(40.0, 30.0, True, 0, "low", "cpu_blocking", []))
    assert len(timeline.steps()) == 1 and timeline.dropped == 2


# its subprocess is given 60 s: the test's own timeout sits above it, so that bound fires first (issue 36)
@pytest.mark.timeout(90)
def test_an_unwritable_html_path_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("pass\n", encoding="utf-8")
    for flag in ("--html", "--speedscope", "--folded"):
        done = subprocess.run(
            [sys.executable, "-m", "aiocop", "run", flag, str(tmp_path / "missing" / "x"), "app.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert f"{flag}: cannot write a file in" in done.stderr


# its subprocess is given 60 s: the test's own timeout sits above it, so that bound fires first (issue 36)
@pytest.mark.timeout(90)
def test_a_failed_write_after_the_run_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("pass\n", encoding="utf-8")
    os.mkfifo(tmp_path / "nobody-reads")  # opened for writing without a reader: ENXIO, at once
    done = subprocess.run(
        [sys.executable, "-m", "aiocop", "run", "--html", "nobody-reads", "--folded", "ok.folded", "app.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "aiocop: could not write --html file:" in done.stderr
    assert (tmp_path / "ok.folded").exists()  # the others are still written


# --- the browser ---------------------------------------------------------------

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


class Browser:
    """Headless Chromium driven over `--remote-debugging-pipe` (fds 3 and 4, NUL-separated JSON)."""

    def __init__(self, chromium: str, profile: Path, timeout: float = 60.0) -> None:
        self.timeout = timeout
        commands_r, self._commands = os.pipe()
        self._replies, replies_w = os.pipe()

        def onto_3_and_4() -> None:  # in the child: the pipe ends where Chromium looks for them
            a, b = fcntl.fcntl(commands_r, fcntl.F_DUPFD, 10), fcntl.fcntl(replies_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        profile.mkdir(parents=True, exist_ok=True)
        self.log = profile.with_name(profile.name + ".log")
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                close_fds=False,  # fds 3 and 4 are made in the child; every other fd of ours is non-inheritable
                preexec_fn=onto_3_and_4,  # noqa: PLW1509 - a test, before any thread of its own
            )
        os.close(commands_r)
        os.close(replies_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _message(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            # poll, not select: a long test session's descriptors can be numbered past select's 1024.
            poller = select.poll()
            poller.register(self._replies, select.POLLIN)
            ready = poller.poll(self.timeout * 1000)
            chunk = os.read(self._replies, 1 << 20) if ready else b""
            if not chunk:
                raise AssertionError(f"chromium did not answer; its log: {self.log.read_text(errors='replace')}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        parsed: dict[str, Any] = json.loads(message)
        return parsed

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        command: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            command["sessionId"] = session
        os.write(self._commands, json.dumps(command).encode() + b"\0")
        while True:
            message = self._message()
            if message.get("id") == self._next_id:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result
            self.events.append(message)

    def wait_for(self, method: str) -> None:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._message())

    def open(self, url: str, width: int = 1280, height: int = 900) -> str:
        """Load `url` in the first tab; the tab's session (`navigate` loads the next page in it)."""
        targets = self.call("Target.getTargets")["targetInfos"]
        target = next((t["targetId"] for t in targets if t["type"] == "page"), None)
        if target is None:
            target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session: str = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=session)
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.call("Emulation.setDeviceMetricsOverride", metrics, session)
        self.navigate(session, url)
        return session

    def navigate(self, session: str, url: str) -> None:
        self.events = [e for e in self.events if e.get("method") != "Page.loadEventFired"]
        self.call("Page.navigate", {"url": url}, session)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, session: str, expression: str) -> Any:
        reply = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        assert "exceptionDetails" not in reply, reply
        return reply["result"].get("value")

    def screenshot(self, session: str, path: Path) -> None:
        size = self.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}, session
        )
        path.write_bytes(base64.b64decode(shot["data"]))

    def problems(self) -> list[str]:
        """What the page said went wrong: uncaught errors, console errors and warnings, CSP and load failures."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "warning", "assert"):
                found.append(json.dumps(params["args"])[:500])
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                found.append(params["entry"]["text"])
        return found

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except Exception:  # whatever went wrong, the browser is stopped
            self.process.kill()
        try:
            self.process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._replies)


@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser's path (first: a run without it skips before making the reports)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("AIOCOP_REQUIRE_CHROMIUM"):
            pytest.fail("AIOCOP_REQUIRE_CHROMIUM is set but chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); CI installs it")
    return found


# Read once the page has loaded: what the browser drew, and what it does when clicked.
_INSPECT = """JSON.stringify((() => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const one = (s) => { const e = document.querySelector(s); return e ? box(e) : null; };
  const out = {
    rendered: document.documentElement.dataset.rendered, title: document.title,
    injected: document.querySelectorAll("img").length + document.scripts.length,
    timeline: one("#timeline-svg"), flame: one("#flame-svg"),
    bars: [...document.querySelectorAll("#timeline-svg rect.step-bar")].map(
      (r) => [r.getAttribute("class"), box(r)[0], r.querySelector("title").textContent]),
    frames: [...document.querySelectorAll("#flame-svg rect.frame")].map(
      (r) => [r.querySelector("title").textContent, box(r)[0]]),
    rows: [...document.querySelectorAll("#sites tbody tr.site")].map((r) => r.cells[0].textContent),
  };
  const row = [...document.querySelectorAll("#sites tbody tr.site")].find((r) => r.cells[0].textContent === %s);
  row.click();
  out.marked = [...document.querySelectorAll("tr.detail li.app")].map((li) => li.textContent);
  out.detail = document.querySelector("tr.detail").textContent;
  const spin = [...document.querySelectorAll("#flame-svg rect.frame")].find(
    (r) => r.querySelector("title").textContent.startsWith("planted.py:%d spin"));
  spin.dispatchEvent(new MouseEvent("click"));
  out.zoomed = [...document.querySelectorAll("#flame-svg rect.frame")].filter(
    (r) => r.querySelector("title").textContent.startsWith("planted.py:%d spin")).map((r) => box(r)[0]);
  out.svgWidth = one("#flame-svg")[0];
  return out;
})())"""


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of `make demo`'s app, as its how-to page shows it."""
    page = tmp_path_factory.mktemp("demo-report") / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "aiocop", "run", "--html", str(page), "examples/demo_app.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return page


# The demo's planted lines (examples/demo_app.py), found by their code.
_DEMO = (ROOT / "examples" / "demo_app.py").read_text(encoding="utf-8").splitlines()
DEMO_SLEEP, DEMO_STALL = (
    next(n for n, line in enumerate(_DEMO, 1) if code in line) for code in ("time.sleep(0.05)", "total += i * i % 7")
)
_INSPECT_DEMO = """JSON.stringify({
  rendered: document.documentElement.dataset.rendered,
  rows: [...document.querySelectorAll("#sites tbody tr.site")].map(
    (r) => [r.cells[0].textContent, r.cells[1].textContent]),
  bars: [...document.querySelectorAll("#timeline-svg rect.step-bar")].map(
    (r) => [r.getAttribute("class"), r.getBoundingClientRect().width]),
  frames: [...document.querySelectorAll("#flame-svg rect.frame")].map(
    (r) => [r.querySelector("title").textContent, r.getBoundingClientRect().width]),
})"""


def test_report_renders_in_headless_chromium(chromium: str, report: Path, demo_report: Path) -> None:
    browser = Browser(chromium, report / "profile")
    try:
        session = browser.open((report / "report.html").as_uri())
        seen = json.loads(browser.evaluate(session, _INSPECT % (json.dumps(CALL_SITE), STALL_LINE, STALL_LINE)))
        browser.screenshot(session, report / "report.png")
        browser.navigate(session, demo_report.as_uri())
        demo = json.loads(browser.evaluate(session, _INSPECT_DEMO))
        browser.screenshot(session, demo_report.with_suffix(".png"))
        ranking = report / "ranking.html"
        ranking.write_text(_html.render(_dumps_and_sleep()), encoding="utf-8")
        browser.navigate(session, ranking.as_uri())
        ranked = json.loads(browser.evaluate(session, _INSPECT_DEMO))
        problems = browser.problems()
    finally:
        browser.close()
    # The demo app: its planted calls in the table, its stall in the flame graph, both on the timeline.
    assert demo["rendered"] == "yes"
    assert [f"examples/demo_app.py:{DEMO_SLEEP}:report", "time.sleep"] in demo["rows"]
    assert [f"examples/demo_app.py:{DEMO_STALL}:stats", "stall"] in demo["rows"]
    assert {"socket.gethostbyname", "os.stat", "subprocess.Popen", "open"} <= {event for _, event in demo["rows"]}
    demo_causes = {bar[0].split()[-1] for bar in demo["bars"] if bar[1] > 0}
    assert {"cause-blocking-call", "cause-stall"} <= demo_causes
    assert any(t.startswith(f"examples/demo_app.py:{DEMO_STALL} stats") and w > 0 for t, w in demo["frames"])
    # Issue 37: the flame graph weighs loop time, as the table: json.dumps's 2.4 s above the sleep's 1.3 s.
    assert ranked["rendered"] == "yes"
    widths = {title.partition("\n")[0]: (title, width) for title, width in ranked["frames"]}
    (dumps_title, dumps_width), (nap_title, nap_width) = widths["app.py:13 encode"], widths["app.py:19 nap"]
    assert "2400.0 ms, 64.9%" in dumps_title and "1300.0 ms, 35.1%" in nap_title
    assert dumps_width == pytest.approx(nap_width * 24 / 13, rel=0.02)
    assert seen["rendered"] == "yes", seen["rendered"]
    assert problems == []
    assert seen["title"].startswith("aiocop report: python -m aiocop run")  # not 'pwned'
    assert seen["injected"] == 2  # the page's two script elements; no image, no script from a name
    assert seen["timeline"][0] > 0 and seen["timeline"][1] > 0
    assert seen["flame"][0] > 0 and seen["flame"][1] > 0
    causes = {bar[0].split()[-1] for bar in seen["bars"]}
    assert {"cause-blocking-call", "cause-stall"} <= causes, seen["bars"]
    assert all(bar[1] > 0 for bar in seen["bars"])
    call_bar = next(bar[2] for bar in seen["bars"] if "cause-blocking-call" in bar[0])
    assert EVIL_TASK in call_bar and CALL_SITE in call_bar and EVIL_CONTEXT in call_bar  # the hover, as text
    assert CALL_SITE in seen["rows"]
    assert any(f"planted.py:{STALL_LINE} spin" in title and width > 0 for title, width in seen["frames"])
    assert seen["marked"] and all(f"planted.py:{_line_of('PLANTED-CALL')} blocking" in m for m in seen["marked"])
    assert EVIL_TASK in seen["detail"]
    assert seen["zoomed"] and seen["zoomed"][0] == pytest.approx(seen["svgWidth"], rel=0.01)  # zoomed: full width
    png = (report / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


# --- the pytest plugin: one report for the session --------------------------------

PLUGIN_TESTS = textwrap.dedent(
    """
    import asyncio
    import time


    def test_blocks():
        async def body():
            time.sleep(0.01)  # PLUGIN-CALL

        asyncio.run(body())


    def test_fine():
        asyncio.run(asyncio.sleep(0))
    """
)


@pytest.mark.timeout(150)  # its pytest run is given 120 s; the test's own timeout sits above it
def test_pytest_plugin_writes_one_report_for_the_session(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_planted=PLUGIN_TESTS)
    result = pytester.runpytest_subprocess(*QUIET, "--aiocop", "--aiocop-html=session.html", timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the planted call fails its test, as without --aiocop-html
    result.stdout.fnmatch_lines(["aiocop: wrote the HTML report *session.html", "*1 failed, 1 passed*"])
    model = _embedded((pytester.path / "session.html").read_text(encoding="utf-8"))
    written = (pytester.path / "test_planted.py").read_text(encoding="utf-8").splitlines()
    line = next(n for n, text in enumerate(written, 1) if "PLUGIN-CALL" in text)
    assert [row["call_site"] for row in model["summary"]["call_sites"]] == [f"test_planted.py:{line}:body"]
    (step,) = model["steps"]
    assert step["reason"] == "io_blocking" and step["calls"][0]["app_site"] == f"test_planted.py:{line}:body"
    assert model["facts"]["threshold_ms"] is None
    assert model["facts"]["command"].startswith("pytest ")


@pytest.mark.timeout(150)  # its pytest run is given 120 s; the test's own timeout sits above it
def test_pytest_plugin_refuses_an_html_path_it_cannot_write(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_planted=PLUGIN_TESTS)
    result = pytester.runpytest_subprocess(*QUIET, "--aiocop", "--aiocop-html=missing/session.html", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--aiocop-html: cannot write a file in*missing*"])


Frames = list[tuple[str, int, str]]


def _stall(thread: str, samples: list[tuple[Frames, int]], elapsed_ms: float = 100.0, site: str = "") -> SlowTaskEvent:
    return SlowTaskEvent(
        elapsed_ms,
        30.0,
        True,
        0,
        "low",
        "cpu_blocking",
        [],
        cpu_stack_samples=[{"trace": "", "entry_point": "", "count": n, "frames": frames} for frames, n in samples],
        thread_name=thread,
        loop="L@1",
        call_site=site,
    )


def _model(*events: SlowTaskEvent) -> dict[str, Any]:
    timeline = _timeline.Timeline(Summary())
    for event in events:
        timeline(event)
    model = _timeline.build(timeline, _timeline.Facts("cmd", 30.0, "asyncio"))
    model["facts"]["cwd"] = "/app"
    return model


def test_speedscope_has_one_profile_per_loop_thread_and_folded_merges_them() -> None:
    inner, outer = ("/app/a.py", 3, "inner"), ("/app/a.py", 9, "outer")
    model = _model(
        _stall("one", [([inner, outer], 2)], 120.0),
        _stall("two", [([inner, outer], 3), ([outer], 1)], 200.0),  # 200 ms: 150 and 50, as sampled
        _stall("two", [([outer], 1)], 40.0),
    )
    document = _exports.speedscope(model)
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    _check(document, schema, schema)
    names = [p["name"] for p in document["profiles"]]
    assert names == ["L@1 on thread one", "L@1 on thread two"]
    frames = [f["name"] for f in document["shared"]["frames"]]
    two = document["profiles"][1]
    # In the steps' order (speedscope's time-order view), each weighing its share of its step's time.
    assert [[frames[i] for i in stack] for stack in two["samples"]] == [["outer", "inner"], ["outer"], ["outer"]]
    assert two["unit"] == "milliseconds" and two["weights"] == [150.0, 50.0, 40.0] and two["endValue"] == 240.0
    assert _exports.folded(model) == "outer (a.py:9) 90000\nouter (a.py:9);inner (a.py:3) 270000\n"


def _dumps_and_sleep() -> dict[str, Any]:
    """2.4 s of json.dumps, sampled 3 times (it holds the GIL), then a 1.3 s sleep sampled 60 times (issue 37)."""
    dumps = [("/lib/json/encoder.py", 258, "iterencode"), ("/lib/json/__init__.py", 231, "dumps")]
    encode, nap = ("/app/app.py", 13, "encode"), ("/app/app.py", 19, "nap")
    sleep: BlockingEventInfo = {
        "event": "time.sleep(1.3)",
        "trace": "",
        "entry_point": "/app/app.py:19:nap",
        "severity": 50,
    }
    return _model(
        _stall("main", [([*dumps, encode], 3)], 2400.0, "/app/app.py:13:encode"),
        SlowTaskEvent(
            1300.0,
            30.0,
            True,
            50,
            "high",
            "io_blocking",
            [{**sleep, "frames": [nap]}],
            cpu_stack_samples=[{"trace": "", "entry_point": "", "count": 60, "frames": [nap]}],
            thread_name="main",
            loop="L@1",
        ),
    )


def test_every_picture_ranks_steps_by_loop_time_not_samples() -> None:
    model = _dumps_and_sleep()
    table = [row["call_site"] for row in model["summary"]["call_sites"]]
    assert table == ["/app/app.py:13:encode", "/app/app.py:19:nap"]
    ranked = sorted(_exports.folded(model).splitlines(), key=lambda line: -int(line.rpartition(" ")[2]))
    assert [line.rpartition(" ")[2] for line in ranked] == ["2400000", "1300000"]
    assert ranked[0].startswith("encode (app.py:13);dumps")
    (profile,) = _exports.speedscope(model)["profiles"]
    assert profile["weights"] == [2400.0, 1300.0]
    # The page adds up what aiocop weighed: the stacks of its steps, in ms.
    steps = _html.page_data(model)["steps"]
    assert [step["flame"] for step in steps] == [
        [{"from": "samples", "index": 0, "ms": 2400.0}],
        [{"from": "samples", "index": 0, "ms": 1300.0}],
    ]
