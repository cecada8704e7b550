// The operator pages (alerts, rules, targets, service discovery, TSDB status, configuration,
// flags, runtime and build information) and the Graphite page (metric tree and /render graphs). Each reads
// the same HTTP API any client reads.
"use strict";

/** A text box filtering rows by substring, and the rows it filters. */
function filterBox(placeholder, onInput) {
  return Strata.el("input", { type: "search", placeholder, size: 40, oninput: (e) => onInput(e.target.value.toLowerCase()) });
}

/** How often the targets page reads the targets again, while "auto-refresh" is on. */
const TARGETS_REFRESH_MS = 5000;

Strata.pages.targets = async function (main) {
  let pools = new Map();
  let unhealthyOnly = false, needle = "";
  const list = Strata.el("div");
  const load = async () => {
    const data = await Strata.api("api/v1/targets", { state: "active" });
    pools = new Map();
    for (const t of data.activeTargets) {
      if (!pools.has(t.scrapePool)) pools.set(t.scrapePool, []);
      pools.get(t.scrapePool).push(t);
    }
    draw();
  };
  const draw = () => {
    list.textContent = "";
    if (!pools.size) list.append(Strata.el("p", { class: "muted" }, "No scrape targets: scrape_configs in --config define them."));
    for (const [pool, targets] of [...pools].sort((a, b) => a[0].localeCompare(b[0]))) {
      const up = targets.filter((t) => t.health === "up").length;
      const shown = targets.filter((t) => (!unhealthyOnly || t.health !== "up") && (!needle || (t.scrapeUrl + JSON.stringify(t.labels)).toLowerCase().includes(needle)));
      if (!shown.length && (unhealthyOnly || needle)) continue;
      const rows = shown.map((t) => [
        Strata.el("a", { href: t.scrapeUrl }, t.scrapeUrl),
        Strata.el("span", { class: `badge ${t.health}` }, t.health.toUpperCase()),
        Strata.el("div", {}, Strata.labelChips(t.labels)),
        t.lastScrape.startsWith("0001") ? "never" : Strata.ago(Date.parse(t.lastScrape)),
        { class: "num", text: `${(t.lastScrapeDuration * 1000).toFixed(1)}ms` },
        `${t.scrapeInterval} / ${t.scrapeTimeout}`,
        { class: "error", text: t.lastError || "" },
      ]);
      list.append(Strata.el("div", { class: "panel", "data-pool": pool },
        Strata.el("h2", {}, `${pool} `, Strata.el("span", { class: up === targets.length ? "muted" : "error" }, `(${up}/${targets.length} up)`)),
        Strata.table(["Endpoint", "State", "Labels", "Last scrape", "Scrape duration", "Interval / timeout", "Error"], rows)));
    }
  };
  const unhealthy = Strata.el("label", {}, Strata.el("input", { type: "checkbox", onchange: (e) => { unhealthyOnly = e.target.checked; draw(); } }), " unhealthy only");
  let timer = null;
  const auto = Strata.el("input", { type: "checkbox", checked: true, onchange: (e) => { clearInterval(timer); if (e.target.checked) timer = setInterval(refresh, TARGETS_REFRESH_MS); } });
  const error = Strata.el("div", { class: "error" });
  const refresh = () => load().then(() => { error.textContent = ""; }, (e) => { error.textContent = "Error: " + e.message; });
  main.append(Strata.el("h1", {}, "Targets"), Strata.el("div", { class: "row" }, filterBox("filter by endpoint or labels", (v) => { needle = v; draw(); }), unhealthy, Strata.el("label", {}, auto, ` auto-refresh (${TARGETS_REFRESH_MS / 1000}s)`)), error, list);
  await load();
  timer = setInterval(refresh, TARGETS_REFRESH_MS);
};

