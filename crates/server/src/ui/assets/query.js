// The query page: panels of a PromQL editor (syntax errors at their position, completion of
// metric names, label names and values, functions), a table of the instant result and a
// graph of the range result. The panels' state is the page's URL, in the parameters
// Prometheus' own UI uses (g0.expr, g0.tab, g0.range_input, ...), so links from Grafana's
// "explore in Prometheus" and from Prometheus itself open here too.
"use strict";

Strata.PROMQL_FUNCTIONS = "abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month deg delta deriv exp floor histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar histogram_sum holt_winters idelta increase irate label_join label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month pi predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort sort_by_label sort_by_label_desc sort_desc sqrt stddev_over_time stdvar_over_time sum_over_time tan tanh time timestamp vector year".split(" ");
Strata.PROMQL_AGGREGATIONS = "avg bottomk count count_values group limit_ratio limitk max min quantile stddev stdvar sum topk".split(" ");
Strata.PROMQL_KEYWORDS = "and bool by group_left group_right ignoring offset on or unless without".split(" ");

/** Densities of the automatic resolution: points across the graph's range. */
const DENSITY_POINTS = { low: 100, medium: 250, high: 1000 };
/** Rows a table draws; the rest are counted, not drawn. */
const TABLE_ROWS_MAX = 10000;

Strata.pages.query = Strata.pages.graph = async function (main) {
  const list = Strata.el("div");
  const add = Strata.el("button", { onclick: () => { panels.push(new Panel(list, defaults(), save)); save(); } }, "Add panel");
  main.append(list, add);
  const panels = [];
  const save = () => {
    const q = new URLSearchParams();
    panels.forEach((p, i) => (p.removed ? null : p.writeState(q, `g${panels.filter((o, j) => j < i && !o.removed).length}.`)));
    history.replaceState(null, "", "?" + q.toString());
  };
  const states = readStates(new URLSearchParams(location.search));
  for (const s of states.length ? states : [defaults()]) panels.push(new Panel(list, s, save));
  Strata.metricNames(); // warms the completion list
  for (const p of panels) if (p.state.expr) p.execute();
};

function defaults() {
  return { expr: "", tab: "graph", range: 3600e3, end: null, moment: null, resType: "auto", density: "medium", step: null, stacked: false };
}

/** Panel states from the URL: g0.expr, g0.tab, ... (Prometheus 2 and 3 spellings). */
function readStates(q) {
  const out = [];
  for (let i = 0; q.has(`g${i}.expr`) || q.has(`g${i}.tab`); i++) {
    const g = (k) => q.get(`g${i}.${k}`);
    const s = defaults();
    s.expr = g("expr") || "";
    s.tab = g("tab") === "1" || g("tab") === "table" ? "table" : "graph";
    s.range = Strata.parseDuration(g("range_input") || "") || s.range;
    s.end = parseTime(g("end_input"));
    s.moment = parseTime(g("moment_input"));
    const step = Number(g("res_step") || g("step_input"));
    if (step > 0) { s.step = step; s.resType = g("res_type") === "fixed" ? "fixed" : "custom"; }
    if (DENSITY_POINTS[g("res_density")]) s.density = g("res_density");
    s.stacked = g("display_mode") === "stacked" || g("stacked") === "1";
    out.push(s);
  }
  return out;
}

/** Unix seconds, RFC 3339, or "YYYY-MM-DD HH:MM:SS" in UTC (as Prometheus writes it). */
function parseTime(s) {
  if (!s) return null;
  if (/^\d+(\.\d+)?$/.test(s)) return Math.round(Number(s) * 1000);
  const ms = Date.parse(/^\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)?$/.test(s) ? s.replace(" ", "T") + "Z" : s);
  return isNaN(ms) ? null : ms;
}

function formatUTC(ms) {
  return new Date(ms).toISOString().slice(0, 19).replace("T", " ");
}

