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
});
