// Lockkeeper dashboard behaviour that htmx does not cover. Loaded as a file (no
// inline script), so the Content-Security-Policy `default-src 'self'` holds.
(function () {
  "use strict";

  // Polls give up after this long, so a hung server shows as offline within
  // about one poll interval instead of the 15 s default timeout. Not the
  // charts' (#activity): they are counted, not read, and take seconds on a
  // busy service while the table's polls are answered at once. Given up at
  // 4 s, the first drawing (loaded once) never came and the page said it was
  // offline; the table's polls tell a hung server already.
  var POLL_TIMEOUT = "4s";
  // How long "Reconnected" stays up once requests work again.
  var RECOVERED_MS = 6000;

  function csrfToken() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : null;
  }

  // CSRF: every htmx request carries the token of <meta name="csrf-token">, in
  // one place, whatever htmx 4's attribute inheritance would do.
  document.addEventListener("htmx:config:request", function (event) {
    var ctx = event.detail && event.detail.ctx;
    if (!ctx || !ctx.request) return;
    var token = csrfToken();
    if (token && ctx.request.headers) ctx.request.headers["X-CSRFToken"] = token;
    var source = ctx.sourceElement;
    if (source && source.classList && source.classList.contains("poller") &&
        !source.closest("#activity")) {
      ctx.request.timeout = POLL_TIMEOUT;
    }
  });

  // The audit's live tail keeps the reader's place: while they have scrolled
  // down the page (reading older rows), its poll is skipped, so no new row
  // pushes what they read away. Back at the top, the next poll brings them in.
  var TAIL_SCROLL_SLACK = 40;
  document.addEventListener("htmx:config:request", function (event) {
    var ctx = event.detail && event.detail.ctx;
    var source = ctx && ctx.sourceElement;
    if (!source || !source.classList || !source.classList.contains("poller")) return;
    if (!source.closest("#audit-results")) return;
    if (window.scrollY > TAIL_SCROLL_SLACK) event.preventDefault();
  });

  // -- connection state -------------------------------------------------------
  // A failed request (network error, timeout, 502/503/504 from a proxy or the
  // server) turns the page offline: a banner, the live indicator says so, the
  // actions are disabled. The next request that works turns it back and says so.

  var offlineSince = null;
  var recoveredTimer = null;

  function clock(date) {
    return date.toISOString().slice(11, 19) + "Z";
  }

  function banner() {
    return document.getElementById("connection");
  }

  function setActionsDisabled(disabled) {
    document.querySelectorAll("[data-needs-connection]").forEach(function (el) {
      if (el.tagName === "BUTTON") {
        el.disabled = disabled;
      } else if (disabled) {
        el.setAttribute("aria-disabled", "true");
      } else {
        el.removeAttribute("aria-disabled");
      }
    });
  }

  function showLiveStatus() {
    document.querySelectorAll(".live").forEach(function (status) {
      var text = status.querySelector(".live-text");
      if (!text) return;
      if (offlineSince) {
        if (!text.dataset.liveText) text.dataset.liveText = text.textContent;
        text.textContent = "Offline since " + clock(offlineSince) + ", retrying.";
        status.classList.add("live-offline");
      } else if (text.dataset.liveText) {
        text.textContent = text.dataset.liveText;
        delete text.dataset.liveText;
        status.classList.remove("live-offline");
      }
    });
  }

  function goOffline(why) {
    var box = banner();
    if (!offlineSince) offlineSince = new Date();
    clearTimeout(recoveredTimer);
    document.documentElement.classList.add("offline");
    if (box) {
      box.className = "connection-banner connection-offline";
      box.querySelector(".connection-title").textContent = "Offline.";
      box.querySelector(".connection-text").textContent =
        "Lockkeeper has not answered since " + clock(offlineSince) + " (" + why +
        "). What you see may be out of date, and actions are disabled until " +
        "the connection is back; the page keeps retrying.";
      box.hidden = false;
    }
    setActionsDisabled(true);
    showLiveStatus();
  }

  function goOnline() {
    if (!offlineSince) return;
    var box = banner();
    var was = offlineSince;
    offlineSince = null;
    document.documentElement.classList.remove("offline");
    setActionsDisabled(false);
    showLiveStatus();
    if (box) {
      box.className = "connection-banner connection-restored";
      box.querySelector(".connection-title").textContent = "Reconnected.";
      box.querySelector(".connection-text").textContent =
        "The connection is back (it was lost from " + clock(was) + " to " +
        clock(new Date()) + "); the page shows current data again.";
      box.hidden = false;
      recoveredTimer = setTimeout(function () { box.hidden = true; }, RECOVERED_MS);
    }
  }

  // htmx reports a request that timed out with the abort reason "timeout", and
  // a network failure as fetch's TypeError; other errors (a script error while
  // swapping) say nothing about the connection.
  document.addEventListener("htmx:error", function (event) {
    var error = event.detail && event.detail.error;
    var ctx = event.detail && event.detail.ctx;
    if (error === "timeout" || (error && error.name === "TimeoutError")) {
      goOffline("no answer in time");
    } else if (error instanceof TypeError && ctx && !ctx.response) {
      goOffline("no connection");  // fetch() itself failed: no response at all
    }
  });

  document.addEventListener("htmx:after:request", function (event) {
    var ctx = event.detail && event.detail.ctx;
    var status = ctx && ctx.response && ctx.response.status;
    if (!status) return;
    if (status === 502 || status === 503 || status === 504) {
      goOffline("the server answered " + status);
      return;
    }
    goOnline();
    var source = ctx.sourceElement;
    if (source && source.classList && source.classList.contains("poller")) {
      var region = source.closest(".live-region");
      var checked = region && region.querySelector(".checked-at");
      if (checked) {
        var now = new Date();
        checked.textContent = clock(now);
        checked.setAttribute("datetime", now.toISOString());
      }
    }
  });

  // A disabled action link does nothing (a link cannot be disabled natively).
  document.addEventListener("click", function (event) {
    var action = event.target.closest && event.target.closest("[data-needs-connection]");
    if (action && offlineSince) {
      event.preventDefault();
      event.stopImmediatePropagation();
      var box = banner();
      if (box) box.focus && box.focus();
    }
  }, true);

  // -- the confirmation dialog ------------------------------------------------
  // htmx swaps a release or claim form into #action-panel inside <dialog>; we
  // open it modally with focus in the reason field, and give focus back to the
  // button that opened it when it closes. A success message leaves the dialog
  // for the page's message area.

  var opener = null;

  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest('[hx-target="#action-panel"]');
    // What opened the dialog, not the dialog's own submit button.
    if (link && !link.closest("#action-dialog")) opener = link.id || link;
    var cancel = event.target.closest && event.target.closest("#action-dialog [data-close-dialog]");
    if (cancel) {
      event.preventDefault();
      document.getElementById("action-dialog").close();
    }
  });

  // The first field that needs the operator: an invalid one, else the first
  // empty one (a freeze opens on its prefix when none is given), else the first.
  function focusField(panel) {
    var fields = Array.prototype.slice.call(panel.querySelectorAll(
      "input:not([type=hidden]):not([type=checkbox]):not([readonly]), textarea, select"));
    var empty = fields.filter(function (f) { return !f.value; })[0];
    var field = panel.querySelector('[aria-invalid="true"]') || empty ||
      panel.querySelector("[autofocus]") ||
      panel.querySelector("input:not([type=hidden]), textarea, button");
    if (field) field.focus();
  }

  // After a successful action the row it came from may go away (released,
  // refreshed): focus moves to the next row, else the previous, else the table;
  // never to <body>.
  var afterAction = null;

  function rowsAround(el) {
    var row = el && el.closest && el.closest("tr[id]");
    if (!row) return null;
    var next = row.nextElementSibling, prev = row.previousElementSibling;
    return { next: next && next.id, prev: prev && prev.id };
  }

  function focusRow(id) {
    var row = id && document.getElementById(id);
    var target = row && (row.querySelector("td.resource a") || row.querySelector("a, button, input"));
    if (!target) return false;
    target.focus();
    return true;
  }

  function focusAfterAction(ids) {
    if (focusRow(ids.next) || focusRow(ids.prev)) return;
    var table = document.getElementById("locks-table");
    if (table) {
      table.setAttribute("tabindex", "-1");
      table.focus();
    }
  }

  document.addEventListener("htmx:after:swap", function (event) {
    var ctx = event.detail && event.detail.ctx;
    var target = ctx && ctx.target;
    if (!target || target.id !== "action-panel") return;
    var dialog = document.getElementById("action-dialog");
    var success = target.querySelector(".message-success");
    if (success) {
      var messages = document.getElementById("messages");
      if (messages) messages.replaceChildren(success);
      var from = typeof opener === "string" ? document.getElementById(opener) : opener;
      afterAction = rowsAround(from);
      ownAction = true;
      if (dialog && dialog.open) dialog.close();
      return;
    }
    if (!dialog) return;
    var heading = target.querySelector("h1, h2");
    if (heading && heading.id) dialog.setAttribute("aria-labelledby", heading.id);
    if (!dialog.open) dialog.showModal();
    focusField(target);
  });

  document.addEventListener("close", function (event) {
    if (event.target.id !== "action-dialog") return;
    var panel = document.getElementById("action-panel");
    if (panel) panel.replaceChildren();
    var back = typeof opener === "string" ? document.getElementById(opener) : opener;
    opener = null;
    if (afterAction) {
      var ids = afterAction;
      afterAction = null;
      focusAfterAction(ids);
      return;
    }
    if (back && back.isConnected) back.focus();
  }, true);

  // -- an order that holds still ----------------------------------------------
  // A poll brings the rows in the server's order. While the operator looks at
  // the table (the pointer on it, focus in it, or either within the last
  // QUIET_MS), the rows keep the order shown: values change in place, a row
  // new to the page comes last, a row that left the page stays, dimmed, until
  // the order is re-sorted; a note says so, with "Re-sort now". At a quiet
  // moment the table re-sorts by itself. A poll after the operator's own
  // action drops the rows that left (the released one goes).
  var QUIET_MS = 8000;
  var pointerOnTable = false;
  var lookedAt = -QUIET_MS;
  var serverOrder = null;  // the ids of the last poll, in the server's order
  var ownAction = false;

  function lockTable() {
    return document.getElementById("locks-table");
  }

  function looking() {
    var table = lockTable();
    if (!table) return false;
    return pointerOnTable || table.contains(document.activeElement) ||
      performance.now() - lookedAt < QUIET_MS;
  }

  document.addEventListener("pointerover", function (event) {
    var on = !!(event.target.closest && event.target.closest("#locks-table"));
    if (on || pointerOnTable) lookedAt = performance.now();
    pointerOnTable = on;
  });
  document.addEventListener("pointerout", function (event) {
    if (!event.relatedTarget && pointerOnTable) {  // out of the window
      pointerOnTable = false;
      lookedAt = performance.now();
    }
  });
  document.addEventListener("focusout", function (event) {
    if (event.target.closest && event.target.closest("#locks-table")) lookedAt = performance.now();
  });

  function rowIds(tbody) {
    return Array.prototype.slice.call(tbody.querySelectorAll(":scope > tr[id]"))
      .map(function (row) { return row.id; });
  }

  function heldNote(count) {
    var note = document.createElement("p");
    note.id = "order-held";
    note.className = "order-held";
    note.setAttribute("role", "status");
    note.append("Order held while you look: " + count + " row" + (count === 1 ? "" : "s") +
      " would move. ");
    var button = document.createElement("button");
    button.type = "button";
    button.className = "small";
    button.id = "resort-now";
    button.textContent = "Re-sort now";
    note.append(button);
    return note;
  }

  document.addEventListener("htmx:before:swap", function (event) {
    var ctx = event.detail && event.detail.ctx;
    var source = ctx && ctx.sourceElement;
    var tasks = event.detail && event.detail.tasks;
    if (!source || !source.classList || !source.classList.contains("poller") || !tasks) return;
    var current = lockTable();
    if (!current || !source.closest("#live")) return;
    var dropLeft = ownAction;
    tasks.forEach(function (task) {
      // A poll that changed no row brings only the rows' time left, no table.
      var table = task.fragment && task.fragment.querySelector("#locks-table");
      if (!table || !table.tBodies.length) return;
      ownAction = false;
      var tbody = table.tBodies[0];
      serverOrder = rowIds(tbody);
      if (!looking()) return;
      var incoming = {};
      tbody.querySelectorAll(":scope > tr[id]").forEach(function (row) { incoming[row.id] = row; });
      var ordered = [];
      rowIds(current.tBodies[0]).forEach(function (id) {
        if (incoming[id]) {
          ordered.push(incoming[id]);
          delete incoming[id];
        } else if (!dropLeft) {
          var left = document.getElementById(id).cloneNode(true);
          left.classList.add("row-left");
          left.title = "No longer on this page of the order: re-sort to update";
          ordered.push(left);
        }
      });
      serverOrder.forEach(function (id) { if (incoming[id]) ordered.push(incoming[id]); });
      var moved = 0;
      ordered.forEach(function (row, i) { if (serverOrder[i] !== row.id) moved++; });
      if (!moved) return;
      var empty = tbody.querySelector(":scope > tr:not([id])");
      if (empty) empty.remove();
      ordered.forEach(function (row) { tbody.appendChild(row); });
      var scroll = table.closest(".table-scroll") || table;
      scroll.before(heldNote(moved));
    });
  });

  // Re-sort: the rows in the last poll's order, those that left it gone.
  function resort() {
    var table = lockTable();
    var note = document.getElementById("order-held");
    if (note) note.remove();
    if (!table || !serverOrder) return;
    var tbody = table.tBodies[0];
    tbody.querySelectorAll(":scope > tr.row-left").forEach(function (row) { row.remove(); });
    serverOrder.forEach(function (id) {
      var row = document.getElementById(id);
      if (row && row.parentNode === tbody) tbody.appendChild(row);
    });
  }

  document.addEventListener("click", function (event) {
    if (event.target.closest && event.target.closest("#resort-now")) {
      var focused = document.activeElement;
      resort();
      var table = lockTable();
      if (focused && focused.isConnected && focused.id === "resort-now" && table) {
        table.setAttribute("tabindex", "-1");
        table.focus();
      }
    }
  });

  setInterval(function () {
    if (document.getElementById("order-held") && !looking()) resort();
  }, 1000);

  // -- keys -------------------------------------------------------------------
  // In a confirmation, Enter confirms from the usual-reason picker and from the
  // reason's text too (Shift+Enter: a new line), as it does from a text field.
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Enter" || event.shiftKey || event.ctrlKey || event.metaKey ||
        event.altKey || event.isComposing) return;
    var el = event.target;
    if (!el || !/^(SELECT|TEXTAREA)$/.test(el.tagName)) return;
    if (!el.closest("#action-dialog") || !el.form) return;
    event.preventDefault();
    el.form.requestSubmit();
  });

  // A search sent from the keyboard lands on its first row, so the row keys
  // below act on what was found ("/" goes back to the search).
  var searchSent = false;
  document.addEventListener("submit", function (event) {
    searchSent = !!(event.target.matches && event.target.matches("form.search"));
  }, true);
  document.addEventListener("htmx:after:swap", function (event) {
    var ctx = event.detail && event.detail.ctx;
    var target = ctx && ctx.target;
    if (!searchSent || !target || target.id !== "locks") return;
    searchSent = false;
    var first = document.querySelector("#locks-table tbody tr[id] td.resource a");
    if (first) first.focus();
  });

  // The focused row's own action link (in its menu), by the suffix of its id.
  function rowAction(el, suffixes) {
    var row = el && el.closest && el.closest("#locks-table tbody tr[id]");
    if (!row) return null;
    for (var i = 0; i < suffixes.length; i++) {
      var link = document.getElementById(row.id + suffixes[i]);
      if (link) return link;
    }
    return null;
  }

  // "/" search, "j" / "k" next / previous row, "r" release or "c" claim the
  // focused row's lock, "f" freeze a prefix: listed on the page (#shortcuts).
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    var el = event.target;
    if (el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName))) return;
    var dialog = document.getElementById("action-dialog");
    if (dialog && dialog.open) return;
    if (event.key === "/") {
      var search = document.querySelector("[data-search-key]");
      if (search) {
        event.preventDefault();
        search.focus();
        search.select && search.select();
      }
      return;
    }
    var action = null;
    if (event.key === "r") action = rowAction(el, ["-release", "-holders"]);
    else if (event.key === "c") action = rowAction(el, ["-claim"]);
    else if (event.key === "f") action = document.querySelector("#freezes .freeze-link a");
    if (action) {
      event.preventDefault();
      action.click();
      return;
    }
    if (event.key !== "j" && event.key !== "k") return;
    var rows = Array.prototype.slice.call(
      document.querySelectorAll("#locks-table tbody tr[id], #groups-table tbody tr[id], table.events tbody tr"));
    if (!rows.length) return;
    event.preventDefault();
    var current = el && el.closest && el.closest("tr");
    var index = rows.indexOf(current);
    var next = index < 0 ? 0 : index + (event.key === "j" ? 1 : -1);
    next = Math.max(0, Math.min(rows.length - 1, next));
    var target = rows[next].querySelector("td.resource a") ||
      rows[next].querySelector("a, button, input");
    if (target) target.focus();
  });

  // -- times that move -------------------------------------------------------
  // Remaining ttl: each <span class="ttl" data-ttl="seconds"> counts down from the
  // moment it arrived (page load or swap), so client clock skew does not matter.
  // Ages (<time data-age="seconds">, "3 min ago", "stale for 2 min") count up.
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

  function formatAge(seconds) {
    seconds = Math.max(seconds, 0);
    if (seconds < 60) return seconds.toFixed(0) + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min";
    return format(seconds);
  }

  function since(el, now, value) {
    // A morph may keep the element but change its value: restart the clock.
    var seen = arrived.get(el);
    if (!seen || seen.value !== value) {
      seen = { at: now, value: value };
      arrived.set(el, seen);
    }
    return (now - seen.at) / 1000;
  }

  function tick() {
    var now = performance.now();
    document.querySelectorAll(".ttl[data-ttl]").forEach(function (el) {
      var left = parseFloat(el.dataset.ttl) - since(el, now, el.dataset.ttl);
      var text = format(left);
      if (el.textContent !== text) el.textContent = text;
      el.classList.toggle("ttl-expired", left <= 0);
    });
    document.querySelectorAll("time[data-age]").forEach(function (el) {
      var age = parseFloat(el.dataset.age) + since(el, now, el.dataset.age);
      var text = (el.dataset.prefix || "") + formatAge(age) + (el.dataset.suffix || "");
      if (el.textContent !== text) el.textContent = text;
    });
  }

  setInterval(tick, 1000);
  document.addEventListener("DOMContentLoaded", tick);
  document.addEventListener("htmx:after:swap", tick);
})();
