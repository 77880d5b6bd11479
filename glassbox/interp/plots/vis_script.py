"""The script of ``vis``'s views: builds each view from the JSON beside it; loads nothing."""

SCRIPT = r"""
function glassboxVis(id) {
  var root = document.getElementById(id);
  if (!root || root.getAttribute("data-ready")) { return; }
  var d = JSON.parse(document.getElementById(id + "-data").textContent);
  var kind = root.getAttribute("data-kind");
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function share(v) {
    if (v >= 0) { return [d.positive, d.max > 0 ? Math.min(1, v / d.max) : 0]; }
    return [d.negative, d.min < 0 ? Math.min(1, v / d.min) : 0];
  }
  function paint(node, v) {
    var s = share(v), pct = Math.round(s[1] * 100);
    node.style.background = "color-mix(in srgb, " + s[0] + " " + pct + "%, white)";
    node.style.color = s[1] > 0.6 ? "white" : "black";
  }
  function shown(t) { return t.replace(/\n/g, "\u21b5"); }
  function fmt(v) { return Number(v).toPrecision(4); }
  var style = el("style");
  style.textContent = "#" + id + " { font-family: sans-serif; font-size: 13px; }" +
    "#" + id + " .gb-thumbs { display: flex; flex-wrap: wrap; gap: 6px; margin-bottom: 8px; }" +
    "#" + id + " .gb-thumb { border: 2px solid #ccc; background: white; padding: 2px; cursor: pointer; font-size: 11px; }" +
    "#" + id + " .gb-thumb[aria-pressed=true] { border-color: #333; }" +
    "#" + id + " .gb-grid { border-collapse: collapse; }" +
    "#" + id + " .gb-grid td { width: 18px; height: 18px; padding: 0; border: 1px solid #f4f4f4; }" +
    "#" + id + " .gb-grid th { font-weight: normal; font-family: monospace; white-space: pre; padding: 0 4px; }" +
    "#" + id + " .gb-grid thead th { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }" +
    "#" + id + " .gb-grid tbody th { text-align: right; cursor: pointer; }" +
    "#" + id + " .gb-grid tbody th.gb-dest { text-decoration: underline; }" +
    "#" + id + " .gb-tok { font-family: monospace; white-space: pre; padding: 1px 0; margin: 0 1px; border-radius: 2px; }" +
    "#" + id + " .gb-strip { margin: 8px 0; line-height: 1.9; }" +
    "#" + id + " .gb-topk td, #" + id + " .gb-topk th { padding: 1px 6px; font-family: monospace; white-space: pre; }" +
    "#" + id + " .gb-controls label { margin-right: 12px; }";
  root.appendChild(style);

  if (kind === "attention") {
    var n = d.tokens.length, heads = d.attention.length;
    var thumbs = el("div", "gb-thumbs"), title = el("div", "gb-selected"), grid = el("table", "gb-grid");
    var strip = el("div", "gb-strip"), wrap = el("div", "gb-wrap");
    wrap.style.overflowX = "auto"; wrap.appendChild(grid);
    root.appendChild(thumbs); root.appendChild(title); root.appendChild(wrap); root.appendChild(strip);
    var cells = [], rowHeads = [], tokenSpans = [];
    var head = grid.createTHead().insertRow(), body = grid.createTBody();
    head.appendChild(el("th", "", ""));
    d.tokens.forEach(function (t) { head.appendChild(el("th", "", shown(t))); });
    for (var q = 0; q < n; q++) {
      var row = body.insertRow(), label = el("th", "", shown(d.tokens[q]));
      label.setAttribute("data-dest", q);
      label.title = "show the attention from token " + q + " in the strip below";
      label.addEventListener("click", (function (q) { return function () { chooseDest(q); }; })(q));
      row.appendChild(label); rowHeads.push(label);
      cells.push([]);
      for (var k = 0; k < n; k++) { var c = row.insertCell(); cells[q].push(c); }
    }
    d.tokens.forEach(function (t, i) {
      var s = el("span", "gb-tok", shown(t)); s.setAttribute("data-src", i); strip.appendChild(s); tokenSpans.push(s);
    });
    var buttons = d.names.map(function (name, h) {
      var b = el("button", "gb-thumb"), canvas = el("canvas"), size = Math.max(2, Math.floor(72 / n));
      b.type = "button"; b.setAttribute("data-head", h); b.setAttribute("aria-pressed", "false"); b.title = name;
      canvas.width = canvas.height = size * n;
      var ctx = canvas.getContext("2d");
      ctx.fillStyle = "white"; ctx.fillRect(0, 0, size * n, size * n);
      for (var q = 0; q < n; q++) { for (var k = 0; k < n; k++) {
        if (d.mask && k > q) { continue; }
        var s = share(d.attention[h][q][k]);
        ctx.globalAlpha = s[1]; ctx.fillStyle = s[0]; ctx.fillRect(k * size, q * size, size, size);
      } }
      ctx.globalAlpha = 1;
      b.appendChild(canvas); b.appendChild(el("div", "", name));
      b.addEventListener("click", function () { choose(h); });
      thumbs.appendChild(b);
      return b;
    });
    var current = 0, dest = n - 1;
    function choose(h) {
      current = h;
      buttons.forEach(function (b, i) { b.setAttribute("aria-pressed", i === h ? "true" : "false"); });
      title.textContent = d.names[h];
      for (var q = 0; q < n; q++) { for (var k = 0; k < n; k++) {
        var c = cells[q][k], v = d.attention[h][q][k];
        if (d.mask && k > q) { c.style.background = "white"; c.removeAttribute("data-value"); c.title = ""; continue; }
        paint(c, v); c.setAttribute("data-value", v);
        c.title = shown(d.tokens[q]) + " (" + q + ") \u2192 " + shown(d.tokens[k]) + " (" + k + "): " + fmt(v);
      } }
      root.setAttribute("data-selected", h);
      chooseDest(dest);
    }
    function chooseDest(q) {
      dest = q;
      rowHeads.forEach(function (r, i) { r.className = i === q ? "gb-dest" : ""; });
      tokenSpans.forEach(function (s, k) {
        var v = d.attention[current][q][k];
        paint(s, v); s.setAttribute("data-value", v); s.title = "attention from token " + q + ": " + fmt(v);
      });
      root.setAttribute("data-dest", q);
    }
    choose(0);
  } else if (kind === "tokens") {
    d.tokens.forEach(function (t, i) {
      var s = el("span", "gb-tok", shown(t)), v = d.values[i];
      paint(s, v); s.setAttribute("data-value", v); s.title = fmt(v); root.appendChild(s);
    });
  } else if (kind === "topk") {
    var controls = el("div", "gb-controls"), table = el("table", "gb-topk"), wrap = el("div", "gb-wrap");
    wrap.style.overflowX = "auto"; wrap.appendChild(table);
    root.appendChild(controls); root.appendChild(wrap);
    function field(name, input) { var l = el("label", "", name + " "); l.appendChild(input); controls.appendChild(l); return input; }
    function number(lo, hi, v) { var i = el("input"); i.type = "number"; i.min = lo; i.max = hi; i.value = v; return i; }
    function choice(n) { var s = el("select"); for (var i = 0; i < n; i++) { var o = el("option", "", String(i)); o.value = i; s.appendChild(o); } return s; }
    var first = d.samples[0].top_values, nFirst = first.length, nNeurons = first[0][0].length;
    var sample = field("Sample", choice(d.samples.length)), layer = field(d.first, choice(nFirst));
    var start = field("first " + d.third.toLowerCase(), number(0, nNeurons - 1, 0));
    var count = field(d.third.toLowerCase() + "s shown", number(1, nNeurons, Math.min(nNeurons, 8)));
    var kk = field("k", number(1, d.max_k, Math.min(d.max_k, 5)));
    sample.className = "gb-sample"; layer.className = "gb-first"; start.className = "gb-start";
    count.className = "gb-count"; kk.className = "gb-k";
    function clamp(input, lo, hi) { var v = Math.round(Number(input.value)); return isNaN(v) ? lo : Math.max(lo, Math.min(hi, v)); }
    function draw() {
      var s = d.samples[Number(sample.value)], l = Number(layer.value);
      var from = clamp(start, 0, nNeurons - 1), shownCount = clamp(count, 1, nNeurons - from);
      var k = Math.min(clamp(kk, 1, d.max_k), s.top_values[l].length);
      table.innerHTML = "";
      var header = table.createTHead().insertRow();
      header.appendChild(el("th", "", ""));
      for (var j = from; j < from + shownCount; j++) { header.appendChild(el("th", "", d.third + " " + j)); }
      var body = table.createTBody();
      function rows(values, index, label) {
        for (var r = 0; r < k; r++) {
          var row = body.insertRow(); row.appendChild(el("th", "", label + (r + 1)));
          for (var j = from; j < from + shownCount; j++) {
            var v = values[l][r][j], t = s.tokens[index[l][r][j]], c = row.insertCell();
            c.textContent = shown(t) + " " + fmt(v);
            var a = Math.min(1, Math.abs(v) / d.scale), colour = v >= 0 ? d.positive : d.negative;
            c.style.background = "color-mix(in srgb, " + colour + " " + Math.round(a * 100) + "%, white)";
            c.style.color = a > 0.6 ? "white" : "black";
            c.setAttribute("data-value", v); c.setAttribute("data-token", t); c.setAttribute("data-position", index[l][r][j]);
            c.className = label === "top " ? "gb-top" : "gb-bottom";
          }
        }
      }
      rows(s.top_values, s.top_index, "top ");
      rows(s.bottom_values, s.bottom_index, "bottom ");
      root.setAttribute("data-shown", [Number(sample.value), l, from, shownCount, k].join(","));
    }
    [sample, layer, start, count, kk].forEach(function (i) { i.addEventListener("change", draw); i.addEventListener("input", draw); });
    draw();
  }
  root.setAttribute("data-ready", "true");
}
"""
