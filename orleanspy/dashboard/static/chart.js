// A small SVG line chart, shipped with orleanspy (no library, no CDN).
// drawChart(svg, series, {unit}) with series = [{name, color, points: [[t, y|null], ...]}].
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";
  function el(name, attrs, text) {
    const node = document.createElementNS(NS, name);
    for (const k in attrs) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }
  function fmt(v) {
    if (v >= 1000) return (v / 1000).toFixed(v >= 10000 ? 0 : 1) + "k";
    if (v >= 10 || v === 0) return v.toFixed(0);
    return v.toPrecision(2);
  }
  window.drawChart = function (svg, series, opts) {
    opts = opts || {};
    // Drawn at the element's own pixel size, so text is never stretched.
    const W = Math.max(300, svg.clientWidth || 600), H = Math.max(160, svg.clientHeight || 220);
    const L = 56, R = 12, T = 10, B = 24;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    let t0 = Infinity, t1 = -Infinity, ymax = 0, count = 0;
    for (const s of series) for (const [t, y] of s.points) {
      if (y === null || y === undefined || !isFinite(y)) continue;
      t0 = Math.min(t0, t); t1 = Math.max(t1, t); ymax = Math.max(ymax, y); count++;
    }
    svg.dataset.points = String(count);
    if (count === 0) {
      svg.appendChild(el("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}, "waiting for data…"));
      return;
    }
    if (t1 === t0) t1 = t0 + 1;
    const top = niceMax(ymax);
    const x = t => L + (W - L - R) * (t - t0) / (t1 - t0);
    const y = v => T + (H - T - B) * (1 - v / top);
    // Round steps: 5 for tops of 1, 2.5, 5 or 10 (times a power of ten), 4 for 2.
    const lead = top / Math.pow(10, Math.floor(Math.log10(top)));
    const steps = Math.abs(lead - 2) < 1e-9 ? 4 : 5;
    for (let i = 0; i <= steps; i++) {
      const v = top * i / steps;
      svg.appendChild(el("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), class: "axis"}));
      svg.appendChild(el("text", {x: L - 6, y: y(v) + 4, "text-anchor": "end"},
                         fmt(v) + (opts.unit ? " " + opts.unit : "")));
    }
    for (const [t, anchor] of [[t0, "start"], [(t0 + t1) / 2, "middle"], [t1, "end"]]) {
      const d = new Date(t * 1000);
      svg.appendChild(el("text", {x: x(t), y: H - 6, "text-anchor": anchor},
                         d.toTimeString().slice(0, 8)));
    }
    for (const s of series) {
      let d = "", pen = "M";
      for (const [t, v] of s.points) {
        if (v === null || v === undefined || !isFinite(v)) { pen = "M"; continue; }
        d += pen + x(t).toFixed(1) + "," + y(v).toFixed(1) + " "; pen = "L";
      }
      if (d) svg.appendChild(el("path", {d: d, class: "line", stroke: s.color}));
    }
  };
})();
