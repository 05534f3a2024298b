/*
 * Live season page: the top 100 and a "find me" panel, updated in place from the socket
 * /ws/v1/seasons/{season}/live (README: Live boards). Plain JS, no dependencies. With a
 * region (data-region, from the page's ?region=) both follow that region's board.
 *
 * The client keeps the version it shows and its top 100. A "version" message applies
 * only on top of exactly that version (its previous_version, and top_diff.base_version
 * when it carries a diff); anything else means this page missed something, so it asks
 * for a fresh snapshot instead of showing a board mixed from two versions.
 */
(function () {
  "use strict";

  var PLAYER_RE = /^[A-Za-z0-9_.:-]{1,64}$/;
  var MAX_EVENTS = 12;
  var root = document.getElementById("live");
  // No board to follow (an unknown region): the page says so itself, nothing to connect to.
  if (!root || root.dataset.boardError) return;

  var el = {
    status: document.getElementById("lb-status"),
    state: document.getElementById("lb-state"),
    version: document.getElementById("lb-version"),
    asOf: document.getElementById("lb-asof"),
    total: document.getElementById("lb-total"),
    final: document.getElementById("lb-final"),
    finalVersion: document.getElementById("lb-final-version"),
    unavailable: document.getElementById("lb-unavailable"),
    unavailableDetail: document.getElementById("lb-unavailable-detail"),
    recovery: document.getElementById("lb-recovery"),
    recoveryBar: document.getElementById("lb-recovery-bar"),
    recoveryText: document.getElementById("lb-recovery-text"),
    board: document.getElementById("board"),
    topBody: document.querySelector("#lb-top tbody"),
    empty: document.getElementById("lb-empty"),
    form: document.getElementById("findme-form"),
    input: document.getElementById("findme-input"),
    clear: document.getElementById("findme-clear"),
    error: document.getElementById("findme-error"),
    me: document.getElementById("me"),
    meSummary: document.getElementById("me-summary"),
    meMovement: document.getElementById("me-movement"),
    meBody: document.querySelector("#me-neighbors tbody"),
    meTable: document.getElementById("me-neighbors"),
    meHistory: document.getElementById("me-history"),
    meEvents: document.getElementById("me-events"),
    boards: document.querySelectorAll("#lb-boards a")
  };

  var view = {
    version: null,      // the leaderboard_version shown, null when none
    top: [],
    playerId: null,
    radius: parseInt(root.dataset.radius || "5", 10),
    region: root.dataset.region || null,
    socket: null,
    retries: 0,
    retryTimer: null,
    stopped: false,
    snapshotAsked: false
  };

  // ------------------------------------------------------------------------ socket

  function socketUrl() {
    var scheme = location.protocol === "https:" ? "wss:" : "ws:";
    var params = [];
    if (view.region) params.push("region=" + encodeURIComponent(view.region));
    if (view.playerId) {
      params.push("player_id=" + encodeURIComponent(view.playerId), "radius=" + view.radius);
    }
    var url = scheme + "//" + location.host + root.dataset.socketPath;
    return params.length ? url + "?" + params.join("&") : url;
  }

  function connect() {
    if (view.retryTimer) { clearTimeout(view.retryTimer); view.retryTimer = null; }
    var socket = new WebSocket(socketUrl());
    view.socket = socket;
    view.snapshotAsked = false;
    setStatus("connecting", "Connecting…");
    socket.onopen = function () { view.retries = 0; };
    socket.onmessage = function (event) {
      if (socket !== view.socket) return;
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      handle(message);
    };
    socket.onclose = function (event) {
      if (socket !== view.socket) return;  // replaced by a new subscription
      closed(event);
    };
  }

  function reconnect() {
    var old = view.socket;
    view.socket = null;
    if (old) { try { old.close(1000, "resubscribe"); } catch (e) { /* already closed */ } }
    connect();
  }

  function closed(event) {
    view.socket = null;
    if (event.code === 4404) {
      view.stopped = true;
      setStatus("error", event.reason === "unknown_region" ? "Unknown region" : "Unknown season");
      return;
    }
    if (event.code === 4400 && view.playerId) {
      // The server refused the player id (its error message is already shown): watch
      // the board without it.
      view.playerId = null;
      setPlayerQuery(null);
      connect();
      return;
    }
    var delay = Math.min(30, Math.pow(2, view.retries)) * 1000;
    if (event.code === 4429) delay = Math.max(delay, 5000);
    view.retries += 1;
    root.classList.add("stale");
    setStatus("reconnecting", "Disconnected · reconnecting in " + Math.round(delay / 1000) + " s");
    view.retryTimer = setTimeout(connect, delay);
  }

  function requestSnapshot() {
    if (view.snapshotAsked || !view.socket || view.socket.readyState !== WebSocket.OPEN) return;
    view.snapshotAsked = true;
    view.socket.send(JSON.stringify({ type: "snapshot" }));
  }

  // ---------------------------------------------------------------------- messages

  function handle(message) {
    switch (message.type) {
      case "snapshot": return onSnapshot(message);
      case "version": return onVersion(message);
      case "unavailable": return onUnavailable(message);
      case "error": return onError(message);
      default: return undefined;
    }
  }

  function onSnapshot(message) {
    view.snapshotAsked = false;
    view.version = message.leaderboard_version;
    view.top = message.top;
    showBoard(message, {});
    if (message.player) showPlayer(message.player, message, null);
  }

  function onVersion(message) {
    var version = message.leaderboard_version;
    if (view.version !== null && version <= view.version) return;
    if (message.previous_version !== view.version) {
      requestSnapshot();  // a gap: what this page shows is not what the message builds on
      return;
    }
    var top;
    var changed = {};
    if (message.top_diff) {
      if (message.top_diff.base_version !== view.version) { requestSnapshot(); return; }
      try { top = applyDiff(view.top, message.top_diff); } catch (e) { requestSnapshot(); return; }
      message.top_diff.set.forEach(function (entry) { changed[entry.position] = true; });
    } else {
      top = message.top;
      top.forEach(function (entry, i) {
        var old = view.top[i];
        if (!old || old.player_id !== entry.player_id || old.score !== entry.score || old.rank !== entry.rank) {
          changed[entry.position] = true;
        }
      });
    }
    view.version = version;
    view.top = top;
    showBoard(message, changed);
    if (message.player) showPlayer(message.player, message, message.player.events || []);
  }

  function applyDiff(old, diff) {
    var top = old.slice(0, diff.length);
    while (top.length < diff.length) top.push(null);
    diff.set.forEach(function (entry) {
      var index = entry.position - 1;
      if (index < 0 || index >= diff.length) throw new Error("diff outside the top");
      top[index] = entry;
    });
    top.forEach(function (entry) { if (entry === null) throw new Error("diff leaves a hole"); });
    return top;
  }

  function onUnavailable(message) {
    view.snapshotAsked = false;
    view.version = null;
    view.top = [];
    showSeasonState(message.state, message.final_version);
    el.unavailable.hidden = false;
    el.board.hidden = true;
    el.me.hidden = true;
    el.version.textContent = "–";
    el.asOf.textContent = "–";
    el.total.textContent = "–";
    var recovery = message.recovery || null;
    showRecovery(recovery);
    setStatus("unavailable", recovery && recovery.status !== "queued"
      ? "Unavailable · rebuilding, " + recovery.percent + "%"
      : "Unavailable · waiting for the next version");
  }

  // The server repeats "unavailable" as a recovery advances: its progress, not a bare error.
  function showRecovery(recovery) {
    if (!el.unavailableDetail.dataset.plain) {
      el.unavailableDetail.dataset.plain = el.unavailableDetail.textContent;
    }
    if (!recovery) {
      el.recovery.hidden = true;
      el.unavailableDetail.textContent = el.unavailableDetail.dataset.plain;
      return;
    }
    el.unavailableDetail.textContent = "The board's data was lost and is being rebuilt from the ledger; " +
      "no score is lost.";
    el.recovery.hidden = false;
    el.recovery.dataset.status = recovery.status;
    el.recoveryBar.value = recovery.percent;
    el.recoveryText.textContent = describeRecovery(recovery);
  }

  function describeRecovery(recovery) {
    if (recovery.status === "queued") return "The rebuild is queued and starts shortly.";
    var copied = Number(recovery.done).toLocaleString() + " of " + Number(recovery.total).toLocaleString() +
      " players copied (" + recovery.percent + "%)";
    if (recovery.status === "comparing") {
      return copied + " · checking the rebuilt board against the ledger before it is published";
    }
    return copied + (recovery.eta_seconds == null ? "" : " · about " + formatEta(recovery.eta_seconds) + " left");
  }

  function formatEta(seconds) {
    if (seconds < 60) return Math.max(1, Math.round(seconds)) + " s";
    var minutes = Math.round(seconds / 60);
    if (minutes < 60) return minutes + " min";
    return Math.floor(minutes / 60) + " h " + (minutes % 60) + " min";
  }

  function onError(message) {
    if (message.error === "bad_player_id" || message.error === "bad_radius") {
      showFindError(message.detail || message.error);
    } else {
      setStatus("error", message.detail || message.error);
    }
  }

  // ----------------------------------------------------------------------- drawing

  function showBoard(message, changed) {
    root.classList.remove("stale");
    el.unavailable.hidden = true;
    el.board.hidden = false;
    showSeasonState(message.state, message.final_version);
    el.version.textContent = String(message.leaderboard_version);
    root.dataset.version = String(message.leaderboard_version);
    el.asOf.textContent = formatTime(message.as_of);
    el.asOf.setAttribute("datetime", message.as_of);
    el.total.textContent = Number(message.total_players).toLocaleString();
    fillRows(el.topBody, view.top, changed);
    el.empty.hidden = view.top.length > 0;
    suggestPlayer(view.top);
    setStatus(message.state === "FINAL" ? "final" : "live", message.state === "FINAL" ? "Final" : "Live");
  }

  function showSeasonState(state, finalVersion) {
    if (!state) return;
    el.state.textContent = state;
    root.dataset.state = state;
    var isFinal = state === "FINAL";
    el.final.hidden = !isFinal;
    if (isFinal) el.finalVersion.textContent = finalVersion == null ? "–" : String(finalVersion);
  }

  // Rows are reused: a version changes text in place, and the rows that changed flash.
  // Columns: position, rank, player (flag, name, id), the tier on a season with tiers, score.
  function fillRows(tbody, entries, changed) {
    var mine = view.playerId;
    var tiers = root.dataset.tiers === "true";
    var scoreAt = tiers ? 4 : 3;
    entries.forEach(function (entry, i) {
      var row = tbody.rows[i];
      if (!row) {
        row = tbody.insertRow(-1);
        for (var c = 0; c <= scoreAt; c++) row.insertCell(-1);
        row.cells[0].className = "num";
        row.cells[1].className = "num";
        row.cells[2].className = "player";
        if (tiers) row.cells[3].className = "tier";
        row.cells[scoreAt].className = "num";
      }
      setText(row.cells[0], entry.position);
      setText(row.cells[1], entry.rank);
      fillPlayer(row.cells[2], entry);
      if (tiers) setText(row.cells[3], entry.tier || "");
      setText(row.cells[scoreAt], Number(entry.score).toLocaleString());
      row.dataset.player = entry.player_id;
      row.classList.toggle("me", entry.player_id === mine);
      if (changed[entry.position]) flash(row);
    });
    while (tbody.rows.length > entries.length) tbody.deleteRow(-1);
  }

  // A player as people know them: their country's flag and name, with the id beside it;
  // the id alone when they have no name. Text only (names come from players).
  function fillPlayer(cell, entry) {
    var key = (entry.country || "") + "|" + (entry.display_name || "") + "|" + entry.player_id;
    if (cell.dataset.key === key) return;
    cell.dataset.key = key;
    cell.textContent = "";
    if (entry.country) {
      var flag = document.createElement("span");
      flag.className = "flag";
      flag.title = entry.country;
      flag.textContent = flagOf(entry.country);
      cell.appendChild(flag);
    }
    if (entry.display_name) {
      var name = document.createElement("span");
      name.className = "name";
      name.textContent = entry.display_name;
      cell.appendChild(name);
      var id = document.createElement("small");
      id.className = "id";
      id.textContent = entry.player_id;
      cell.appendChild(id);
    } else {
      cell.appendChild(document.createTextNode(entry.player_id));
    }
  }

  // An ISO 3166-1 alpha-2 code as its flag: two regional indicator symbols.
  function flagOf(country) {
    return String.fromCodePoint(0x1F1E6 + country.charCodeAt(0) - 65, 0x1F1E6 + country.charCodeAt(1) - 65);
  }

  function setText(cell, value) {
    var text = String(value);
    if (cell.textContent !== text) cell.textContent = text;
  }

  function flash(row) {
    row.classList.remove("changed");
    void row.offsetWidth;  // restart the animation
    row.classList.add("changed");
  }

  // The input's example is an id of this board, whatever ids look like in this game.
  function suggestPlayer(top) {
    if (!top.length || el.input.dataset.suggested) return;
    el.input.placeholder = "e.g. " + top[Math.min(top.length, 42) - 1].player_id;
    el.input.dataset.suggested = "true";
  }

  function showPlayer(player, message, events) {
    el.me.hidden = false;
    // A player not on the board has no neighbours: no empty table under the sentence.
    el.meTable.hidden = !player.ranked;
    if (!player.ranked) {
      el.meSummary.textContent = player.player_id + " is not on the " +
        (view.region ? "board of region " + view.region : "board") + " in version " +
        message.leaderboard_version + ".";
      fillRows(el.meBody, [], {});
    } else {
      var e = player.entry;
      el.meSummary.textContent = (e.display_name ? e.display_name + " (" + player.player_id + ")" : player.player_id) +
        ": rank " + e.rank + " · position " + e.position + " of " + Number(message.total_players).toLocaleString() +
        " · score " + Number(e.score).toLocaleString() +
        (player.percentile == null ? "" : " · ahead of " + player.percentile.toFixed(2) + "% of players") +
        (e.tier ? " · " + e.tier : "");
      fillRows(el.meBody, player.neighbors, {});
    }
    el.meSummary.dataset.rank = player.ranked ? String(player.entry.rank) : "";
    showMovement(player);
    // Newest first on the page, and a version's own events in the order they happened.
    (events || []).slice().reverse().forEach(function (event) { addEvent(event, message.leaderboard_version); });
  }

  // Movement: the followed player's rank in the snapshot a day before the latest (the
  // global board's hourly snapshots), as the socket sends it, set against the live rank.
  function showMovement(player) {
    var then = player && player.ranked ? player.rank_24h_ago : null;
    el.meMovement.hidden = then == null;
    if (then == null) return;
    var moved = then - player.entry.rank;  // a smaller rank is higher up
    el.meMovement.dataset.moved = moved > 0 ? "up" : moved < 0 ? "down" : "same";
    el.meMovement.textContent = moved > 0 ? "▲ up " + moved + " since yesterday (rank " + then + ")" :
      moved < 0 ? "▼ down " + (-moved) + " since yesterday (rank " + then + ")" :
      "= same rank as yesterday";
  }

  function addEvent(event, version) {
    el.meHistory.hidden = false;
    var item = document.createElement("li");
    item.textContent = "v" + version + ": " + describe(event);
    item.dataset.type = event.type;
    el.meEvents.insertBefore(item, el.meEvents.firstChild);
    while (el.meEvents.children.length > MAX_EVENTS) el.meEvents.removeChild(el.meEvents.lastChild);
  }

  function describe(event) {
    switch (event.type) {
      case "rank_changed":
        return (event.to < event.from ? "up" : "down") + " from rank " + event.from + " to " + event.to;
      case "score_changed":
        return "score " + Number(event.from).toLocaleString() + " → " + Number(event.to).toLocaleString();
      case "entered_top_100": return "entered the top 100 at position " + event.position;
      case "left_top_100": return "left the top 100";
      case "ranked": return "on the board at rank " + event.rank;
      case "unranked": return "no longer on the board";
      default: return event.type;
    }
  }

  function setStatus(kind, text) {
    el.status.className = "status status-" + kind;
    el.status.textContent = text;
    root.dataset.status = kind;
  }

  function formatTime(iso) {
    var date = new Date(iso);
    return isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
  }

  function showFindError(text) {
    el.error.textContent = text;
    el.error.hidden = !text;
  }

  // ----------------------------------------------------------------------- find me

  function setPlayerQuery(playerId) {
    var url = new URL(location.href);
    if (playerId) url.searchParams.set("player_id", playerId); else url.searchParams.delete("player_id");
    history.replaceState(null, "", url.toString());
    boardLinks(playerId);
  }

  // The board switcher's links keep following the player this page follows.
  function boardLinks(playerId) {
    Array.prototype.forEach.call(el.boards, function (link) {
      var params = new URLSearchParams();
      if (link.dataset.board) params.set("region", link.dataset.board);
      if (playerId) params.set("player_id", playerId);
      link.setAttribute("href", "?" + params.toString());
    });
  }

  el.form.addEventListener("submit", function (event) {
    event.preventDefault();
    var playerId = el.input.value.trim();
    if (!PLAYER_RE.test(playerId)) {
      showFindError("A player id is 1 to 64 characters from A-Z a-z 0-9 _ . : -");
      return;
    }
    showFindError("");
    view.playerId = playerId;
    el.meEvents.textContent = "";
    el.meHistory.hidden = true;
    setPlayerQuery(playerId);
    reconnect();
  });

  el.clear.addEventListener("click", function () {
    el.input.value = "";
    showFindError("");
    view.playerId = null;
    el.me.hidden = true;
    el.meEvents.textContent = "";
    el.meHistory.hidden = true;
    setPlayerQuery(null);
    reconnect();
  });

  var initial = new URL(location.href).searchParams.get("player_id");
  if (initial && PLAYER_RE.test(initial)) {
    view.playerId = initial;
    el.input.value = initial;
    boardLinks(initial);
  }
  showSeasonState(root.dataset.state, root.dataset.finalVersion || null);
  connect();
})();
