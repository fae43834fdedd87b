// libreyolo timeline: draws the profiled window (lanes of events) on a canvas and the verdict in a side panel.
// Data comes from the JSON block #profile-data, inlined by libreyolo/profiler/artifacts.py; nothing is fetched.
(function () {
  "use strict";

  // Errors land in the page as well as the console: a silent blank timeline would look like "no data".
  const errors = [];
  function report(message) {
    errors.push(message);
    const box = document.getElementById("errors");
    box.hidden = false;
    box.textContent = "timeline error: " + errors.join("\n");
    document.body.dataset.state = "error";
  }
  window.addEventListener("error", (e) => report(e.message || String(e.error)));
  window.addEventListener("unhandledrejection", (e) => report(String(e.reason)));

  const data = JSON.parse(document.getElementById("profile-data").textContent);
  const $ = (id) => document.getElementById(id);

  // ---- side panel --------------------------------------------------------------------------------
  function fmt(x, digits) {
    if (x === null || x === undefined) return "n/a";
    if (typeof x !== "number") return String(x);
    return x.toLocaleString("en-US", { maximumFractionDigits: digits === undefined ? 1 : digits });
  }
  const pct = (x) => (x === null || x === undefined ? "n/a" : fmt(100 * x, 0) + "%");

  function table(el, header, rows) {
    el.replaceChildren();
    if (header) {
      const tr = el.insertRow();
      header.forEach((h) => { const th = document.createElement("th"); th.textContent = h; tr.appendChild(th); });
    }
    rows.forEach((r) => {
      const tr = el.insertRow();
      r.forEach((cell, i) => {
        const td = tr.insertCell();
        td.textContent = cell;
        if (i === 0) td.title = cell;
      });
    });
  }

  function panel() {
    const v = data.verdict, h = data.headline, m = data.meta, w = data.window;
    const el = $("verdict");
    el.textContent = v.name;
    el.className = "verdict " + v.name.split(/[- ]/)[0];
    $("why").textContent = v.why;
    $("levers").replaceChildren(...v.levers.map((l) => { const li = document.createElement("li"); li.textContent = l; return li; }));
    $("title").textContent = `${m.model} · batch ${m.batch} · ${m.imgsz}px · ${m.device_name} · ${w.unsync_steps}+${w.sync_steps} steps after ${w.warmup_steps} warmup`;
    const gpu = m.device.startsWith("cuda");
    const rows = [["step time", fmt(h.step_ms) + " ms"], ["images / s", fmt(h.img_s)], ["data wait", fmt(h.data_ms) + " ms (" + pct(h.data_frac) + ")"]];
    if (gpu) {
      rows.push(["GPU utilization", pct(h.utilization)], ["kernels / step", fmt(h.kernels_per_step, 0)], ["mean kernel", fmt(h.mean_kernel_us) + " µs"],
        ["tensor-core share", pct(h.tensor_core_frac)], ["cudaMalloc+Free / step", fmt(h.alloc_calls_per_step)],
        ["peak VRAM reserved", h.peak_reserved_mb === null ? "n/a" : fmt(h.peak_reserved_mb, 0) + " MB"]);
    }
    table($("headline"), null, rows);
    table($("phases"), gpu ? ["phase", "host", "GPU", "synced", "share"] : ["phase", "host", "synced", "share"],
      data.phases.map((p) => gpu ? [p.name, fmt(p.host_ms, 2), fmt(p.gpu_ms, 2), fmt(p.synced_ms, 2), pct(p.share)]
        : [p.name, fmt(p.host_ms, 2), fmt(p.synced_ms, 2), pct(p.share)]));
    if (data.kernels.length) {
      table($("kernels"), ["kernel", "ms/step", "% GPU", "n/step"],
        data.kernels.map((k) => [k.name, fmt(k.ms_per_step, 2), fmt(k.pct_gpu, 1), fmt(k.count_per_step, 1)]));
    } else {
      $("kernels-title").textContent = "top CPU ops (no GPU on this run)";
      table($("kernels"), ["op", "self ms/step", "calls/step"],
        data.cpu_ops.map((o) => [o.name, fmt(o.self_ms_per_step, 2), fmt(o.calls_per_step, 0)]));
    }
    table($("meta"), null, Object.entries(m).map(([k, val]) => [k, String(val)]));
  }

  // ---- timeline ----------------------------------------------------------------------------------
  const ROW = 16, LANE_GAP = 8, AXIS = 26, LABEL = 170;
  const canvas = $("canvas"), ctx = canvas.getContext("2d"), tip = $("tip");
  const lanes = data.lanes.map((l) => ({ ...l, y: 0, events: [] }));
  data.events.forEach((e) => lanes[e[0]].events.push(e));
  let height = AXIS;
  lanes.forEach((l) => { l.y = height; height += l.rows * ROW + LANE_GAP; });
  // reduce, not Math.max(...spread): tens of thousands of arguments overflow the call stack
  const end = data.events.reduce((m, e) => Math.max(m, e[2] + e[3]), data.segments.reduce((m, s) => Math.max(m, s[1]), 1));
  let t0 = 0, t1 = end;

  const COLORS = {
    step: "#4c566a", data: "#d08770", to_device: "#ebcb8b", forward: "#88c0d0", loss: "#b48ead", backward: "#5e81ac",
    optimizer: "#a3be8c", ema: "#8fbcbb", conv: "#5e81ac", gemm: "#81a1c1", norm: "#8fbcbb", elementwise: "#a3be8c",
    reduction: "#b48ead", optimizer_k: "#a3be8c", memcpy: "#d08770", memset: "#ebcb8b", other: "#7b8394",
  };
  function color(name, cat) {
    if (cat === "cpu_op") {
      let hash = 0;
      for (let i = 0; i < name.length; i++) hash = (hash * 31 + name.charCodeAt(i)) | 0;
      return `hsl(${Math.abs(hash) % 360},35%,52%)`;
    }
    return COLORS[cat] || COLORS.other;
  }

  function size() {
    const dpr = window.devicePixelRatio || 1;
    const width = canvas.parentElement.clientWidth;
    canvas.style.height = height + "px";
    canvas.width = Math.max(1, Math.floor(width * dpr));
    canvas.height = Math.floor(height * dpr);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }
  const plotWidth = () => Math.max(1, canvas.clientWidth - LABEL);
  const xOf = (t) => LABEL + ((t - t0) / (t1 - t0)) * plotWidth();
  const tOf = (x) => t0 + ((x - LABEL) / plotWidth()) * (t1 - t0);

  function niceStep(span) {
    const raw = span / 8, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    return [1, 2, 5, 10].map((k) => k * mag).find((s) => s >= raw);
  }
  const timeLabel = (us) => (Math.abs(us) >= 1000 ? fmt(us / 1000, 2) + " ms" : fmt(us, 1) + " µs");

  function draw() {
    const width = canvas.clientWidth;
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    // outside the window's segments (e.g. validation between epochs): shaded
    ctx.fillStyle = "#1b1f26";
    let prev = 0;
    data.segments.forEach(([s, e]) => {
      if (s > prev) ctx.fillRect(xOf(prev), AXIS, xOf(s) - xOf(prev), height - AXIS);
      prev = e;
    });
    const step = niceStep(t1 - t0);
    ctx.fillStyle = "#8a93a3";
    ctx.strokeStyle = "#2a303a";
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
      const x = xOf(t);
      ctx.beginPath(); ctx.moveTo(x, AXIS - 6); ctx.lineTo(x, height); ctx.stroke();
      ctx.fillText(timeLabel(t), x + 3, 10);
    }
    lanes.forEach((lane) => {
      ctx.fillStyle = "#181c22";
      ctx.fillRect(0, lane.y, LABEL - 4, lane.rows * ROW);
      ctx.fillStyle = "#d8dee9";
      ctx.fillText(lane.name, 6, lane.y + ROW / 2);
      ctx.save();
      ctx.beginPath(); ctx.rect(LABEL, lane.y, width - LABEL, lane.rows * ROW); ctx.clip();
      lane.events.forEach((e) => {
        const s = e[2], d = e[3];
        if (s + d < t0 || s > t1) return;
        const x = xOf(s), w = Math.max(1, xOf(s + d) - x), y = lane.y + e[1] * ROW;
        const name = data.names[e[4]];
        ctx.fillStyle = color(name, e[5]);
        ctx.fillRect(x, y + 1, w, ROW - 2);
        if (w > 40) {
          ctx.fillStyle = "#111418";
          ctx.fillText(name.slice(0, Math.floor(w / 6)), Math.max(x, LABEL) + 3, y + ROW / 2);
        }
      });
      ctx.restore();
    });
  }

  function hit(x, y) {
    if (x < LABEL) return null;
    const t = tOf(x), tol = (t1 - t0) / plotWidth() * 2;
    for (const lane of lanes) {
      if (y < lane.y || y >= lane.y + lane.rows * ROW) continue;
      const row = Math.floor((y - lane.y) / ROW);
      let best = null;
      lane.events.forEach((e) => {
        if (e[1] === row && t >= e[2] - tol && t <= e[2] + e[3] + tol && (!best || e[3] < best[3])) best = e;
      });
      return best && { lane, e: best };
    }
    return null;
  }

  function zoom(factor, atX) {
    const t = tOf(atX), span = Math.min(end * 1.05, Math.max(1, (t1 - t0) * factor));
    const frac = (atX - LABEL) / plotWidth();
    t0 = t - frac * span; t1 = t0 + span;
    draw();
  }
  function pan(dt) { t0 += dt; t1 += dt; draw(); }
  function reset() { t0 = 0; t1 = end; draw(); }

  let drag = null;
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    zoom(Math.exp(ev.deltaY * 0.0015), ev.offsetX);
  }, { passive: false });
  canvas.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, t0, t1 }; canvas.classList.add("dragging"); });
  window.addEventListener("mouseup", () => { drag = null; canvas.classList.remove("dragging"); });
  window.addEventListener("mousemove", (ev) => {
    if (drag) {
      const dt = ((ev.clientX - drag.x) / plotWidth()) * (drag.t1 - drag.t0);
      t0 = drag.t0 - dt; t1 = drag.t1 - dt;
      draw();
    }
  });
  canvas.addEventListener("mousemove", (ev) => {
    const found = !drag && hit(ev.offsetX, ev.offsetY);
    tip.hidden = !found;
    if (!found) return;
    const e = found.e;
    tip.textContent = `${data.names[e[4]]}\n${found.lane.name} · ${timeLabel(e[3])} at ${timeLabel(e[2])}`;
    tip.style.left = Math.min(ev.offsetX + 12, canvas.clientWidth - 300) + "px";
    tip.style.top = ev.offsetY + 14 + "px";
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  canvas.addEventListener("dblclick", reset);
  $("reset").addEventListener("click", reset);
  window.addEventListener("keydown", (ev) => {
    const k = ev.key.toLowerCase(), mid = LABEL + plotWidth() / 2, span = t1 - t0;
    if (k === "w") zoom(0.8, mid);
    else if (k === "s") zoom(1.25, mid);
    else if (k === "a") pan(-0.15 * span);
    else if (k === "d") pan(0.15 * span);
    else if (k === "0") reset();
  });
  window.addEventListener("resize", () => { size(); draw(); });

  panel();
  size();
  draw();
  if (!errors.length) document.body.dataset.state = "ready";
})();
