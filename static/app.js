// Lockkeeper dashboard behaviour that htmx does not cover. Loaded as a file (no
// inline script), so the Content-Security-Policy `default-src 'self'` holds.
(function () {
  "use strict";

  // CSRF: every htmx request carries the token of <meta name="csrf-token">, in
  // one place, whatever htmx 4's attribute inheritance would do.
  document.addEventListener("htmx:config:request", function (event) {
    var meta = document.querySelector('meta[name="csrf-token"]');
    var ctx = event.detail && event.detail.ctx;
    if (meta && ctx && ctx.request && ctx.request.headers) {
      ctx.request.headers["X-CSRFToken"] = meta.content;
    }
  });

  // Remaining ttl: each <span class="ttl" data-ttl="seconds"> counts down from the
  // moment it arrived (page load or swap), so client clock skew does not matter.
  var arrived = new WeakMap();

  function format(seconds) {
    if (seconds <= 0) return "expired";
    if (seconds < 60) return seconds.toFixed(0) + " s";
    var s = Math.floor(seconds);
    var d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
    var m = Math.floor((s % 3600) / 60), r = s % 60;
    if (d) return d + " d " + h + " h";
    if (h) return h + " h " + m + " min";
    return m + " min " + r + " s";
  }

  function tick() {
    var now = performance.now();
    document.querySelectorAll(".ttl[data-ttl]").forEach(function (el) {
      if (!arrived.has(el)) arrived.set(el, now);
      var left = parseFloat(el.dataset.ttl) - (now - arrived.get(el)) / 1000;
      var text = format(left);
      if (el.textContent !== text) el.textContent = text;
      el.classList.toggle("ttl-expired", left <= 0);
    });
  }

  setInterval(tick, 1000);
  document.addEventListener("DOMContentLoaded", tick);
  document.addEventListener("htmx:after:swap", tick);
})();
