// metaledger's web view: the little a page does in the browser. Every page works without it.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  // The schema table's filter by name: hides the rows whose field path does not contain what is typed.
  document.querySelectorAll("input[data-filter-table]").forEach(function (input) {
    var table = document.getElementById(input.getAttribute("data-filter-table"));
    if (!table) return;
    input.addEventListener("input", function () {
      var wanted = input.value.trim().toLowerCase();
      table.querySelectorAll("tbody tr").forEach(function (row) {
        row.hidden = wanted !== "" && (row.getAttribute("data-name") || "").indexOf(wanted) < 0;
      });
    });
  });

  // A new token's Copy button: shown only where the script runs (the token can be selected and copied without it).
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source || !navigator.clipboard) return;
    button.hidden = false;
    button.addEventListener("click", function () {
      navigator.clipboard.writeText(source.value).then(function () {
        button.textContent = "Copied";
      });
    });
  });

  // The field edit panel an Edit link opened: its first control takes the focus, as a dialog's would.
  var panel = document.getElementById("field-edit");
  if (panel && window.location.hash === "#field-edit") {
    var first = panel.querySelector("textarea, input:not([type=hidden])");
    if (first) first.focus({ preventScroll: true });
  }
});
