// Tables under "All errata" (errata.html) sort by the column whose heading is clicked; a second
// click reverses. Section ids and row ids sort by their numbers (P.2 before P.10).
(function () {
  function key(text) {
    return text.trim().split(/(\d+)/).map(function (p, i) { return i % 2 ? Number(p) : p.toLowerCase(); });
  }
  function compare(a, b) {
    for (var i = 0; i < Math.min(a.length, b.length); i++) {
      if (a[i] < b[i]) return -1;
      if (a[i] > b[i]) return 1;
    }
    return a.length - b.length;
  }
  function sortable(table) {
    var heads = table.querySelectorAll("thead th");
    heads.forEach(function (th, col) {
      th.classList.add("sortable");
      th.setAttribute("title", "sort by this column");
      th.addEventListener("click", function () {
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        rows.sort(function (r, s) {
          return dir * compare(key(r.cells[col].textContent), key(s.cells[col].textContent));
        });
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("section#all-errata table").forEach(sortable);
  });
})();