class Panel {
  constructor(list, state, save) {
    this.state = state;
    this.save = save;
    this.removed = false;
    this.editor = new Editor((expr) => { this.state.expr = expr; this.save(); }, () => this.execute());
    this.editor.set(state.expr);
    const execute = Strata.el("button", { class: "primary", onclick: () => this.execute() }, "Execute");
    const format = Strata.el("button", { title: "format the expression as Prometheus does (api/v1/format_query)", onclick: () => this.format() }, "Format");
    const remove = Strata.el("button", { title: "remove this panel", onclick: () => { this.removed = true; this.root.remove(); this.save(); } }, "✕");
    this.tabs = {
      table: Strata.el("button", { onclick: () => this.setTab("table") }, "Table"),
      graph: Strata.el("button", { onclick: () => this.setTab("graph") }, "Graph"),
    };
    this.controls = Strata.el("div", { class: "row" });
    this.body = Strata.el("div");
    this.messages = Strata.el("div");
    this.stats = Strata.el("div", { class: "stats" });
    this.root = Strata.el("div", { class: "panel" },
      Strata.el("div", { class: "row" }, this.editor.root, format, execute, remove),
      this.editor.syntax,
      Strata.el("div", { class: "row tabs" }, this.tabs.table, this.tabs.graph, Strata.el("span", { class: "grow" }), this.stats),
      this.controls, this.messages, this.body);
    list.append(this.root);
    this.drawControls();
  }

  writeState(q, p) {
    const s = this.state;
    q.set(p + "expr", s.expr);
    q.set(p + "tab", s.tab);
    if (s.tab === "graph") {
      q.set(p + "range_input", Strata.formatDuration(s.range));
      if (s.end !== null) q.set(p + "end_input", formatUTC(s.end));
      q.set(p + "res_type", s.resType);
      if (s.resType === "auto") q.set(p + "res_density", s.density);
      else if (s.step) q.set(p + "res_step", String(s.step));
      q.set(p + "display_mode", s.stacked ? "stacked" : "lines");
    } else if (s.moment !== null) {
      q.set(p + "moment_input", formatUTC(s.moment));
    }
  }

  setTab(tab) {
    this.state.tab = tab;
    this.save();
    this.drawControls();
    this.execute();
  }

  /** The range graph's step in seconds. */
  stepSeconds() {
    const s = this.state;
    if (s.resType !== "auto" && s.step > 0) return s.step;
    return Math.max(1, Math.floor(s.range / DENSITY_POINTS[s.density] / 1000));
  }

