// A time series graph on a canvas: lines or stacked areas, time and value axes, a legend that
// isolates series, hover values and drag-to-zoom. Series are columns on one time grid
// (start + i * step), NaN where a series has no point, which is how a range query answers.
// The series are drawn once into a cached image; hovering only draws the cursor, the
// highlighted series and the tooltip over it, so a graph of thousands of series stays fluid.
"use strict";

Strata.Chart = class {
  /** `onZoom(startMs, endMs)` is called when a time range is selected by dragging. */
  constructor(container, { onZoom, height } = {}) {
    this.onZoom = onZoom;
    this.height = height || 340;
    this.root = Strata.el("div", { class: "chart" });
    this.canvas = Strata.el("canvas", { "aria-label": "graph" });
    this.tip = Strata.el("div", { class: "tip", style: { display: "none" } });
    this.legendBox = Strata.el("div", { class: "legend" });
    this.root.append(this.canvas, this.tip);
    container.append(this.root, this.legendBox);
    this.series = [];
    this.drag = null;
    this.canvas.addEventListener("mousemove", (e) => this.hover(e));
    this.canvas.addEventListener("mouseleave", () => { this.tip.style.display = "none"; this.overlay(); });
    this.canvas.addEventListener("mousedown", (e) => {
      this.drag = { x0: this.mouseX(e), x1: this.mouseX(e) };
      // Released anywhere, even outside the graph; one listener per drag, none left behind.
      window.addEventListener("mouseup", (up) => this.endDrag(up), { once: true });
    });
    this.resizer = new ResizeObserver(() => this.width !== this.root.clientWidth && this.series.length && this.draw());
    this.resizer.observe(this.root);
  }

  /** `series`: [{name, values: Float64Array}] on the grid start + i * step, i < n. */
  setData({ start, step, n, series, stacked }) {
    this.start = start;
    this.step = step;
    this.n = n;
    this.stacked = !!stacked;
    this.series = series.map((s, i) => Object.assign(s, { color: s.color || Strata.Chart.color(i), hidden: false }));
    this.draw();
    this.drawLegend();
  }

  static color(i) {
    const palette = ["#2759c4", "#e8743b", "#19a979", "#ed4a7b", "#945ecf", "#13a4b4", "#525df4", "#bf399e", "#6c8893", "#ee6868", "#2f6497", "#d4a000", "#7cb342", "#8d6e63", "#00838f", "#c2185b", "#5e35b1", "#f4511e", "#43a047", "#546e7a"];
    if (i < palette.length) return palette[i];
    return `hsl(${(i * 137.508) % 360}, 60%, ${40 + (i % 3) * 8}%)`;
  }

  visible() {
    return this.series.filter((s) => !s.hidden);
  }

  /** For stacked graphs: each visible series' top line (the running sum below it added). */
  tops() {
    const vis = this.visible();
    if (!this.stacked) return vis.map((s) => s.values);
    const base = new Float64Array(this.n);
    return vis.map((s) => {
      const top = new Float64Array(this.n);
      for (let i = 0; i < this.n; i++) {
        const v = s.values[i];
        top[i] = Number.isNaN(v) ? NaN : base[i] + v;
        if (!Number.isNaN(v)) base[i] += v;
      }
      return top;
    });
  }

  mouseX(e) {
    return e.clientX - this.canvas.getBoundingClientRect().left;
  }

  geometry() {
    const left = 64, right = 12, top = 10, bottom = 26;
    return { left, top, w: this.width - left - right, h: this.height - top - bottom };
  }

  x(i) {
    const g = this.geometry();
    return g.left + (this.n > 1 ? (i / (this.n - 1)) * g.w : g.w / 2);
  }

  y(v) {
    const g = this.geometry();
    return g.top + g.h - ((v - this.ymin) / (this.ymax - this.ymin)) * g.h;
  }

  draw() {
    const dpr = window.devicePixelRatio || 1;
    this.width = this.root.clientWidth || 800;
    this.canvas.width = Math.round(this.width * dpr);
    this.canvas.height = Math.round(this.height * dpr);
    this.canvas.style.height = this.height + "px";
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, this.width, this.height);
    this.lines = this.tops();
    let lo = Infinity, hi = -Infinity;
    for (const vals of this.lines) {
      for (let i = 0; i < vals.length; i++) {
        const v = vals[i];
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
    }
    if (this.stacked && lo > 0) lo = 0;
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    if (lo === hi) { lo -= 1; hi += 1; }
    const ticks = Strata.Chart.niceTicks(lo, hi, 6);
    this.ymin = Math.min(lo, ticks[0]);
    this.ymax = Math.max(hi, ticks[ticks.length - 1]);
    const g = this.geometry();
    // Axes and grid.
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#5f6b7a";
    ctx.strokeStyle = "#e6e9ee";
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const t of ticks) {
      const y = Math.round(this.y(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(g.left, y); ctx.lineTo(g.left + g.w, y); ctx.stroke();
      ctx.fillText(Strata.shortValue(t), g.left - 6, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const end = this.start + (this.n - 1) * this.step;
    for (const t of Strata.Chart.timeTicks(this.start, end, Math.max(2, Math.floor(g.w / 110)))) {
      const x = Math.round(g.left + ((t.ms - this.start) / Math.max(1, end - this.start)) * g.w) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, g.top); ctx.lineTo(x, g.top + g.h); ctx.stroke();
      ctx.fillText(t.label, x, g.top + g.h + 6);
    }
    ctx.strokeStyle = "#b7bfca";
    ctx.strokeRect(g.left + 0.5, g.top + 0.5, g.w, g.h);
    // Series.
    ctx.save();
    ctx.beginPath(); ctx.rect(g.left, g.top, g.w, g.h); ctx.clip();
    const vis = this.visible();
    const xs = new Float64Array(this.n);
    for (let i = 0; i < this.n; i++) xs[i] = this.x(i);
    const scale = g.h / (this.ymax - this.ymin), y0 = g.top + g.h + this.ymin * scale;
    ctx.lineWidth = vis.length > 100 ? 1 : 1.5;
    ctx.lineJoin = "round";
    for (let k = vis.length - 1; k >= 0; k--) {
      const vals = this.lines[k], below = this.stacked && k > 0 ? this.lines[k - 1] : null;
      if (this.stacked) this.fillArea(ctx, xs, vals, below, y0, scale, vis[k].color);
      ctx.strokeStyle = vis[k].color;
      this.trace(ctx, xs, vals, y0, scale);
    }
    ctx.restore();
    this.image = ctx.getImageData(0, 0, this.canvas.width, this.canvas.height);
    this.hovered = null;
  }

  /** Strokes one series; NaN breaks the line, and a point alone is drawn as a dot. */
  trace(ctx, xs, vals, y0, scale) {
    ctx.beginPath();
    let pen = false;
    for (let i = 0; i < vals.length; i++) {
      const v = vals[i];
      if (v !== v) { pen = false; continue; }
      const y = y0 - v * scale;
      if (pen) ctx.lineTo(xs[i], y);
      else {
        ctx.moveTo(xs[i], y);
        const next = vals[i + 1];
        if (next !== next) ctx.rect(xs[i] - 1, y - 1, 2, 2);
      }
      pen = true;
    }
    ctx.stroke();
  }

  fillArea(ctx, xs, vals, below, y0, scale, color) {
    ctx.globalAlpha = 0.35;
    ctx.fillStyle = color;
    let i = 0;
    while (i < vals.length) {
      while (i < vals.length && vals[i] !== vals[i]) i++;
      const from = i;
      while (i < vals.length && vals[i] === vals[i]) i++;
      if (i - from < 2) continue;
      ctx.beginPath();
      ctx.moveTo(xs[from], y0 - vals[from] * scale);
      for (let j = from + 1; j < i; j++) ctx.lineTo(xs[j], y0 - vals[j] * scale);
      for (let j = i - 1; j >= from; j--) {
        const b = below && below[j] === below[j] ? below[j] : 0;
        ctx.lineTo(xs[j], y0 - b * scale);
      }
      ctx.closePath();
      ctx.fill();
    }
    ctx.globalAlpha = 1;
  }

  drawLegend() {
    const box = this.legendBox;
    box.textContent = "";
    const rows = this.series.map((s, k) => {
      const row = Strata.el("div", { title: "click: show only this series (again: all); ctrl/⌘-click: show or hide it" }, Strata.el("span", { class: "swatch", style: { background: s.color } }), s.name);
      row.addEventListener("click", (e) => {
        if (e.ctrlKey || e.metaKey) s.hidden = !s.hidden;
        else {
          const alone = !s.hidden && this.series.every((o, j) => j === k || o.hidden);
          this.series.forEach((o, j) => { o.hidden = alone ? false : j !== k; });
        }
        this.series.forEach((o, j) => rows[j].classList.toggle("off", o.hidden));
        this.draw();
      });
      return row;
    });
    box.append(...rows);
  }

  /** Redraws the cached graph and what the pointer adds: selection, cursor, highlight. */
  overlay(cursorX) {
    if (!this.image) return;
    const ctx = this.canvas.getContext("2d");
    ctx.putImageData(this.image, 0, 0);
    const g = this.geometry();
    if (this.drag) {
      const [a, b] = [this.drag.x0, this.drag.x1].sort((p, q) => p - q);
      ctx.fillStyle = "rgba(39, 89, 196, .15)";
      ctx.fillRect(Math.max(a, g.left), g.top, Math.min(b, g.left + g.w) - Math.max(a, g.left), g.h);
    }
    if (cursorX !== undefined) {
      ctx.strokeStyle = "rgba(0,0,0,.35)";
      ctx.beginPath(); ctx.moveTo(cursorX + 0.5, g.top); ctx.lineTo(cursorX + 0.5, g.top + g.h); ctx.stroke();
    }
    if (this.hovered !== null && this.hovered !== undefined) {
      const vals = this.lines[this.hovered];
      const xs = new Float64Array(this.n);
      for (let i = 0; i < this.n; i++) xs[i] = this.x(i);
      const scale = g.h / (this.ymax - this.ymin), y0 = g.top + g.h + this.ymin * scale;
      ctx.save();
      ctx.beginPath(); ctx.rect(g.left, g.top, g.w, g.h); ctx.clip();
      ctx.lineWidth = 3;
      ctx.strokeStyle = this.visible()[this.hovered].color;
      this.trace(ctx, xs, vals, y0, scale);
      ctx.restore();
    }
  }

  hover(e) {
    if (!this.n) return;
    const g = this.geometry();
    const mx = this.mouseX(e), my = e.clientY - this.canvas.getBoundingClientRect().top;
    if (this.drag) {
      this.drag.x1 = mx;
      this.overlay();
      return;
    }
    if (mx < g.left || mx > g.left + g.w) {
      this.tip.style.display = "none";
      this.overlay();
      return;
    }
    const i = Math.max(0, Math.min(this.n - 1, Math.round(((mx - g.left) / g.w) * (this.n - 1))));
    let best = null, bestD = Infinity;
    this.lines.forEach((vals, k) => {
      const v = vals[i];
      if (v !== v) return;
      const d = Math.abs(this.y(v) - my);
      if (d < bestD) { bestD = d; best = k; }
    });
    this.hovered = best;
    this.overlay(this.x(i));
    if (best === null) { this.tip.style.display = "none"; return; }
    const s = this.visible()[best];
    this.tip.textContent = "";
    this.tip.append(
      Strata.el("div", {}, Strata.formatTime(this.start + i * this.step)),
      Strata.el("div", {}, Strata.el("span", { class: "swatch", style: { background: s.color, display: "inline-block", width: "10px", height: "10px", marginRight: "6px" } }), s.name),
      Strata.el("div", {}, Strata.el("b", {}, "value: " + Strata.formatValue(s.values[i])), this.stacked ? `  (stacked: ${Strata.formatValue(this.lines[best][i])})` : ""),
    );
    this.tip.style.display = "block";
    const left = mx + 16 + this.tip.offsetWidth > this.width ? mx - 16 - this.tip.offsetWidth : mx + 16;
    this.tip.style.left = Math.max(0, left) + "px";
    this.tip.style.top = Math.max(0, my - 40) + "px";
  }

  endDrag(e) {
    const d = this.drag;
    if (!d) return;
    this.drag = null;
    this.overlay();
    const g = this.geometry();
    const [a, b] = [d.x0, this.mouseX(e)].sort((p, q) => p - q);
    if (b - a < 5 || !this.onZoom) return;
    const end = this.start + (this.n - 1) * this.step;
    const t = (x) => this.start + ((Math.min(Math.max(x, g.left), g.left + g.w) - g.left) / g.w) * (end - this.start);
    this.onZoom(Math.round(t(a)), Math.round(t(b)));
  }

  /** About `count` round values covering [lo, hi]. */
  static niceTicks(lo, hi, count) {
    const raw = (hi - lo) / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
    const ticks = [];
    for (let t = Math.floor(lo / step) * step; t <= hi + step * 0.5; t += step) ticks.push(Number(t.toPrecision(12)));
    return ticks;
  }

  /** Round times between start and end, at most `count`, labelled by what changes. */
  static timeTicks(start, end, count) {
    const steps = [1e3, 5e3, 15e3, 3e4, 6e4, 3e5, 9e5, 18e5, 36e5, 108e5, 216e5, 432e5, 864e5, 1728e5, 6048e5, 2592e6, 31536e6];
    const span = Math.max(1, end - start);
    const step = steps.find((s) => span / s <= count) || steps[steps.length - 1];
    const offset = new Date(start).getTimezoneOffset() * 6e4;
    const out = [];
    for (let t = Math.ceil((start - offset) / step) * step + offset; t <= end; t += step) {
      const d = new Date(t);
      const p = (n) => String(n).padStart(2, "0");
      const hm = `${p(d.getHours())}:${p(d.getMinutes())}` + (step < 6e4 ? `:${p(d.getSeconds())}` : "");
      const md = `${p(d.getMonth() + 1)}-${p(d.getDate())}`;
      out.push({ ms: t, label: step >= 864e5 ? md : span > 864e5 ? `${md} ${hm}` : hm });
    }
    return out;
  }
};