Strata.pages["service-discovery"] = async function (main) {
  const data = await Strata.api("api/v1/targets", { state: "any" });
  const pools = new Map();
  const pool = (name) => pools.get(name) || pools.set(name, { active: [], dropped: [] }).get(name);
  for (const t of data.activeTargets) pool(t.scrapePool).active.push(t);
  for (const t of data.droppedTargets) pool(t.scrapePool).dropped.push(t);
  main.append(Strata.el("h1", {}, "Service discovery"));
  if (!pools.size) main.append(Strata.el("p", { class: "muted" }, "No scrape configurations."));
  const index = Strata.el("ul");
  main.append(index);
  for (const [name, p] of [...pools].sort((a, b) => a[0].localeCompare(b[0]))) {
    index.append(Strata.el("li", {}, Strata.el("a", { href: `#sd-${encodeURIComponent(name)}` }, name), ` (${p.active.length} / ${p.active.length + p.dropped.length} active targets)`));
    const rows = p.active.map((t) => [Strata.el("div", {}, Strata.labelChips(t.discoveredLabels)), Strata.el("div", {}, Strata.labelChips(t.labels))])
      .concat(p.dropped.map((t) => [Strata.el("div", {}, Strata.labelChips(t.discoveredLabels)), { class: "muted", text: "Dropped" }]));
    main.append(Strata.el("div", { class: "panel", id: `sd-${encodeURIComponent(name)}` }, Strata.el("h2", {}, name), Strata.table(["Discovered labels", "Target labels"], rows)));
  }
};

Strata.pages["tsdb-status"] = async function (main) {
  const d = await Strata.api("api/v1/status/tsdb", { limit: 10 });
  const h = d.headStats;
  const time = (ms) => (ms ? `${Strata.formatTime(ms)} (${ms})` : "—");
  main.append(Strata.el("h1", {}, "TSDB status"),
    Strata.el("h2", {}, "Head"),
    Strata.table(["Series", "Label pairs", "Min time", "Max time"], [[String(h.numSeries), String(h.numLabelPairs), time(h.minTime), time(h.maxTime)]]));
  const s = d.strata;
  if (s) {
    main.append(Strata.el("h2", {}, "Write-ahead log"),
      Strata.table(["Segments", "First", "Last", "Size", "Records replayed at start"], [[String(s.wal.segments.length), String(s.wal.segments[0] ?? "—"), String(s.wal.segments[s.wal.segments.length - 1] ?? "—"), Strata.formatBytes(s.wal.bytes), String(s.wal.replayedRecords)]]));
    main.append(Strata.el("h2", {}, "Head memory"),
      Strata.table(Object.keys(s.headMemory), [Object.values(s.headMemory).map((b) => ({ class: "num", text: Strata.formatBytes(b) }))]));
    const blockRows = (blocks) => blocks.map((b) => [Strata.el("span", { class: "mono" }, b.ulid), time(b.minTime), time(b.maxTime), Strata.formatDuration(b.maxTime - b.minTime), { class: "num", text: String(b.numSeries) }, { class: "num", text: String(b.numSamples) }, { class: "num", text: Strata.formatBytes(b.bytes) }, String(b.level)]);
    const headers = ["Block", "Min time", "Max time", "Span", "Series", "Samples", "Size", "Level"];
    main.append(Strata.el("h2", {}, `Blocks (${s.blocks.length}, ${Strata.formatBytes(s.blocks.reduce((n, b) => n + b.bytes, 0))})`),
      s.blocks.length ? Strata.table(headers, blockRows(s.blocks)) : Strata.el("p", { class: "muted" }, "No blocks yet: the head has not been compacted."));
    for (const t of s.tiers) {
      main.append(Strata.el("h2", {}, `Rollup tier ${t.name}: ${t.blocks.length} blocks, ${Strata.formatBytes(t.bytes)}, kept ${t.retention}`),
        t.blocks.length ? Strata.table(headers, blockRows(t.blocks)) : Strata.el("p", { class: "muted" }, "No blocks yet."));
    }
  }
  const top = (title, rows, what) => {
    main.append(Strata.el("h2", {}, title), Strata.table([what, "Count"], rows.map((r) => [Strata.el("span", { class: "mono" }, r.name), { class: "num", text: String(r.value) }])));
  };
  top("Top 10 series count by metric names", d.seriesCountByMetricName, "Name");
  top("Top 10 label names with value count", d.labelValueCountByLabelName, "Name");
  top("Top 10 series count by label value pairs", d.seriesCountByLabelValuePair, "Name");
};