  drawControls() {
    const s = this.state, c = this.controls;
    c.textContent = "";
    for (const [k, b] of Object.entries(this.tabs)) b.classList.toggle("active", k === s.tab);
    const changed = () => { this.save(); this.drawControls(); this.execute(); };
    if (s.tab === "table") {
      const at = Strata.el("input", { type: "text", placeholder: "evaluation time (now)", value: s.moment === null ? "" : formatUTC(s.moment), title: "UTC: YYYY-MM-DD HH:MM:SS, RFC 3339 or Unix seconds; empty: now", onchange: (e) => { s.moment = parseTime(e.target.value); changed(); } });
      c.append(Strata.el("span", { class: "muted" }, "Evaluation time"), at);
      return;
    }
    const range = Strata.el("input", { type: "text", size: 6, value: Strata.formatDuration(s.range), title: "range, as a PromQL duration", onchange: (e) => { s.range = Strata.parseDuration(e.target.value) || s.range; changed(); } });
    const ranges = [60e3, 3e5, 9e5, 18e5, 36e5, 108e5, 216e5, 432e5, 864e5, 1728e5, 6048e5, 12096e5, 2592e6, 7776e6, 31536e6];
    const shrink = Strata.el("button", { title: "shorter range", onclick: () => { s.range = [...ranges].reverse().find((r) => r < s.range) || s.range; changed(); } }, "−");
    const grow = Strata.el("button", { title: "longer range", onclick: () => { s.range = ranges.find((r) => r > s.range) || s.range; changed(); } }, "+");
    const end = Strata.el("input", { type: "text", size: 19, placeholder: "end (now)", value: s.end === null ? "" : formatUTC(s.end), title: "UTC: YYYY-MM-DD HH:MM:SS, RFC 3339 or Unix seconds; empty: now", onchange: (e) => { s.end = parseTime(e.target.value); changed(); } });
    const now = Strata.el("button", { title: "end now", onclick: () => { s.end = null; changed(); } }, "now");
    const res = Strata.el("select", { title: "resolution", onchange: (e) => {
      const v = e.target.value;
      if (DENSITY_POINTS[v]) { s.resType = "auto"; s.density = v; } else if (v === "custom") { s.resType = "custom"; s.step = this.stepSeconds(); } else { s.resType = "fixed"; s.step = Number(v); }
      changed();
    } });
    const options = [["low", "auto: low res."], ["medium", "auto: medium res."], ["high", "auto: high res."], ["15", "15s"], ["60", "1m"], ["300", "5m"], ["900", "15m"], ["3600", "1h"], ["86400", "1d"], ["custom", "custom step…"]];
    for (const [v, label] of options) {
      const selected = s.resType === "auto" ? v === s.density : s.resType === "fixed" ? v === String(s.step) : v === "custom";
      res.append(Strata.el("option", { value: v, selected }, label));
    }
    const custom = s.resType === "custom" ? Strata.el("input", { type: "number", min: 1, size: 6, value: s.step, title: "step in seconds", onchange: (e) => { s.step = Math.max(1, Number(e.target.value) || 1); changed(); } }) : null;
    const mode = Strata.el("select", { title: "display", onchange: (e) => { s.stacked = e.target.value === "stacked"; changed(); } },
      Strata.el("option", { value: "lines", selected: !s.stacked }, "unstacked"),
      Strata.el("option", { value: "stacked", selected: s.stacked }, "stacked"));
    c.append(shrink, range, grow, end, now, Strata.el("span", { class: "muted" }, "Resolution"), res, ...(custom ? [custom] : []), Strata.el("span", { class: "muted" }, `${this.stepSeconds()}s`), mode);
  }

  async format() {
    if (!this.state.expr.trim()) return;
    try {
      const text = await Strata.api("api/v1/format_query", { query: this.state.expr });
      this.editor.set(text);
      this.state.expr = text;
      this.save();
      this.editor.showError(null);
    } catch (e) {
      if (!this.editor.showError(e.message)) this.messages.append(Strata.el("div", { class: "error" }, "Error: " + e.message));
    }
  }

  async execute() {
    const s = this.state;
    this.editor.closeCompletion();
    if (this.inflight) this.inflight.abort();
    this.messages.textContent = "";
    if (!s.expr.trim()) { this.body.textContent = ""; this.stats.textContent = ""; return; }
    const ctl = (this.inflight = new AbortController());
    const t0 = performance.now();
    this.stats.textContent = "loading…";
    try {
      let data, step;
      if (s.tab === "table") {
        const time = (s.moment === null ? Date.now() : s.moment) / 1000;
        data = await Strata.api("api/v1/query", { query: s.expr, time, stats: "all" }, { signal: ctl.signal });
      } else {
        step = this.stepSeconds();
        const end = (s.end === null ? Date.now() : s.end) / 1000;
        const start = end - s.range / 1000;
        // Step-aligned, so refreshes read the same evaluation times.
        const alignedEnd = Math.floor(end / step) * step, alignedStart = Math.floor(start / step) * step;
        data = await Strata.api("api/v1/query_range", { query: s.expr, start: alignedStart, end: alignedEnd, step, stats: "all" }, { signal: ctl.signal });
        data._range = { start: alignedStart * 1000, end: alignedEnd * 1000, step: step * 1000 };
      }
      const loaded = performance.now() - t0;
      this.editor.showError(null);
      this.showMessages(data);
      const t1 = performance.now();
      if (s.tab === "table") this.drawTable(data);
      else this.drawGraph(data);
      this.showStats(data, loaded, performance.now() - t1, step);
    } catch (e) {
      if (e.name === "AbortError") return;
      this.stats.textContent = "";
      this.body.textContent = "";
      if (!this.editor.showError(e.message)) this.messages.append(Strata.el("div", { class: "error" }, "Error: " + e.message));
    }
  }

