// Strata's UI: shared helpers and the page router. Every page is drawn by a function in
// Strata.pages, named by the last segment of the document's path; all URLs are relative to
// the document's <base>, so the UI works under any route prefix or proxy path.
"use strict";

const Strata = {
  pages: {},

  start() {
    const page = Strata.pageName();
    for (const a of document.querySelectorAll("nav a")) {
      if ((a.dataset.page || "").split(" ").includes(page)) a.classList.add("active");
    }
    const draw = Strata.pages[page];
    const main = document.getElementById("page");
    main.textContent = "";
    if (!draw) {
      main.append(Strata.el("p", { class: "error" }, `No page named ${page}.`));
      return;
    }
    Promise.resolve(draw(main)).catch((e) => main.append(Strata.el("p", { class: "error" }, String(e.message || e))));
  },

  /** The page's name: the path after the <base>, e.g. "query". */
  pageName() {
    const base = new URL(document.baseURI).pathname;
    const path = location.pathname.startsWith(base) ? location.pathname.slice(base.length) : location.pathname;
    return path.replace(/\/+$/, "") || "query";
  },

  /** Builds an element: el("td", {class: "num"}, "1", child, ...). Strings become text. */
  el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "style" && typeof v === "object") Object.assign(e.style, v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  },

  /**
   * GETs (or POSTs, for long queries) an API path relative to the base and returns its `data`
   * (the whole body when it has no status field, as Graphite's endpoints). Throws an Error
   * whose message is the API's own error text.
   */
  async api(path, params, opts) {
    const body = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) {
      if (Array.isArray(v)) v.forEach((x) => body.append(k, x));
      else if (v !== undefined && v !== null && v !== "") body.append(k, v);
    }
    const qs = body.toString();
    const post = qs.length > 2000;
    const init = { signal: opts && opts.signal, headers: { Accept: "application/json" } };
    let url = path;
    if (post) {
      init.method = "POST";
      init.body = body;
    } else if (qs) {
      url += "?" + qs;
    }
    const resp = await fetch(url, init);
    const text = await resp.text();
    let json;
    try {
      json = JSON.parse(text);
    } catch (_) {
      throw new Error(resp.ok ? `not JSON from ${path}: ${text.slice(0, 200)}` : `${resp.status} ${resp.statusText}: ${text.trim().slice(0, 500)}`);
    }
    if (json && json.status === "error") {
      const err = new Error(json.error || `${resp.status} ${resp.statusText}`);
      err.type = json.errorType;
      throw err;
    }
    if (!resp.ok) throw new Error(`${resp.status} ${resp.statusText}`);
    return json && json.status === "success" ? Object.assign(json.data, { _warnings: json.warnings || [], _infos: json.infos || [] }) : json;
  },

  /** `name{a="b", c="d"}` as Prometheus writes a series. */
  seriesName(metric) {
    const name = metric.__name__ || "";
    const pairs = Object.keys(metric)
      .filter((k) => k !== "__name__")
      .sort()
      .map((k) => `${k}=${JSON.stringify(metric[k])}`);
    return pairs.length || !name ? `${name}{${pairs.join(", ")}}` : name;
  },

  formatValue(v) {
    if (typeof v === "string") v = Number(v);
    if (!isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e15 || a < 1e-4)) return v.toExponential(4);
    return String(Number(v.toPrecision(a >= 1e6 ? 12 : 8)));
  },

  /** A short value for an axis: 1.5k, 2M, 0.25. */
  shortValue(v) {
    const a = Math.abs(v);
    const units = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (const [n, u] of units) if (a >= n) return Number((v / n).toPrecision(4)) + u;
    if (a !== 0 && a < 1e-3) return v.toExponential(1);
    return String(Number(v.toPrecision(4)));
  },

  formatTime(ms) {
    const d = new Date(ms);
    const p = (n, w = 2) => String(n).padStart(w, "0");
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
  },

  formatBytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return `${i ? n.toFixed(1) : n} ${units[i]}`;
  },

  /** "1h30m" → ms; null when not a duration. Units as PromQL's. */
  parseDuration(s) {
    const units = { ms: 1, s: 1e3, m: 6e4, h: 36e5, d: 864e5, w: 6048e5, y: 31536e6 };
    s = String(s).trim();
    if (!/^(\d+(ms|s|m|h|d|w|y))+$/.test(s)) return null;
    let ms = 0;
    for (const m of s.matchAll(/(\d+)(ms|s|m|h|d|w|y)/g)) ms += Number(m[1]) * units[m[2]];
    return ms;
  },

  /** ms → the shortest PromQL duration: 5400000 → "1h30m". */
  formatDuration(ms) {
    if (ms <= 0) return "0s";
    const units = [["y", 31536e6], ["w", 6048e5], ["d", 864e5], ["h", 36e5], ["m", 6e4], ["s", 1e3], ["ms", 1]];
    let out = "";
    for (const [u, n] of units) {
      if (ms >= n) { out += Math.floor(ms / n) + u; ms %= n; }
    }
    return out;
  },

  /** "3.2s ago", "in 5m". */
  ago(ms) {
    const d = Date.now() - ms;
    const s = Strata.formatDuration(Math.round(Math.abs(d) / 100) * 100 || 0);
    return d >= 0 ? `${s} ago` : `in ${s}`;
  },

  /** A table from header names and rows of cells (strings, nodes or {text, class}). */
  table(headers, rows) {
    const cell = (tag, c) => (c && typeof c === "object" && !(c instanceof Node) ? Strata.el(tag, { class: c.class }, c.text) : Strata.el(tag, {}, c));
    return Strata.el("table", {}, Strata.el("thead", {}, Strata.el("tr", {}, headers.map((h) => cell("th", h)))), Strata.el("tbody", {}, rows.map((r) => Strata.el("tr", {}, r.map((c) => cell("td", c))))));
  },

  labelChips(labels) {
    return Object.keys(labels || {}).sort().map((k) => Strata.el("span", { class: "label" }, `${k}="${labels[k]}"`));
  },

  /** Runs `f` at most once per `ms`, after the last call. */
  debounce(f, ms) {
    let t;
    return (...a) => { clearTimeout(t); t = setTimeout(() => f(...a), ms); };
  },
};