Strata.pages.config = async function (main) {
  const d = await Strata.api("api/v1/status/config");
  const pre = Strata.el("pre", {}, d.yaml);
  const copy = Strata.el("button", { onclick: () => navigator.clipboard && navigator.clipboard.writeText(d.yaml) }, "Copy to clipboard");
  main.append(Strata.el("h1", {}, "Configuration"), copy, pre);
};

Strata.pages.flags = async function (main) {
  const d = await Strata.api("api/v1/status/flags");
  const body = Strata.el("div");
  const draw = (needle) => {
    body.textContent = "";
    const rows = Object.keys(d).filter((k) => !k.startsWith("_")).sort()
      .filter((k) => !needle || (k + " " + d[k]).toLowerCase().includes(needle))
      .map((k) => [Strata.el("span", { class: "mono" }, k), Strata.el("span", { class: "mono" }, d[k])]);
    body.append(Strata.table(["Flag", "Value"], rows));
  };
  main.append(Strata.el("h1", {}, "Command-line flags"), Strata.el("div", { class: "row" }, filterBox("filter flags", draw)), body);
  draw("");
};

Strata.pages.status = async function (main) {
  const [run, build] = await Promise.all([Strata.api("api/v1/status/runtimeinfo"), Strata.api("api/v1/status/buildinfo")]);
  const rows = (o) => Object.keys(o).filter((k) => !k.startsWith("_")).map((k) => [k, String(o[k])]);
  main.append(Strata.el("h1", {}, "Runtime & build information"),
    Strata.el("h2", {}, "Runtime information"), Strata.table(["", ""], rows(run)),
    Strata.el("h2", {}, "Build information"), Strata.table(["", ""], rows(build)));
};

// Alerts and rules: /api/v1/rules, as Prometheus' alerts and rules pages show them.

/** A link that opens `expr` on the query page's table tab. */
function queryLink(expr) {
  return Strata.el("a", { class: "mono", href: `query?g0.expr=${encodeURIComponent(expr)}&g0.tab=1` }, expr);
}

/** "1m30s" from seconds. */
function secs(s) {
  return Strata.formatDuration(Math.round(s * 1000));
}

Strata.pages.alerts = async function (main) {
  const d = await Strata.api("api/v1/rules", { type: "alert" });
  const show = { inactive: true, pending: true, firing: true };
  const counts = { inactive: 0, pending: 0, firing: 0 };
  for (const g of d.groups) for (const r of g.rules) counts[r.state]++;
  const list = Strata.el("div");
  const draw = (needle) => {
    list.textContent = "";
    let any = false;
    for (const g of d.groups) {
      const rules = g.rules.filter((r) => show[r.state] && (!needle || (r.name + " " + JSON.stringify(r.labels)).toLowerCase().includes(needle)));
      if (!rules.length) continue;
      any = true;
      const panel = Strata.el("div", { class: "panel" }, Strata.el("h2", {}, `${g.file} > ${g.name}`));
      for (const r of rules) {
        const details = Strata.el("details", { "data-rule": r.name },
          Strata.el("summary", {}, Strata.el("span", { class: `badge ${r.state}` }, r.state.toUpperCase()), ` ${r.name} (${r.alerts.length} active)`),
          Strata.table(["", ""], [
            ["expr", queryLink(r.query)],
            ["for", secs(r.duration)],
            ...(r.keepFiringFor ? [["keep_firing_for", secs(r.keepFiringFor)]] : []),
            ["labels", Strata.el("div", {}, Strata.labelChips(r.labels))],
            ["annotations", Strata.el("pre", {}, Object.keys(r.annotations).sort().map((k) => `${k}: ${r.annotations[k]}`).join("\n"))],
            ...(r.lastError ? [["error", { class: "error", text: r.lastError }]] : []),
          ]));
        if (r.alerts.length) {
          details.append(Strata.table(["Labels", "State", "Active since", "Value", "Annotations"], r.alerts.map((a) => [
            Strata.el("div", {}, Strata.labelChips(a.labels)),
            Strata.el("span", { class: `badge ${a.state}` }, a.state.toUpperCase()),
            Strata.el("span", { title: a.activeAt }, Strata.ago(Date.parse(a.activeAt))),
            { class: "num", text: a.value },
            Strata.el("pre", {}, Object.keys(a.annotations).sort().map((k) => `${k}: ${a.annotations[k]}`).join("\n")),
          ])));
        }
        panel.append(details);
      }
      list.append(panel);
    }
    if (!any) list.append(Strata.el("p", { class: "muted" }, d.groups.length ? "No alerting rule matches." : "No alerting rules: rule_files in --config define them (docs/rules.md)."));
  };
  let needle = "";
  const box = (state) => Strata.el("label", {}, Strata.el("input", { type: "checkbox", checked: true, onchange: (e) => { show[state] = e.target.checked; draw(needle); } }), ` ${state} (${counts[state]})`);
  main.append(Strata.el("h1", {}, "Alerts"),
    Strata.el("div", { class: "row" }, box("inactive"), box("pending"), box("firing"), filterBox("filter by name or labels", (v) => { needle = v; draw(v); })),
    list);
  draw("");
};