  showMessages(data) {
    for (const w of data._warnings) this.messages.append(Strata.el("div", { class: "warning" }, "Warning: " + w));
    for (const w of data._infos) this.messages.append(Strata.el("div", { class: "info" }, "Info: " + w));
  }

  showStats(data, loadMs, drawMs, step) {
    const parts = [`Load time: ${loadMs.toFixed(0)}ms`, `Render time: ${drawMs.toFixed(0)}ms`];
    if (step) parts.push(`Resolution: ${step}s`);
    const n = Array.isArray(data.result) ? data.result.length : 1;
    parts.push(`Result series: ${n}`);
    const st = data.stats;
    if (st && st.samples) parts.push(`Samples read: ${st.samples.totalQueryableSamples}`, `Peak samples: ${st.samples.peakSamples}`);
    if (st && st.timings) parts.push(`Evaluation: ${(st.timings.evalTotalTime * 1000).toFixed(1)}ms`);
    this.stats.textContent = parts.join(" · ");
  }

  drawTable(data) {
    const b = this.body;
    b.textContent = "";
    const rows = [];
    const r = data.result;
    switch (data.resultType) {
      case "vector":
        for (const x of r.slice(0, TABLE_ROWS_MAX)) rows.push([Strata.el("span", { class: "mono" }, Strata.seriesName(x.metric)), { class: "num", text: x.value ? Strata.formatValue(x.value[1]) : histogramText(x.histogram) }]);
        break;
      case "matrix":
        for (const x of r.slice(0, TABLE_ROWS_MAX)) {
          const pts = (x.values || []).map((v) => `${v[1]} @${v[0]}`).concat((x.histograms || []).map((h) => `${histogramText(h)} @${h[0]}`));
          rows.push([Strata.el("span", { class: "mono" }, Strata.seriesName(x.metric)), { class: "num", text: pts.join("\n") }]);
        }
        break;
      case "scalar":
        rows.push(["scalar", { class: "num", text: Strata.formatValue(r[1]) }]);
        break;
      case "string":
        rows.push(["string", r[1]]);
        break;
    }
    if (!rows.length) { b.append(Strata.el("p", { class: "muted" }, "Empty query result")); return; }
    b.append(Strata.table(["Series", "Value"], rows));
    if (Array.isArray(r) && r.length > TABLE_ROWS_MAX) b.append(Strata.el("p", { class: "muted" }, `Showing ${TABLE_ROWS_MAX} of ${r.length} series.`));
  }

  drawGraph(data) {
    const b = this.body;
    b.textContent = "";
    if (data.resultType !== "matrix") {
      b.append(Strata.el("p", { class: "error" }, `A graph needs a range vector; the query returned a ${data.resultType}. Use the table.`));
      return;
    }
    if (!data.result.length) { b.append(Strata.el("p", { class: "muted" }, "Empty query result")); return; }
    const { start, end, step } = data._range;
    const n = Math.round((end - start) / step) + 1;
    const series = data.result.map((x) => {
      const values = new Float64Array(n).fill(NaN);
      for (const [t, v] of x.values || []) {
        const i = Math.round((t * 1000 - start) / step);
        if (i >= 0 && i < n) values[i] = Number(v);
      }
      for (const [t, h] of x.histograms || []) {
        const i = Math.round((t * 1000 - start) / step);
        if (i >= 0 && i < n) values[i] = Number(h.count);
      }
      return { name: Strata.seriesName(x.metric), values };
    });
    const chart = new Strata.Chart(b, { onZoom: (from, to) => {
      this.state.end = to;
      this.state.range = Math.max(1000, to - from);
      this.save();
      this.drawControls();
      this.execute();
    } });
    chart.setData({ start, step, n, series, stacked: this.state.stacked });
  }
}

