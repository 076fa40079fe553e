// aiocop's HTML report: draws the model embedded in the page (JSON, never HTML).
// Every text from the program is set with textContent, never parsed as markup.
"use strict";
(function () {
  const errors = [];
  window.addEventListener("error", (e) => errors.push(String(e.message || e.type)), true);

  const model = JSON.parse(document.getElementById("aiocop-data").textContent);
  const facts = model.facts, rows = model.summary.call_sites, steps = model.steps;
  const SVG = "http://www.w3.org/2000/svg";
  const IMPACT = { low: 0, medium: 1, high: 2 };

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function causeOf(reason) { return model.causes[reason] || reason; }
  function causeClass(reason) {
    const known = { io_blocking: "blocking-call", cpu_blocking: "stall", hang: "hang" };
    return "cause-" + (known[reason] || "other");
  }
  function ms(x) { return Number(x).toFixed(1); }
  function shortPath(file) {
    const prefix = facts.cwd.endsWith("/") ? facts.cwd : facts.cwd + "/";
    return file.startsWith(prefix) ? file.slice(prefix.length) : file;
  }
  function frameText(f) { return shortPath(f[0]) + ":" + f[1] + " " + f[2]; }
  // A flame graph's frame: the function first (what a narrow box keeps), the stdlib's and packages' paths short.
  function flameLabel(f) {
    return f[2] + " " + shortPath(f[0]).replace(/^.*\/(site-packages|dist-packages|lib\/python[0-9.]+)\//, "") + ":" + f[1];
  }

  // --- the run's facts -------------------------------------------------------
  const factList = [
    ["command", facts.command], ["Python", facts.python], ["loop", facts.loop],
    ["threshold", facts.threshold_ms === null ? "off (no stall watchdog)" : facts.threshold_ms + " ms"], ["duration", ms(facts.duration_ms) + " ms"],
    ["started", facts.started], ["exit status", facts.exit_status === null ? "-" : facts.exit_status],
    ["aiocop", facts.aiocop],
  ];
  const dl = document.getElementById("facts");
  for (const [k, v] of factList) dl.append(el("dt", {}, k), el("dd", {}, v));

  // --- the call sites table --------------------------------------------------
  const columns = [
    ["call site", "call_site", false], ["events", "event", false], ["count", "count", true],
    ["steps", "steps", true], ["steps ms", "total_ms", true], ["worst step ms", "worst_ms", true],
    ["impact", "impact", false],
  ];
  const calls = rows.filter((r) => !(r.event === "stall")).reduce((n, r) => n + r.count, 0);
  const stalls = rows.filter((r) => r.event === "stall").reduce((n, r) => n + r.count, 0);
  document.getElementById("sites-note").textContent = rows.length
    ? `${calls} blocking call(s) and ${stalls} stall(s) at ${rows.length} call site(s). ` +
      "ms: how long the steps where the line blocked held the loop. Click a row for its steps' traces."
    : "No blocking calls or stalls were seen on the event loop.";
  const table = document.getElementById("sites"), tbody = table.tBodies[0];
  const headRow = table.tHead.rows[0];
  let order = rows.map((_, i) => i), sortKey = null, sortDown = true;
  const open = new Set();
  columns.forEach(([label, key, numeric]) => {
    const th = el("th", { class: numeric ? "num" : "", "data-key": key }, label);
    th.addEventListener("click", () => {
      sortDown = sortKey === key ? !sortDown : numeric || key === "impact";
      sortKey = key;
      const value = (r) => (key === "impact" ? IMPACT[r.impact] : r[key]);
      order.sort((a, b) => {
        const x = value(rows[a]), y = value(rows[b]);
        const c = x < y ? -1 : x > y ? 1 : a - b;
        return sortDown ? -c : c;
      });
      for (const h of headRow.cells) h.removeAttribute("aria-sort");
      th.setAttribute("aria-sort", sortDown ? "descending" : "ascending");
      drawTable();
    });
    headRow.append(th);
  });

  function stepsOf(i) { return steps.filter((s) => s.rows.includes(i)); }

  function traceList(frames, app) {
    const ol = el("ol", { class: "trace mono" });
    frames.forEach((f, j) => ol.append(el("li", j === app ? { class: "app" } : {}, frameText(f))));
    return ol;
  }

  function stepDetail(step, row) {
    const box = el("div", { class: "step" });
    const who = step.task === null ? "a callback" : "task " + step.task;
    box.append(el("div", { class: "what" },
      `${causeOf(step.reason)} at ${ms(step.t0)} ms: loop held ${ms(step.elapsed_ms)} ms ` +
      `(impact ${step.impact}), ${who}, thread ${step.thread}, loop ${step.loop}`));
    const context = Object.entries(step.context);
    if (context.length) box.append(el("div", { class: "mono" }, "context: " + context.map(([k, v]) => k + "=" + v).join(", ")));
    if (step.culprit) box.append(el("div", {}, step.culprit));
    const mine = row.event === "stall" ? [] : step.calls.filter((c) => c.app_site === row.call_site);
    for (const call of mine) {
      box.append(el("div", {}, el("code", {}, call.event), " at ", el("code", {}, call.app_site)));
      if (call.source) box.append(el("pre", { class: "src" }, call.source));
      if (call.app_site !== call.entry_point) box.append(el("div", { class: "muted" }, "blocked in " + call.entry_point));
      box.append(call.frames.length ? traceList(call.frames, call.app_frame) : el("div", { class: "mono" }, call.trace));
    }
    if (row.event === "stall" || !mine.length) {
      for (const sample of step.samples.slice(0, 3)) {
        box.append(el("div", {}, `sampled ${sample.count}x, at `, el("code", {}, sample.app_site)));
        box.append(sample.frames.length ? traceList(sample.frames, sample.app_frame) : el("div", { class: "mono" }, sample.trace));
      }
    }
    return box;
  }

  function detailRow(i) {
    const row = rows[i], mine = stepsOf(i), td = el("td", { colspan: columns.length });
    if (!mine.length) td.append(el("div", { class: "muted" }, "Example trace: " + row.example_trace));
    for (const step of mine.slice(0, 20)) td.append(stepDetail(step, row));
    if (mine.length > 20) td.append(el("div", { class: "muted" }, `... and ${mine.length - 20} more step(s)`));
    if (mine.some((s) => s.flame.length)) {
      const button = el("button", { type: "button" }, "Flame graph of this call site");
      button.addEventListener("click", () => { scope.value = String(i); drawFlame(null); flameBox.scrollIntoView(); });
      td.append(button);
    }
    return el("tr", { class: "detail" }, td);
  }

  function drawTable() {
    tbody.replaceChildren();
    for (const i of order) {
      const r = rows[i];
      const tr = el("tr", { class: "site", id: "site-" + i },
        el("td", { class: "mono" }, r.call_site), el("td", {}, r.event), el("td", { class: "num" }, r.count),
        el("td", { class: "num" }, r.steps), el("td", { class: "num" }, ms(r.total_ms)),
        el("td", { class: "num" }, ms(r.worst_ms)), el("td", { class: "impact-" + r.impact }, r.impact));
      tr.addEventListener("click", () => { open.has(i) ? open.delete(i) : open.add(i); drawTable(); });
      tbody.append(tr);
      if (open.has(i)) tbody.append(detailRow(i));
    }
  }
  drawTable();

  // --- the timeline: one lane per loop and thread ------------------------------
  const legend = document.getElementById("legend");
  const reasons = [...new Set(["io_blocking", "cpu_blocking", "hang", ...steps.map((s) => s.reason)])];
  for (const r of reasons) legend.append(el("span", {}, el("i", { class: causeClass(r) }), causeOf(r)));
  (function drawTimeline() {
    const W = 1200, LABEL = 16, LANE = 26, AXIS = 22;
    const lanes = [...new Set(steps.map((s) => `loop ${s.loop} on thread ${s.thread}`))];
    const span = Math.max(facts.duration_ms, 1);
    const height = AXIS + lanes.length * (LABEL + LANE) + 4;
    const root = svg("svg", { id: "timeline-svg", viewBox: `0 0 ${W} ${height}`, role: "img" });
    for (let k = 0; k <= 5; k++) {
      const x = (W - 60) * k / 5 + 2;
      root.append(svg("line", { x1: x, x2: x, y1: AXIS - 4, y2: height, stroke: "#e4e4e4" }));
      root.append(svg("text", { x: x, y: 12 }, `${ms(span * k / 5)} ms`));
    }
    lanes.forEach((lane, n) => {
      const y = AXIS + n * (LABEL + LANE);
      root.append(svg("text", { class: "lane-label", x: 2, y: y + 12 }, lane));
      root.append(svg("rect", { x: 0, y: y + LABEL, width: W, height: LANE, fill: "#f4f4f4" }));
    });
    for (const s of steps) {
      const n = lanes.indexOf(`loop ${s.loop} on thread ${s.thread}`);
      const x = 2 + (W - 60) * s.t0 / span, w = Math.max(3, (W - 60) * (s.t1 - s.t0) / span);
      const bar = svg("rect", {
        class: "step-bar " + causeClass(s.reason), x: x, y: AXIS + n * (LABEL + LANE) + LABEL + 2,
        width: w, height: LANE - 4, "data-step": s.id,
      });
      const context = Object.entries(s.context).map(([k, v]) => `\n${k}=${v}`).join("");
      bar.append(svg("title", {},
        `${causeOf(s.reason)}: loop held ${ms(s.elapsed_ms)} ms at ${ms(s.t0)} ms (impact ${s.impact})\n` +
        `task: ${s.task === null ? "(a callback)" : s.task}\nsite: ${s.site}` + (context ? "\ncontext:" + context : "")));
      bar.addEventListener("click", () => {
        if (!s.rows.length) return;
        open.add(s.rows[0]); drawTable();
        document.getElementById("site-" + s.rows[0]).scrollIntoView();
      });
      root.append(bar);
    }
    const box = document.getElementById("timeline");
    box.append(steps.length ? root : el("p", { class: "muted" }, "No step held a loop past the threshold."));
  })();

  // --- the flame graph (icicle: the loop's outermost frame on top) --------------
  const scope = document.getElementById("flame-scope"), flameBox = document.getElementById("flame");
  scope.append(el("option", { value: "all" }, "the whole run"));
  rows.forEach((r, i) => {
    if (stepsOf(i).some((s) => s.flame.length)) scope.append(el("option", { value: String(i) }, r.call_site));
  });
  // Each step's stacks weigh the loop time it took (weighed by aiocop: step.flame), not its sample counts:
  // C code holding the GIL is sampled a few times however long it runs, a sleep at every look.
  function tree(selected) {
    const top = { name: "all steps", full: "all steps", value: 0, children: new Map(), parent: null, app: false };
    for (const s of selected) for (const weighed of s.flame) {
      const stack = s[weighed.from][weighed.index];
      let node = top;
      top.value += weighed.ms;
      for (let j = stack.frames.length - 1; j >= 0; j--) {
        const key = frameText(stack.frames[j]);
        let child = node.children.get(key);
        if (!child) {
          child = { name: flameLabel(stack.frames[j]), full: key, value: 0, children: new Map(), parent: node, app: false };
          node.children.set(key, child);
        }
        child.value += weighed.ms;
        child.app = child.app || j === stack.app_frame;
        node = child;
      }
    }
    return top;
  }
  function drawFlame(focus) {
    const selected = scope.value === "all" ? steps : stepsOf(Number(scope.value));
    const top = focus || tree(selected);
    const W = 1200, H = 20;
    const chain = [];
    for (let n = top.parent; n; n = n.parent) chain.unshift(n);
    const bars = [];
    chain.forEach((n, d) => bars.push([n, 0, W, d]));
    (function layout(node, x, width, depth) {
      bars.push([node, x, width, depth]);
      let cx = x;
      for (const child of [...node.children.values()].sort((a, b) => b.value - a.value)) {
        const cw = width * child.value / node.value;
        if (cw >= 0.5) layout(child, cx, cw, depth + 1);
        cx += cw;
      }
    })(top, 0, W, chain.length);
    const depth = Math.max(...bars.map((b) => b[3])) + 1;
    const root = svg("svg", { id: "flame-svg", viewBox: `0 0 ${W} ${depth * H}`, role: "img" });
    for (const [node, x, width, d] of bars) {
      const hue = node.app ? 210 : 20 + (node.name.length * 7) % 35;
      const g = svg("g", {});
      const rect = svg("rect", {
        class: "frame", x: x, y: d * H, width: width, height: H - 1,
        fill: node.parent === null ? "#bbb" : `hsl(${hue}, 80%, ${node.app ? 72 : 62}%)`,
      });
      const share = (100 * node.value / (chain[0] || top).value).toFixed(1);
      rect.append(svg("title", {}, `${node.full}\n${ms(node.value)} ms, ${share}%` + (node.app ? "\nthe application's code" : "")));
      rect.addEventListener("click", () => drawFlame(node === top && node.parent ? node.parent : node));
      g.append(rect);
      if (width > 40) {
        const fit = Math.floor((width - 6) / 6.7);
        g.append(svg("text", { x: x + 3, y: d * H + 14 }, node.name.length > fit ? node.name.slice(0, fit - 1) + "\u2026" : node.name));
      }
      root.append(g);
    }
    flameBox.replaceChildren(top.value ? root : el("p", { class: "muted" }, "No stacks to draw: no step was seen holding a loop."));
  }
  scope.addEventListener("change", () => drawFlame(null));
  document.getElementById("flame-reset").addEventListener("click", () => drawFlame(null));
  drawFlame(null);

  const dropped = model.steps_dropped;
  document.getElementById("footer").textContent =
    `${steps.length} step(s) drawn` + (dropped ? `; ${dropped} more were counted in the table but not kept` : "") +
    `. Written by aiocop ${facts.aiocop}.`;
  // Read by aiocop's browser test: drawn to the end, with no error on the way.
  document.documentElement.dataset.rendered = errors.length ? "errors: " + errors.join("; ") : "yes";
})();