Strata.pages.rules = async function (main) {
  const d = await Strata.api("api/v1/rules");
  main.append(Strata.el("h1", {}, "Rules"));
  if (!d.groups.length) main.append(Strata.el("p", { class: "muted" }, "No rules: rule_files in --config define them (docs/rules.md)."));
  for (const g of d.groups) {
    const rows = g.rules.map((r) => [
      Strata.el("div", {}, Strata.el("div", {}, Strata.el("b", {}, r.type === "alerting" ? "alert: " : "record: "), r.name), queryLink(r.query),
        Object.keys(r.labels).length ? Strata.el("div", {}, Strata.labelChips(r.labels)) : ""),
      Strata.el("span", { class: `badge ${r.health === "ok" ? "up" : r.health === "err" ? "down" : "unknown"}` }, r.health.toUpperCase()),
      { class: "error", text: r.lastError || "" },
      r.lastEvaluation.startsWith("0001") ? "never" : Strata.ago(Date.parse(r.lastEvaluation)),
      { class: "num", text: `${(r.evaluationTime * 1000).toFixed(2)}ms` },
    ]);
    main.append(Strata.el("div", { class: "panel", "data-group": g.name },
      Strata.el("h2", {}, `${g.file} > ${g.name} `, Strata.el("span", { class: "muted" }, `every ${secs(g.interval)}, last ${g.lastEvaluation.startsWith("0001") ? "never" : Strata.ago(Date.parse(g.lastEvaluation))}, took ${(g.evaluationTime * 1000).toFixed(2)}ms`)),
      Strata.table(["Rule", "State", "Error", "Last evaluation", "Evaluation time"], rows)));
  }
};