function histogramText(h) {
  const x = Array.isArray(h) ? h[1] : h;
  return x ? `{count: ${x.count}, sum: ${x.sum}}` : "";
}

/** Metric names for completion, fetched once per page. */
Strata.metricNames = function () {
  if (!Strata._metricNames) Strata._metricNames = Strata.api("api/v1/label/__name__/values").catch(() => []);
  return Strata._metricNames;
};

/** A PromQL text area with completion and syntax errors shown where they are. */
class Editor {
  constructor(onChange, onExecute) {
    this.onChange = onChange;
    this.input = Strata.el("textarea", { class: "expr", rows: 1, spellcheck: "false", placeholder: "Expression (press Enter to execute, Shift+Enter for a new line)", "aria-label": "expression" });
    this.list = Strata.el("div", { class: "complete", style: { display: "none" } });
    this.root = Strata.el("div", { class: "editor" }, this.input, this.list);
    this.syntax = Strata.el("div", { class: "syntax-box" });
    this.items = [];
    this.sel = 0;
    this.check = Strata.debounce(() => this.checkSyntax(), 350);
    this.input.addEventListener("input", () => { this.fit(); this.onChange(this.input.value); this.complete(); this.check(); });
    this.input.addEventListener("keydown", (e) => {
      const open = this.list.style.display !== "none";
      if (open && (e.key === "ArrowDown" || e.key === "ArrowUp")) {
        e.preventDefault();
        this.sel = (this.sel + (e.key === "ArrowDown" ? 1 : this.items.length - 1)) % this.items.length;
        this.drawList();
      } else if (open && (e.key === "Tab" || e.key === "Enter") && !e.shiftKey) {
        e.preventDefault();
        this.accept(this.items[this.sel]);
      } else if (open && e.key === "Escape") {
        this.closeCompletion();
      } else if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        onExecute();
      }
    });
    this.input.addEventListener("blur", () => setTimeout(() => this.closeCompletion(), 150));
  }

  set(text) {
    this.input.value = text;
    setTimeout(() => this.fit(), 0);
  }

  fit() {
    this.input.style.height = "auto";
    this.input.style.height = this.input.scrollHeight + 2 + "px";
  }

  async checkSyntax() {
    const q = this.input.value;
    if (!q.trim()) { this.showError(null); return; }
    try {
      await Strata.api("api/v1/parse_query", { query: q });
      if (this.input.value === q) this.showError(null);
    } catch (e) {
      if (this.input.value === q) this.showError(e.message);
    }
  }

  /**
   * Shows a parse error under the expression with the place it names marked; returns
   * whether `message` was a parse error with a position (null clears).
   */
  showError(message) {
    this.syntax.textContent = "";
    this.input.classList.remove("invalid");
    if (!message) return false;
    const m = /(\d+):(\d+)(?:-\d+:\d+)?: parse error: ([\s\S]*)$/.exec(message);
    if (!m) return false;
    const q = this.input.value, line = Number(m[1]), col = Number(m[2]);
    const lines = q.split("\n");
    const bytes = new TextEncoder().encode(lines[line - 1] || "");
    const before = new TextDecoder().decode(bytes.slice(0, col - 1));
    let offset = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0) + before.length;
    offset = Math.min(offset, q.length);
    const marked = q.slice(offset, offset + 1) || " ";
    this.input.classList.add("invalid");
    this.syntax.append(
      Strata.el("div", { class: "error" }, `Parse error at line ${line}, column ${col}: ${m[3]}`),
      Strata.el("div", { class: "syntax", title: "click to put the cursor there", onclick: () => { this.input.focus(); this.input.setSelectionRange(offset, offset); } },
        q.slice(0, offset), Strata.el("mark", {}, marked), q.slice(offset + 1)),
    );
    return true;
  }

  /** What is being typed at the cursor, and what can complete it. */
  async complete() {
    const pos = this.input.selectionStart, text = this.input.value.slice(0, pos);
    const ctx = completionContext(text);
    if (!ctx) { this.closeCompletion(); return; }
    let words;
    try {
      words = await ctx.words();
    } catch (_) {
      words = [];
    }
    if (this.input.selectionStart !== pos || this.input.value.slice(0, pos) !== text) return;
    const p = ctx.prefix.toLowerCase();
    const starts = [], contains = [];
    for (const w of words) {
      const lw = w.text.toLowerCase();
      if (lw === p) continue;
      if (lw.startsWith(p)) starts.push(w);
      else if (p && lw.includes(p)) contains.push(w);
      if (starts.length >= 100) break;
    }
    this.items = starts.concat(contains).slice(0, 100);
    this.ctx = ctx;
    this.sel = 0;
    if (!this.items.length || (!p && ctx.kind === "metric")) { this.closeCompletion(); return; }
    this.drawList();
  }

  drawList() {
    this.list.textContent = "";
    this.items.forEach((w, i) => {
      const row = Strata.el("div", { class: i === this.sel ? "sel" : "" }, w.text, Strata.el("small", {}, w.kind));
      row.addEventListener("mousedown", (e) => { e.preventDefault(); this.accept(w); });
      this.list.append(row);
    });
    this.list.style.display = "block";
    const sel = this.list.children[this.sel];
    if (sel) sel.scrollIntoView({ block: "nearest" });
  }

  accept(w) {
    const pos = this.input.selectionStart, v = this.input.value;
    let insert = w.text;
    const after = v.slice(pos);
    if (this.ctx.kind === "label value" && !after.startsWith('"')) insert += '"';
    if (w.kind === "function" && !after.startsWith("(")) insert += "(";
    const from = pos - this.ctx.prefix.length;
    this.input.value = v.slice(0, from) + insert + after;
    const at = from + insert.length;
    this.input.setSelectionRange(at, at);
    this.closeCompletion();
    this.onChange(this.input.value);
    this.check();
  }

  closeCompletion() {
    this.list.style.display = "none";
    this.items = [];
  }
}

