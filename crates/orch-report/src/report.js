// Charts of an orch report, drawn into inline SVG from the JSON embedded in
// the page (#orch-report-data). No network, no library. When every chart is
// drawn the <html> element gets data-rendered="ok" and data-bars (throughput,
// cost and energy bars together)/data-dists counts; on any error it gets
// data-report-error and a red banner shows.
(function () {
  'use strict';
  var SVG = 'http://www.w3.org/2000/svg';
  var root = document.documentElement;
  // No red in the palette: red means failure in this page. CPU-only is grey.
  var PALETTE = ['#2f6fb0', '#e07b28', '#3a9a5b', '#7b5cb8', '#1f9aa6', '#8c6239', '#d05fa8', '#b8a018'];
  var CPU = '#8a93a0';
  var VERDICT = { faster: '#2e8b57', slower: '#c23b3b', same: '#7a8290' };

  function fail(msg) {
    root.setAttribute('data-report-error', msg);
    var e = document.getElementById('report-error');
    if (e) { e.hidden = false; e.textContent = 'The charts could not be drawn: ' + msg; }
  }

  function num(v) {
    if (v === null || v === undefined || !isFinite(v)) { return ''; }
    if (v === 0) { return '0'; }
    var a = Math.abs(v);
    if (a < 1e-4 || a >= 1e9) { return v.toExponential(3); }
    var d = Math.min(8, Math.max(0, 3 - Math.floor(Math.log10(a))));
    return String(parseFloat(v.toFixed(d)));
  }
  function usd(v) {
    if (v === null || v === undefined || !isFinite(v)) { return ''; }
    if (v === 0) { return '$0'; }
    return Math.abs(v) >= 1 ? '$' + v.toFixed(2) : '$' + num(v);
  }

  function el(name, attrs, parent) {
    var e = document.createElementNS(SVG, name);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function text(parent, x, y, s, attrs) {
    var a = attrs || {};
    a.x = x; a.y = y;
    var t = el('text', a, parent);
    t.textContent = s;
    return t;
  }
  function title(parent, s) { el('title', {}, parent).textContent = s; }
  function clip(s, n) { return s.length > n ? s.slice(0, n - 1) + '\u2026' : s; }

  // One colour per GPU type (`H100:8` and `H100` share one).
  var gpuColours = {};
  function gpuType(g) { return String(g || 'none').split(':')[0]; }
  function colour(g) {
    var t = gpuType(g);
    if (t === 'none' || t === 'cpu') { return CPU; }
    if (!(t in gpuColours)) { gpuColours[t] = PALETTE[Object.keys(gpuColours).length % PALETTE.length]; }
    return gpuColours[t];
  }

  function niceMax(v) {
    if (!(v > 0)) { return 1; }
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10];
    for (var i = 0; i < steps.length; i++) { if (steps[i] * p >= v) { return steps[i] * p; } }
    return 10 * p;
  }

  var W = 860, LABEL = 270, VALUE = 110, ROW = 24, GAP = 7, TOP = 22;

  function axis(svg, scale, max, height, fmt) {
    for (var i = 0; i <= 4; i++) {
      var v = max * i / 4, x = LABEL + scale(v);
      el('line', { x1: x, x2: x, y1: TOP - 6, y2: height, 'class': 'grid' }, svg);
      text(svg, x, TOP - 10, fmt(v), { 'class': 'tick', 'text-anchor': 'middle' });
    }
  }

  // Horizontal bars, one per row: {cell, label, value, gpu, note}.
  function barChart(host, rows, kind, fmt) {
    var max = niceMax(Math.max.apply(null, rows.map(function (r) { return r.value; }).concat([0])));
    var plot = W - LABEL - VALUE;
    var scale = function (v) { return Math.max(0, v) / max * plot; };
    var height = TOP + rows.length * (ROW + GAP);
    var svg = el('svg', { viewBox: '0 0 ' + W + ' ' + (height + 4), 'class': 'chart-svg', role: 'img' });
    axis(svg, scale, max, height, fmt);
    rows.forEach(function (r, i) {
      var y = TOP + i * (ROW + GAP);
      var g = el('g', { 'class': 'row' }, svg);
      text(g, LABEL - 8, y + ROW / 2 + 4, clip(r.label, 40), { 'class': 'label', 'text-anchor': 'end' });
      var bar = el('rect', {
        'class': 'bar ' + kind, 'data-cell': r.cell, x: LABEL, y: y,
        width: Math.max(scale(r.value), r.value > 0 ? 1.5 : 0), height: ROW, rx: 3, fill: colour(r.gpu)
      }, g);
      title(bar, r.cell + ' (' + r.gpu + '): ' + fmt(r.value) + (r.note ? ' ' + r.note : ''));
      text(g, LABEL + scale(r.value) + 6, y + ROW / 2 + 4, fmt(r.value) + (r.flagged ? ' \u26a0' : ''), { 'class': 'value' });
    });
    host.appendChild(svg);
    return rows.length;
  }

  function legend(host, gpus) {
    var div = document.createElement('div');
    div.className = 'legend';
    gpus.forEach(function (g) {
      var s = document.createElement('span');
      var sw = document.createElement('i');
      sw.style.background = colour(g);
      s.appendChild(sw);
      s.appendChild(document.createTextNode(gpuType(g)));
      div.appendChild(s);
    });
    host.appendChild(div);
  }

  function uniqueGpus(rows) {
    var seen = {}, out = [];
    rows.forEach(function (r) { var t = gpuType(r.gpu); if (!seen[t]) { seen[t] = 1; out.push(r.gpu); } });
    return out;
  }

  // Latency distribution per cell: whisker min..max (or median..p99), box
  // median..p95 (or p90), tick at p99, dot at the mean.
  function latencyChart(host, cells) {
    var rows = cells.map(function (c) {
      var l = c.latency;
      var lo = l.min != null ? l.min : (l.median != null ? l.median : l.mean);
      var hi = l.max != null ? l.max : (l.p99 != null ? l.p99 : (l.p95 != null ? l.p95 : (l.p90 != null ? l.p90 : l.mean)));
      var boxHi = l.p95 != null ? l.p95 : (l.p90 != null ? l.p90 : l.p99);
      return { c: c, l: l, lo: lo, hi: hi, boxHi: boxHi };
    });
    var max = niceMax(Math.max.apply(null, rows.map(function (r) { return Math.max(r.hi || 0, r.l.mean || 0); }).concat([0])));
    var plot = W - LABEL - VALUE;
    var scale = function (v) { return Math.max(0, v) / max * plot; };
    var height = TOP + rows.length * (ROW + GAP);
    var svg = el('svg', { viewBox: '0 0 ' + W + ' ' + (height + 4), 'class': 'chart-svg', role: 'img' });
    axis(svg, scale, max, height, num);
    rows.forEach(function (r, i) {
      var y = TOP + i * (ROW + GAP), mid = y + ROW / 2, l = r.l, col = colour(r.c.gpu);
      var g = el('g', { 'class': 'dist', 'data-cell': r.c.id }, svg);
      text(g, LABEL - 8, mid + 4, clip(r.c.id, 40), { 'class': 'label', 'text-anchor': 'end' });
      if (r.lo != null && r.hi != null) {
        el('line', { x1: LABEL + scale(r.lo), x2: LABEL + scale(r.hi), y1: mid, y2: mid, stroke: col, 'stroke-width': 1.5 }, g);
      }
      if (l.median != null && r.boxHi != null) {
        el('rect', { x: LABEL + scale(l.median), y: y + 4, width: Math.max(1.5, scale(r.boxHi) - scale(l.median)), height: ROW - 8, fill: col, 'fill-opacity': 0.35, stroke: col }, g);
        el('line', { x1: LABEL + scale(l.median), x2: LABEL + scale(l.median), y1: y + 2, y2: y + ROW - 2, stroke: col, 'stroke-width': 2.5 }, g);
      }
      if (l.p99 != null) {
        el('line', { x1: LABEL + scale(l.p99), x2: LABEL + scale(l.p99), y1: y + 5, y2: y + ROW - 5, stroke: '#333', 'stroke-width': 1.5 }, g);
      }
      if (l.mean != null) {
        el('circle', { cx: LABEL + scale(l.mean), cy: mid, r: 3.5, fill: '#111' }, g);
      }
      var parts = ['mean', 'median', 'p90', 'p95', 'p99', 'std', 'min', 'max'].filter(function (k) { return l[k] != null; })
        .map(function (k) { return k + ' ' + num(l[k]); });
      title(g, r.c.id + ' ' + l.family + (l.unit ? ' (' + l.unit + ')' : '') + ': ' + parts.join(', '));
      var tail = r.hi != null ? r.hi : l.mean;
      text(g, LABEL + scale(tail) + 6, mid + 4, 'p50 ' + num(l.median != null ? l.median : l.mean), { 'class': 'value' });
    });
    host.appendChild(svg);
    return rows.length;
  }

  // Speedup of `other` over `base` with its 95% interval; 1 = no change.
  function forestChart(host, rows) {
    var pts = rows.map(function (x) {
      var higher = Math.abs(x.speedup - x.ratio) < 1e-9;
      var lo = higher ? x.ci_low : 1 / x.ci_high, hi = higher ? x.ci_high : 1 / x.ci_low;
      return { x: x, lo: lo, hi: hi };
    }).filter(function (p) { return isFinite(p.lo) && isFinite(p.hi) && isFinite(p.x.speedup); });
    if (!pts.length) { return 0; }
    var lo = Math.min.apply(null, pts.map(function (p) { return p.lo; }).concat([1]));
    var hi = Math.max.apply(null, pts.map(function (p) { return p.hi; }).concat([1]));
    var pad = (hi - lo) * 0.08 || 0.05;
    lo -= pad; hi += pad;
    var plot = W - LABEL - VALUE;
    var scale = function (v) { return (v - lo) / (hi - lo) * plot; };
    var height = TOP + pts.length * (ROW + GAP);
    var svg = el('svg', { viewBox: '0 0 ' + W + ' ' + (height + 4), 'class': 'chart-svg', role: 'img' });
    var decimals = Math.max(0, Math.min(4, Math.ceil(-Math.log10((hi - lo) / 4))));
    for (var i = 0; i <= 4; i++) {
      var v = lo + (hi - lo) * i / 4, gx = LABEL + scale(v);
      el('line', { x1: gx, x2: gx, y1: TOP - 6, y2: height, 'class': 'grid' }, svg);
      text(svg, gx, TOP - 10, v.toFixed(decimals) + '\u00d7', { 'class': 'tick', 'text-anchor': 'middle' });
    }
    el('line', { x1: LABEL + scale(1), x2: LABEL + scale(1), y1: TOP - 6, y2: height, 'class': 'one' }, svg);
    pts.forEach(function (p, i) {
      var y = TOP + i * (ROW + GAP), mid = y + ROW / 2, col = VERDICT[p.x.verdict] || '#555';
      var g = el('g', { 'class': 'ci', 'data-verdict': p.x.verdict }, svg);
      text(g, LABEL - 8, mid + 4, clip(p.x.other + ' vs ' + p.x.base + ' \u00b7 ' + p.x.metric, 42), { 'class': 'label', 'text-anchor': 'end' });
      el('line', { x1: LABEL + scale(p.lo), x2: LABEL + scale(p.hi), y1: mid, y2: mid, stroke: col, 'stroke-width': 3 }, g);
      el('circle', { cx: LABEL + scale(p.x.speedup), cy: mid, r: 5, fill: col }, g);
      title(g, p.x.other + ' vs ' + p.x.base + ', ' + p.x.metric + ': speedup ' + num(p.x.speedup) + '\u00d7 [' + num(p.lo) + ', ' + num(p.hi) + '] ' + p.x.verdict);
      text(g, LABEL + scale(p.hi) + 6, mid + 4, num(p.x.speedup) + '\u00d7 ' + p.x.verdict, { 'class': 'value', fill: col });
    });
    host.appendChild(svg);
    return pts.length;
  }

  function byId(cells) { var m = {}; cells.forEach(function (c) { m[c.id] = c; }); return m; }
  function hosts(kind) { return Array.prototype.slice.call(document.querySelectorAll('[data-chart="' + kind + '"]')); }

  function draw(data) {
    var cells = byId(data.cells), bars = 0, dists = 0, cis = 0;
    hosts('throughput').forEach(function (host) {
      var rk = data.rankings.filter(function (r) { return r.metric === host.getAttribute('data-metric'); })[0];
      if (!rk) { throw new Error('no ranking for ' + host.getAttribute('data-metric')); }
      var rows = rk.entries.map(function (e) {
        return { cell: e.cell, label: e.cell, value: e.value, gpu: e.gpu, flagged: e.flags.length > 0 };
      });
      legend(host, uniqueGpus(rows));
      bars += barChart(host, rows, 'throughput', num);
    });
    hosts('cost').forEach(function (host) {
      var rows = data.cost_ranking.map(function (e) {
        return { cell: e.cell, label: e.cell, value: e.usd_per_1k_tokens, gpu: e.gpu, flagged: e.flags.length > 0,
          note: '(' + num(e.token_rate) + ' ' + e.token_metric + ')' };
      });
      legend(host, uniqueGpus(rows));
      bars += barChart(host, rows, 'cost', usd);
    });
    hosts('energy').forEach(function (host) {
      var figure = host.getAttribute('data-figure');
      var perToken = figure === 'energy_per_token_j';
      var rows = (data.telemetry || []).filter(function (t) {
        return t[figure] !== null && t[figure] !== undefined && isFinite(t[figure]);
      }).map(function (t) {
        // Per token in millijoules: joules per token are small numbers.
        var v = perToken ? t[figure] * 1000 : t[figure];
        return { cell: t.cell, label: t.cell, value: v, gpu: t.gpu, flagged: t.flags.length > 0,
          note: perToken ? 'mJ per token' : 'J per step' };
      });
      if (!rows.length) { throw new Error('no cell has ' + figure); }
      legend(host, uniqueGpus(rows));
      bars += barChart(host, rows, 'energy', num);
    });
    hosts('latency').forEach(function (host) {
      var fam = host.getAttribute('data-family');
      var rows = data.cells.filter(function (c) { return c.status === 'succeeded' && c.latency && c.latency.family === fam; });
      dists += latencyChart(host, rows);
    });
    hosts('comparison').forEach(function (host) {
      var cmp = data.comparisons.filter(function (c) { return c.cell === host.getAttribute('data-cell'); })[0];
      if (!cmp) { throw new Error('no comparison for ' + host.getAttribute('data-cell')); }
      var anyKey = cmp.rows.some(function (x) { return x.key; });
      cis += forestChart(host, cmp.rows.filter(function (x) { return !anyKey || x.key; }));
    });
    if (!cells) { throw new Error('no cells'); }
    root.setAttribute('data-bars', String(bars));
    root.setAttribute('data-dists', String(dists));
    root.setAttribute('data-cis', String(cis));
  }

  try {
    var node = document.getElementById('orch-report-data');
    draw(JSON.parse(node.textContent));
    root.setAttribute('data-rendered', 'ok');
  } catch (e) {
    fail(String((e && e.message) || e));
  }
})();