// Graphite: the metric tree from /metrics/find (treejson, as graphite-web's composer reads it)
// and a graph of /render targets (format=json).
Strata.pages.graphite = async function (main) {
  const targets = Strata.el("textarea", { class: "expr", rows: 3, spellcheck: "false", placeholder: "one target per line, e.g. sumSeries(servers.*.cpu.user)", "aria-label": "targets" });
  const from = Strata.el("select", {}, ["-15min", "-1h", "-6h", "-24h", "-7d", "-30d", "-1y"].map((f) => Strata.el("option", { value: f, selected: f === "-1h" }, f)));
  const until = Strata.el("input", { type: "text", value: "now", size: 10, title: "until (Graphite time: now, -1h, 20:00_20261126, Unix seconds)" });
  const stacked = Strata.el("input", { type: "checkbox" });
  const out = Strata.el("div"), msg = Strata.el("div"), stats = Strata.el("div", { class: "stats" });
  const q = new URLSearchParams(location.search);
  targets.value = q.getAll("target").join("\n");
  if (q.get("from")) from.value = q.get("from");
  if (q.get("until")) until.value = q.get("until");
  const render = async () => {
    const list = targets.value.split("\n").map((t) => t.trim()).filter(Boolean);
    const u = new URLSearchParams();
    list.forEach((t) => u.append("target", t));
    u.set("from", from.value);
    u.set("until", until.value);
    history.replaceState(null, "", "?" + u.toString());
    msg.textContent = "";
    out.textContent = "";
    stats.textContent = "";
    if (!list.length) return;
    const t0 = performance.now();
    let data;
    try {
      data = await Strata.api("render", { target: list, from: from.value, until: until.value, format: "json", maxDataPoints: Math.max(100, out.clientWidth || 1000) });
    } catch (e) {
      msg.append(Strata.el("div", { class: "error" }, "Error: " + e.message));
      return;
    }
    if (!data.length) { msg.append(Strata.el("p", { class: "muted" }, "No data: no path matches the targets in that time.")); return; }
    // Each series has its own step after consolidation; they share the finest grid.
    let start = Infinity, end = -Infinity, step = Infinity;
    for (const s of data) {
      const p = s.datapoints;
      if (!p.length) continue;
      start = Math.min(start, p[0][1] * 1000);
      end = Math.max(end, p[p.length - 1][1] * 1000);
      if (p.length > 1) step = Math.min(step, (p[1][1] - p[0][1]) * 1000);
    }
    if (!isFinite(start)) { msg.append(Strata.el("p", { class: "muted" }, "No points in that time.")); return; }
    if (!isFinite(step) || step <= 0) step = 60e3;
    const n = Math.round((end - start) / step) + 1;
    const series = data.map((s) => {
      const values = new Float64Array(n).fill(NaN);
      for (const [v, t] of s.datapoints) if (v !== null) values[Math.round((t * 1000 - start) / step)] = v;
      return { name: s.target, values };
    });
    const chart = new Strata.Chart(out, { onZoom: (a, b) => { from.value = String(Math.floor(a / 1000)); until.value = String(Math.ceil(b / 1000)); render(); } });
    chart.setData({ start, step, n, series, stacked: stacked.checked });
    stats.textContent = `Load and draw: ${(performance.now() - t0).toFixed(0)}ms · Series: ${data.length} · Step: ${step / 1000}s`;
  };
  targets.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); render(); } });
  const tree = Strata.el("div", { class: "tree" });
  const addTarget = (path) => {
    targets.value = (targets.value.trim() ? targets.value.trim() + "\n" : "") + path;
    render();
  };
  const expand = async (ul, prefix) => {
    let nodes;
    try {
      nodes = await Strata.api("metrics/find", { query: prefix ? `${prefix}.*` : "*", format: "treejson" });
    } catch (e) {
      ul.append(Strata.el("li", { class: "error" }, e.message));
      return;
    }
    if (!nodes.length && !prefix) ul.append(Strata.el("li", { class: "muted" }, "No Graphite paths yet (carbon listeners: --carbon.plaintext-listen-address)."));
    for (const n of nodes) {
      const path = n.id;
      if (n.leaf) {
        ul.append(Strata.el("li", {}, Strata.el("span", { class: "leaf", title: "graph " + path, onclick: () => addTarget(path) }, n.text)));
        continue;
      }
      const child = Strata.el("ul", { style: { display: "none" } });
      const label = Strata.el("span", { class: "branch", title: path }, n.text);
      let loaded = false;
      label.addEventListener("click", async () => {
        const open = child.style.display === "none";
        child.style.display = open ? "block" : "none";
        label.classList.toggle("open", open);
        if (open && !loaded) { loaded = true; await expand(child, path); }
      });
      ul.append(Strata.el("li", {}, label, child));
    }
  };
  const root = Strata.el("ul");
  tree.append(root);
  main.append(Strata.el("h1", {}, "Graphite"),
    Strata.el("div", { class: "split" }, tree, Strata.el("div", {},
      Strata.el("div", { class: "panel" }, targets,
        Strata.el("div", { class: "row" }, Strata.el("span", { class: "muted" }, "From"), from, Strata.el("span", { class: "muted" }, "until"), until, Strata.el("label", {}, stacked, " stacked"), Strata.el("button", { class: "primary", onclick: render }, "Render"), Strata.el("span", { class: "grow" }), stats),
        msg, out))));
  await expand(root, "");
  if (targets.value.trim()) render();
};
