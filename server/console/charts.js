// Small line charts on a canvas: time on x (the last `windowS` seconds), one or two series.
// Each canvas also says what it drew (data-points, data-last, data-max) for a person's devtools
// and for the browser test.
const COLORS = ["#2563eb", "#d97706"];

export function drawChart(canvas, times, series, { windowS, now, unit = "" }) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  if (canvas.width !== width * ratio || canvas.height !== height * ratio) {
    canvas.width = width * ratio;
    canvas.height = height * ratio;
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const values = series.flat().filter((v) => v !== null && Number.isFinite(v));
  const top = niceTop(Math.max(0, ...values));
  const pad = { left: 4, right: 4, top: 14, bottom: 4 };
  const x = (t) => pad.left + ((t - (now - windowS)) / windowS) * (width - pad.left - pad.right);
  const y = (v) => height - pad.bottom - (v / top) * (height - pad.top - pad.bottom);

  ctx.strokeStyle = "#d9dee7";
  ctx.lineWidth = 1;
  ctx.beginPath();
  ctx.moveTo(pad.left, y(top / 2));
  ctx.lineTo(width - pad.right, y(top / 2));
  ctx.stroke();
  ctx.fillStyle = "#667085";
  ctx.font = "10px system-ui, sans-serif";
  ctx.fillText(`${format(top)}${unit}`, pad.left + 2, 10);

  series.forEach((points, index) => {
    ctx.strokeStyle = COLORS[index % COLORS.length];
    ctx.lineWidth = 1.6;
    ctx.beginPath();
    let drawing = false;
    points.forEach((value, i) => {
      if (value === null || !Number.isFinite(value)) {
        drawing = false;
        return;
      }
      if (drawing) ctx.lineTo(x(times[i]), y(value));
      else ctx.moveTo(x(times[i]), y(value));
      drawing = true;
    });
    ctx.stroke();
    // A point with no neighbour draws no line: a dot, so that one reading still shows.
    ctx.fillStyle = ctx.strokeStyle;
    points.forEach((value, i) => {
      const alone = (j) => j < 0 || j >= points.length || points[j] === null || !Number.isFinite(points[j]);
      if (value !== null && Number.isFinite(value) && alone(i - 1) && alone(i + 1)) {
        ctx.beginPath();
        ctx.arc(x(times[i]), y(value), 2, 0, 2 * Math.PI);
        ctx.fill();
      }
    });
  });
  const first = series[0] || [];
  const drawn = first.filter((v) => v !== null && Number.isFinite(v));
  canvas.dataset.points = String(drawn.length);
  canvas.dataset.last = drawn.length ? String(drawn[drawn.length - 1]) : "";
  canvas.dataset.max = drawn.length ? String(Math.max(...drawn)) : "";
}

function niceTop(value) {
  if (value <= 0) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) {
    if (value <= step * magnitude) return step * magnitude;
  }
  return 10 * magnitude;
}

export function format(value, digits = 3) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  if (value === 0) return "0";
  if (Math.abs(value) >= 1000) return value.toFixed(0);
  return Number(value.toPrecision(digits)).toString();
}
