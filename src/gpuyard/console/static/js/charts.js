// Inline SVG line charts (no library): one series of percentages over a time window.
// A series with no values says so in words instead of drawing a line.
const NS = "http://www.w3.org/2000/svg";
const W = 300;
const H = 80;

function svg(tag, attrs) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

// A chart of `points` ([{t: ms, v: percent|null}]) from `start` to `end` (ms), 0-100 %.
export function lineChart(title, points, start, end, emptyText = "no data yet") {
  const box = document.createElement("figure");
  box.className = "chart";
  box.dataset.chart = title;
  const caption = document.createElement("figcaption");
  const known = points.filter((p) => p.v !== null && p.v !== undefined);
  const last = known.length ? known[known.length - 1].v : null;
  caption.textContent = last === null ? `${title}: ${emptyText}` : `${title}: ${last.toFixed(1)}%`;
  box.append(caption);
  if (!known.length) {
    box.dataset.empty = "true";
    return box;
  }
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${title} over the last hour`, preserveAspectRatio: "none" });
  chart.append(svg("rect", { x: 0, y: 0, width: W, height: H, class: "chart-bg" }));
  for (const pct of [25, 50, 75]) {
    chart.append(svg("line", { x1: 0, x2: W, y1: H - (pct / 100) * H, y2: H - (pct / 100) * H, class: "chart-grid" }));
  }
  const span = Math.max(1, end - start);
  const xy = known.map((p) => [((p.t - start) / span) * W, H - (Math.min(100, Math.max(0, p.v)) / 100) * H]);
  chart.append(svg("polyline", { points: xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" "), class: "chart-line" }));
  box.append(chart);
  return box;
}
