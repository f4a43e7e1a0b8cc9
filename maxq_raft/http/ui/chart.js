// A line chart of message rates, drawn as SVG. The node reports each rate as of now
// (message_stats' *_details.rate); the history is what this page sampled at each refresh, kept
// here, bounded.

const SVG = "http://www.w3.org/2000/svg";
export const SAMPLES_MAX = 120; // 10 minutes at one sample every 5 s
export const SERIES = [
  ["publish", "#2b6cb0"],
  ["confirm", "#805ad5"],
  ["deliver_get", "#067647"],
  ["ack", "#dd6b20"],
  ["redeliver", "#b42318"],
  ["return_unroutable", "#6b7280"],
];

export class RateHistory {
  constructor() {
    this.samples = []; // [{t: ms, rates: {name: per second}}]
  }
  add(messageStats) {
    const rates = {};
    for (const [name] of SERIES) rates[name] = (messageStats?.[name + "_details"] || {}).rate || 0;
    this.samples.push({ t: Date.now(), rates });
    if (this.samples.length > SAMPLES_MAX) this.samples.splice(0, this.samples.length - SAMPLES_MAX);
  }
}

function svg(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

function niceMax(value) {
  if (value <= 1) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

export function chart(history, width = 640, height = 200) {
  const pad = { left: 48, right: 10, top: 10, bottom: 22 };
  const root = svg("svg", { class: "chart", id: "rate-chart", width, height, viewBox: `0 0 ${width} ${height}` });
  const samples = history.samples;
  const max = niceMax(Math.max(0, ...samples.flatMap((s) => Object.values(s.rates))));
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const y = (v) => pad.top + plotH - (v / max) * plotH;
  for (const frac of [0, 0.5, 1]) {
    root.append(svg("line", { class: "grid", x1: pad.left, x2: width - pad.right, y1: y(max * frac), y2: y(max * frac) }));
    const label = svg("text", { x: pad.left - 6, y: y(max * frac) + 4, "text-anchor": "end" });
    label.textContent = `${max * frac}/s`;
    root.append(label);
  }
  const axis = svg("text", { x: pad.left, y: height - 6 });
  axis.textContent = samples.length
    ? `last ${Math.round((samples[samples.length - 1].t - samples[0].t) / 1000)} s, sampled at each refresh`
    : "no samples yet";
  root.append(axis);
  if (samples.length >= 2) {
    const t0 = samples[0].t;
    const span = Math.max(1, samples[samples.length - 1].t - t0);
    const x = (t) => pad.left + ((t - t0) / span) * plotW;
    for (const [name, color] of SERIES) {
      const points = samples.map((s) => `${x(s.t).toFixed(1)},${y(s.rates[name]).toFixed(1)}`).join(" ");
      root.append(svg("polyline", { points, fill: "none", stroke: color, "stroke-width": 2 }));
    }
  }
  return root;
}

export function legend(history) {
  const last = history.samples[history.samples.length - 1];
  const el = document.createElement("p");
  el.className = "legend";
  for (const [name, color] of SERIES) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = color; // CSSOM, not a style attribute: allowed by the page's CSP
    item.append(swatch, `${name} ${last ? last.rates[name] : 0}/s`);
    el.append(item);
  }
  return el;
}