/**
 * The completion context of the text before the cursor: label values inside a matcher's
 * quotes, label names inside braces or a grouping, else metric names, functions and
 * keywords. Null inside strings and numbers.
 */
function completionContext(text) {
  const word = (kind) => (x) => ({ text: x, kind });
  // Inside `{...` not yet closed: find the selector's metric name.
  const brace = text.lastIndexOf("{");
  if (brace > text.lastIndexOf("}")) {
    const metric = (/([a-zA-Z_:][a-zA-Z0-9_:]*)\s*$/.exec(text.slice(0, brace)) || [])[1];
    const match = metric ? { "match[]": metric } : {};
    const inner = text.slice(brace + 1);
    const value = /([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)$/.exec(inner);
    if (value) {
      return { kind: "label value", prefix: value[3], words: async () => (await Strata.api(`api/v1/label/${encodeURIComponent(value[1])}/values`, match)).map(word("label value")) };
    }
    const name = /(?:^|,)\s*([a-zA-Z_][a-zA-Z0-9_]*)?$/.exec(inner);
    if (name) return { kind: "label", prefix: name[1] || "", words: async () => (await Strata.api("api/v1/labels", match)).map(word("label")) };
    return null;
  }
  const grouping = /\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*,)?\s*([a-zA-Z_][a-zA-Z0-9_]*)?$/.exec(text);
  if (grouping) return { kind: "label", prefix: grouping[3] || "", words: async () => (await Strata.api("api/v1/labels")).map(word("label")) };
  if ((text.match(/"/g) || []).length % 2 === 1) return null;
  const ident = /(^|[^a-zA-Z0-9_:.])([a-zA-Z_:][a-zA-Z0-9_:]*)$/.exec(text);
  if (!ident) return null;
  return {
    kind: "metric",
    prefix: ident[2],
    words: async () =>
      Strata.PROMQL_AGGREGATIONS.map(word("aggregation"))
        .concat(Strata.PROMQL_FUNCTIONS.map(word("function")), Strata.PROMQL_KEYWORDS.map(word("keyword")), (await Strata.metricNames()).map(word("metric"))),
  };
}
