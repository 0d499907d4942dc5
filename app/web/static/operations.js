// The operator's dashboard: the change feed's tail, live (server-sent events from /operations/feed), and the
// figures refreshed by fetching this page again. Without this script the page shows the same, as of its loading.
"use strict";
(function () {
  var REFRESH_MS = 15000;
  var RETRY_MIN_MS = 5000;
  var RETRY_MAX_MS = 60000;

  function liveFeed() {
    var config = document.getElementById("ops-feed-config");
    var rows = document.getElementById("feed-rows");
    var status = document.getElementById("feed-status");
    if (!config || !rows || !status || !window.EventSource) return;
    var settings = JSON.parse(config.textContent);
    var after = settings.after;
    var source = null;
    var wait = RETRY_MIN_MS;

    function say(text, live) {
      status.textContent = text;
      status.classList.toggle("live", !!live);
    }

    function cell(row, text, header) {
      var node = document.createElement(header ? "th" : "td");
      if (header) node.setAttribute("scope", "row");
      if (text && typeof text === "object") node.appendChild(text);
      else node.textContent = text === null || text === undefined ? "–" : String(text);
      row.appendChild(node);
      return node;
    }

    function show(change) {
      var row = document.createElement("tr");
      row.className = "fresh";
      cell(row, change.offset);
      var time = document.createElement("time");
      time.setAttribute("datetime", change.iso);
      time.textContent = change.when;
      cell(row, time);
      var entity = document.createTextNode(change.urn);
      if (change.url) {
        entity = document.createElement("a");
        entity.href = change.url;
        entity.textContent = change.urn;
      }
      cell(row, entity, true).className = "urn-cell";
      cell(row, change.aspect);
      cell(row, change.changeType);
      cell(row, change.actor);
      cell(row, change.version);
      rows.insertBefore(row, rows.firstChild);
      while (rows.children.length > settings.keep) rows.removeChild(rows.lastChild);
      var empty = document.getElementById("feed-empty");
      if (empty) empty.remove();
    }

    function open() {
      // A browser reconnects by itself after a stream ends (sending Last-Event-ID); a refusal (429 while too many
      // are open, 503 while the service stops) closes the source, and a new one starts after the last change shown.
      source = new EventSource(settings.url + "?after=" + encodeURIComponent(after));
      source.addEventListener("open", function () {
        wait = RETRY_MIN_MS;
        say("Live: new changes appear at the top.", true);
      });
      source.addEventListener("change", function (event) {
        var change = JSON.parse(event.data);
        after = change.offset;
        show(change);
      });
      source.addEventListener("error", function () {
        if (source.readyState === EventSource.CLOSED) {
          source.close();
          say("Not live: trying again in " + Math.round(wait / 1000) + " s.");
          window.setTimeout(open, wait);
          wait = Math.min(wait * 2, RETRY_MAX_MS);
        } else {
          say("Reconnecting…");
        }
      });
    }

    open();
    window.addEventListener("pagehide", function () {
      if (source) source.close();
    });
  }

  function refreshFigures() {
    var box = document.querySelector(".ops-auto");
    var toggle = document.getElementById("ops-auto-refresh");
    var note = document.getElementById("ops-refresh-status");
    if (!box || !toggle || !window.fetch || !window.DOMParser) return;
    box.hidden = false;

    function busy(figures) {
      // not while someone is in a control of the figures, or the page is not seen
      return document.hidden || (document.activeElement && figures.contains(document.activeElement));
    }

    window.setInterval(function () {
      var figures = document.getElementById("ops-figures");
      if (!toggle.checked || !figures || busy(figures)) return;
      fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (response) {
          if (response.redirected) throw new Error("signed out");
          return response.text();
        })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html");
          var next = fresh.getElementById("ops-figures");
          var taken = fresh.getElementById("ops-taken-at");
          if (!next) throw new Error("no figures in the answer");
          figures.replaceWith(document.adoptNode(next));
          if (taken) document.getElementById("ops-taken-at").textContent = taken.textContent;
          note.textContent = "";
        })
        .catch(function () {
          note.textContent = "The figures could not be refreshed (signed out, or the service is away); reload the page.";
        });
    }, REFRESH_MS);
  }

  document.addEventListener("DOMContentLoaded", function () {
    liveFeed();
    refreshFigures();
  });
})();
