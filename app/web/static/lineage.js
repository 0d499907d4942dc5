// The Lineage tab's graph: pan and zoom (drag, wheel, the buttons), and a node's edges lit while it is hovered or
// focused. The server draws the graph; without this script it scrolls inside its canvas and every node is a link.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var canvas = document.getElementById("lineage-canvas");
  var svg = document.getElementById("lineage-svg");
  if (!canvas || !svg) return;
  var box = svg.viewBox.baseVal;
  var full = { w: box.width, h: box.height };
  var MIN_FIT = 0.35, MAX_SCALE = 3;
  var view = { x: 0, y: 0, scale: 1 };

  canvas.classList.add("lg-interactive");
  svg.setAttribute("width", "100%");

  function size() {
    return { w: canvas.clientWidth || full.w, h: svg.clientHeight || full.h };
  }
  // a large graph zoomed out is drawn without its texts, which no one could read at that scale
  var large = svg.classList.contains("lg-large"), FAR = 0.5;
  function apply() {
    var s = size();
    svg.setAttribute("viewBox", [view.x, view.y, s.w / view.scale, s.h / view.scale].join(" "));
    svg.classList.toggle("lg-far", large && view.scale < FAR);
  }
  function centreOn(x, y) {
    var s = size();
    view.x = x - s.w / view.scale / 2;
    view.y = y - s.h / view.scale / 2;
  }
  // a node's box in the drawing's coordinates: its rectangle, placed by the node's translate()
  function boxOf(node) {
    var rect = node.querySelector("rect");
    var at = node.transform.baseVal.consolidate();
    var x = at ? at.matrix.e : 0, y = at ? at.matrix.f : 0;
    return { x: x, y: y, w: rect.width.baseVal.value, h: rect.height.baseVal.value };
  }
  function fit() {
    // as high as the drawing at the scale that fits its width, within 240 px and 70% of the window
    var across = Math.min(1, Math.max(MIN_FIT, canvas.clientWidth / full.w));
    svg.setAttribute("height", String(Math.round(Math.max(240, Math.min(full.h * across + 2, window.innerHeight * 0.7)))));
    var s = size();
    view.scale = Math.min(1, Math.max(MIN_FIT, Math.min(s.w / full.w, s.h / full.h)));
    var centre = svg.querySelector("[data-node='n0']");
    var whole = s.w / view.scale >= full.w && s.h / view.scale >= full.h;
    if (whole || !centre) {
      centreOn(full.w / 2, full.h / 2);
    } else {
      var c = boxOf(centre);
      centreOn(c.x + c.w / 2, c.y + c.h / 2);
    }
    apply();
  }
  function zoom(factor, px, py) {
    var s = size();
    var next = Math.min(MAX_SCALE, Math.max(0.05, view.scale * factor));
    var ax = px === undefined ? s.w / 2 : px, ay = py === undefined ? s.h / 2 : py;
    view.x += ax / view.scale - ax / next;
    view.y += ay / view.scale - ay / next;
    view.scale = next;
    apply();
  }

  // the buttons only make sense with the script: it adds them
  var bar = document.createElement("div");
  bar.className = "lg-zoom";
  [["+", "Zoom in", function () { zoom(1.25); }],
   ["\u2212", "Zoom out", function () { zoom(0.8); }],
   ["Fit", "Fit the graph", fit]].forEach(function (spec) {
    var button = document.createElement("button");
    button.type = "button";
    button.textContent = spec[0];
    button.setAttribute("aria-label", spec[1]);
    button.addEventListener("click", spec[2]);
    bar.appendChild(button);
  });
  canvas.insertBefore(bar, svg);

  canvas.addEventListener("wheel", function (event) {
    event.preventDefault();
    var r = svg.getBoundingClientRect();
    zoom(event.deltaY < 0 ? 1.15 : 1 / 1.15, event.clientX - r.left, event.clientY - r.top);
  }, { passive: false });

  // dragging pans; a drag that ends on a node is no click on its link
  var drag = null, dragged = false;
  svg.addEventListener("pointerdown", function (event) {
    if (event.button !== 0) return;
    drag = { x: event.clientX, y: event.clientY, vx: view.x, vy: view.y };
    dragged = false;
  });
  window.addEventListener("pointermove", function (event) {
    if (!drag) return;
    var dx = event.clientX - drag.x, dy = event.clientY - drag.y;
    if (!dragged && Math.abs(dx) + Math.abs(dy) < 5) return;
    if (!dragged) { dragged = true; canvas.classList.add("lg-dragging"); }
    view.x = drag.vx - dx / view.scale;
    view.y = drag.vy - dy / view.scale;
    apply();
  });
  function drop() {
    drag = null;
    canvas.classList.remove("lg-dragging");
  }
  window.addEventListener("pointerup", drop);
  window.addEventListener("pointercancel", drop);
  svg.addEventListener("click", function (event) {
    if (dragged) { event.preventDefault(); dragged = false; }
  }, true);

  // a node's edges and neighbours
  var edgesOf = {};
  svg.querySelectorAll("path[data-from]").forEach(function (path) {
    [path.getAttribute("data-from"), path.getAttribute("data-to")].forEach(function (id) {
      (edgesOf[id] = edgesOf[id] || []).push(path);
    });
  });
  var lit = [];
  function clear() {
    lit.forEach(function (el) { el.classList.remove("lg-lit"); });
    lit = [];
    svg.classList.remove("lg-on");
  }
  function light(node) {
    clear();
    var id = node.getAttribute("data-node");
    lit.push(node);
    (edgesOf[id] || []).forEach(function (path) {
      lit.push(path);
      var other = path.getAttribute(path.getAttribute("data-from") === id ? "data-to" : "data-from");
      var near = svg.querySelector("[data-node='" + other + "']");
      if (near) lit.push(near);
    });
    lit.forEach(function (el) { el.classList.add("lg-lit"); });
    svg.classList.add("lg-on");
  }
  function nodeOf(target) {
    return target && target.closest ? target.closest(".lg-node") : null;
  }
  svg.addEventListener("pointerover", function (event) {
    var node = nodeOf(event.target);
    if (node && !drag) light(node);
  });
  svg.addEventListener("pointerout", function (event) {
    if (nodeOf(event.target) && !nodeOf(event.relatedTarget)) clear();
  });
  svg.addEventListener("focusin", function (event) {
    var node = nodeOf(event.target);
    if (!node) return;
    light(node);
    // a node reached with the keyboard is brought into view
    var b = boxOf(node), s = size();
    var far = large && view.scale < FAR;
    if (far) view.scale = 1;  // its text is read where the keyboard is
    if (far || b.x < view.x || b.y < view.y || b.x + b.w > view.x + s.w / view.scale ||
        b.y + b.h > view.y + s.h / view.scale) {
      centreOn(b.x + b.w / 2, b.y + b.h / 2);
      apply();
    }
  });
  svg.addEventListener("focusout", clear);

  window.addEventListener("resize", apply);
  fit();
  // what bench/web_lineage.py measures: the graph is drawn and can be used
  requestAnimationFrame(function () { performance.mark("lineage-drawn"); });
});
