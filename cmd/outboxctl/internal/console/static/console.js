// outbox console: progressive enhancement only; every page works without it.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  // "Select all" ticks every open letter on the page.
  var all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll("input.pick").forEach(function (box) { box.checked = all.checked; });
    });
  }
  // Redrive selected: refuse an empty selection before the round trip.
  var sel = document.getElementById("redrive-selection");
  if (sel) {
    sel.addEventListener("submit", function (ev) {
      if (!sel.querySelector("input.pick:checked")) {
        ev.preventDefault();
        alert("Select at least one open letter.");
      }
    });
  }
  // A confirmed action is sent once, however often the button is pressed.
  document.querySelectorAll("form[method=post]").forEach(function (form) {
    form.addEventListener("submit", function () {
      form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    });
  });
});
