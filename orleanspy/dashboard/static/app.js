// The orleanspy dashboard: renders the JSON of /api/* with textContent only.
(function () {
  "use strict";
  const meta = n => document.querySelector('meta[name="orleanspy-' + n + '"]').content;
  const PAGE = meta("page"), CSRF = meta("csrf"), READ_ONLY = meta("read-only") === "true";
  const main = document.getElementById("main");
  const COLORS = ["#3b5bdb", "#e8590c", "#2b8a3e", "#ae3ec9", "#1098ad", "#c92a2a", "#5c940d"];

  function h(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    for (const k in (attrs || {})) {
      if (k === "class") node.className = attrs[k];
      else if (k === "style") node.style.cssText = attrs[k];  // CSSOM: allowed by the CSP
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), attrs[k]);
      else node.setAttribute(k, attrs[k]);
    }
    for (const kid of kids) {
      if (kid === null || kid === undefined) continue;
      node.appendChild(typeof kid === "object" ? kid : document.createTextNode(String(kid)));
    }
    return node;
  }
  function card(title, ...kids) { return h("section", {class: "card"}, h("h2", {}, title), ...kids); }
  function table(headers, rows, opts) {
    opts = opts || {};
    const head = h("tr", {}, ...headers.map(t => h("th", {class: opts.num && opts.num.includes(t) ? "num" : ""}, t)));
    const body = rows.map(r => {
      const tr = h("tr", r.attrs || {}, ...r.cells.map((c, i) =>
        h("td", {class: opts.num && opts.num.includes(headers[i]) ? "num" : ""}, c)));
      return tr;
    });
    return h("table", opts.id ? {id: opts.id} : {}, h("thead", {}, head), h("tbody", {}, ...body));
  }
  const dash = v => (v === null || v === undefined ? "–" : v);
  function ago(iso) {
    if (!iso) return "–";
    const s = (Date.now() - Date.parse(iso)) / 1000;
    if (s < 0) return "in " + dur(-s);
    return s < 1 ? "just now" : dur(s) + " ago";
  }
  function dur(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1) return "now";
    if (s < 60) return Math.round(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }
  const time = iso => (iso ? new Date(iso).toISOString().replace("T", " ").slice(0, 23) + "Z" : "–");
  const badge = s => h("span", {class: "badge s-" + s}, s);

  // -- live updates: one stream per page -------------------------------------------------
  function live(page, render) {
    const marker = document.getElementById("live");
    fetch("api/" + page).then(r => r.json()).then(render).catch(() => {});
    const source = new EventSource("api/events?page=" + page);
    source.onopen = () => { marker.textContent = "live"; marker.className = "live on"; };
    source.onerror = () => { marker.textContent = "reconnecting…"; marker.className = "live"; };
    source.onmessage = e => render(JSON.parse(e.data));
    source.addEventListener("failure", e => { marker.textContent = "store: " + JSON.parse(e.data); });
  }

  // -- cluster ---------------------------------------------------------------------------
  function renderCluster(doc) {
    document.getElementById("cluster-id").textContent =
      "· cluster " + doc.cluster_id + " · service " + doc.service_id + " · membership v" + doc.table_version +
      " · feature level " + doc.feature_level + " · " + doc.ring + " ring";
    const rows = doc.silos.map(s => ({attrs: {"data-silo": s.name, "data-status": s.status}, cells: [
      s.name, badge(s.status), s.address, dash(s.version), dash(s.protocols), s.status === "active" ? dur(s.uptime_seconds) : "–",
      s.ring_share_percent.toFixed(1) + " %", dash(s.activations), dash(s.reminders_held),
      s.cpu_percent === null ? "–" : s.cpu_percent.toFixed(0) + " %",
      s.loop_lag_seconds === null ? "–" : (s.loop_lag_seconds * 1000).toFixed(1) + " ms",
      ago(s.last_heartbeat)]}));
    const kinds = {joined: "joined", suspected: "suspected", dead: "dead (its last heartbeat)"};
    const events = doc.events.slice().reverse().map(e => ({cells: [
      time(e.at), kinds[e.kind] || e.kind, e.name || e.silo, e.by ? "voted by " + e.by : ""]}));
    main.replaceChildren(
      card("Silos", table(["Silo", "Status", "Address", "Version", "Protocols", "Uptime", "Ring", "Activations",
                           "Reminders held", "CPU", "Loop lag", "Last heartbeat"], rows,
                          {id: "silos", num: ["Ring", "Activations", "Reminders held", "CPU", "Loop lag"]})),
      card("Membership events", events.length ? table(["When", "Event", "Silo", "Vote"], events, {id: "events"})
                                                : h("p", {class: "muted"}, "none yet")));
  }

  // -- grains ----------------------------------------------------------------------------
  function renderGrains(doc) {
    const act = doc.activations.map(a => ({cells: [a.grain_type, ...doc.silos.map(s => dash(a.by_silo[s])), a.total]}));
    const calls = doc.calls.map(c => ({cells: [c.grain_type, c.method, c.calls_per_s.toFixed(1),
                                               c.errors_per_s.toFixed(2), c.calls, c.errors]}));
    main.replaceChildren(
      card("Activations by type and silo", act.length ? table(["Grain type", ...doc.silos, "Total"], act,
           {id: "activations", num: [...doc.silos, "Total"]}) : h("p", {class: "muted"}, "no activations")),
      card("Calls by type and method", calls.length ? table(
           ["Grain type", "Method", "Calls/s", "Errors/s", "Calls", "Errors"], calls,
           {id: "calls", num: ["Calls/s", "Errors/s", "Calls", "Errors"]})
           : h("p", {class: "muted"}, "no calls recorded (silos record with --metrics-port or --dashboard-port)")));
  }

  // -- timeliness ------------------------------------------------------------------------
  let charts = null;
  function chartCard(title, id) {
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("class", "chart"); svg.setAttribute("id", id);
    const legend = h("div", {class: "legend", id: id + "-legend"});
    return {node: card(title, svg, legend), svg: svg, legend: legend};
  }
  function legendOf(target, series) {
    target.replaceChildren(...series.map(s => h("span", {}, h("i", {style: "background:" + s.color}), s.name)));
  }
  function renderTimeliness(doc) {
    if (!charts) {
      charts = {late: chartCard("Lateness by priority (ms): p50 and p99", "chart-lateness"),
                ticks: chartCard("Ticks per second", "chart-ticks"),
                missed: chartCard("Missed ticks per second, by action", "chart-missed"),
                totals: h("section", {class: "card"})};
      main.replaceChildren(h("div", {class: "grid2"}, charts.late.node, charts.ticks.node, charts.missed.node), charts.totals);
    }
    const pts = doc.points;
    const prios = new Set(), actions = new Set();
    for (const p of pts) { Object.keys(p.lateness_ms).forEach(k => prios.add(k)); Object.keys(p.missed_per_s).forEach(k => actions.add(k)); }
    const late = [];
    let i = 0;
    for (const pr of [...prios].sort()) {
      const c = COLORS[i++ % COLORS.length];
      late.push({name: pr + " p50", color: c, points: pts.map(p => [p.t, p.lateness_ms[pr] ? p.lateness_ms[pr].p50 : null])});
      late.push({name: pr + " p99", color: c + "88", points: pts.map(p => [p.t, p.lateness_ms[pr] ? p.lateness_ms[pr].p99 : null])});
    }
    window.drawChart(charts.late.svg, late, {unit: "ms"}); legendOf(charts.late.legend, late);
    const ticks = [{name: "all", color: COLORS[0], points: pts.map(p => [p.t, p.ticks_per_s])},
                   {name: "grain errors", color: COLORS[5], points: pts.map(p => [p.t, p.tick_errors_per_s])}];
    window.drawChart(charts.ticks.svg, ticks); legendOf(charts.ticks.legend, ticks);
    i = 1;
    const missed = actions.size ? [...actions].sort().map(a => ({name: a, color: COLORS[i++ % COLORS.length], points: pts.map(p => [p.t, p.missed_per_s[a] || 0])}))
                                : [{name: "none missed", color: COLORS[2], points: pts.map(p => [p.t, 0])}];
    window.drawChart(charts.missed.svg, missed); legendOf(charts.missed.legend, missed);
    const totals = [...Object.entries(doc.missed_total).map(([k, v]) => ({cells: ["missed: " + k, v]})),
                    ...Object.entries(doc.causes_total).map(([k, v]) => ({cells: [k.replace(/_/g, " "), v]}))];
    charts.totals.replaceChildren(h("h2", {}, "Missed ticks and causes (since each silo started)"),
      totals.length ? table(["What", "Count"], totals, {id: "causes", num: ["Count"]}) : h("p", {class: "muted"}, "no ticks yet"));
  }

  // -- reminders -------------------------------------------------------------------------
  function renderReminders() {
    const field = (label, name, attrs) => h("label", {}, label, h("input", Object.assign({name: name, maxlength: "200"}, attrs || {})));
    const state = h("select", {name: "state"}, ...["any", "active", "paused", "orphaned"].map(s => h("option", {value: s}, s)));
    const form = h("form", {class: "search", id: "search"},
      field("Grain type", "type", {placeholder: "CounterGrain"}), field("Key prefix", "key"),
      field("Name", "name"), field("Priority", "priority", {type: "number", min: "-128", max: "127"}),
      h("label", {}, "State", state), h("button", {type: "submit"}, "Search"));
    const results = h("div", {id: "results"}), detail = h("div", {id: "detail"});
    const more = h("button", {class: "secondary", type: "button", id: "more", style: "display:none"}, "More");
    // ``latest`` numbers the searches: the answer to one superseded by a newer
    // search (the page's first search, then the user's) is dropped, not appended.
    let cursor = null, rows = [], latest = 0;
    const query = () => {
      const q = new URLSearchParams();
      for (const [k, v] of new FormData(form)) if (v !== "") q.set(k, v);
      return q;
    };
    function draw(page, next) {
      // A row that ticked since an earlier page moved on in the due order and
      // may come again: it is shown once, where it was first shown.
      const shown = new Set(next ? rows.map(r => r.grain + "|" + r.name) : []);
      rows = (next ? rows : []).concat(page.rows.filter(r => !shown.has(r.grain + "|" + r.name)));
      cursor = page.cursor;
      more.style.display = cursor ? "" : "none";
      results.replaceChildren(rows.length ? table(["Grain", "Name", "Schedule", "Next due", "Priority", "Action", "Flags"],
        rows.map(r => ({attrs: {class: "clickable", "data-grain": r.grain, "data-name": r.name,
                                onclick: () => openDetail(r.grain, r.name)},
          cells: [r.grain_text, r.name, r.schedule, time(r.next_due), r.priority, r.action,
                  h("span", {}, r.declared ? h("span", {class: "flag"}, "declared") : null,
                    r.paused ? h("span", {class: "flag paused"}, "paused") : null,
                    r.orphaned ? h("span", {class: "flag orphaned"}, "orphaned") : null)]})),
        {id: "rows", num: ["Priority"]}) : h("p", {class: "muted"}, "no rows match"),
        h("p", {class: "muted"}, rows.length + " shown · " + page.scanned + " index entries looked at"));
    }
    async function search(next) {
      const q = query(), mine = ++latest;
      next = next && cursor !== null;
      if (next) q.set("cursor", cursor);
      const r = await fetch("api/reminders?" + q);
      const doc = await r.json();
      if (mine !== latest) return;
      if (!r.ok) { results.replaceChildren(h("p", {class: "error"}, doc.error)); return; }
      draw(doc, next);
    }
    form.addEventListener("submit", e => { e.preventDefault(); search(false); });
    more.addEventListener("click", () => search(true));
    async function act(grain, name, action, value, what) {
      if (!window.confirm(what + "?")) return;
      const r = await fetch("api/action", {method: "POST", headers: {"content-type": "application/json", "x-csrf-token": CSRF},
                                           body: JSON.stringify({grain: grain, name: name, action: action, value: value})});
      const doc = await r.json();
      const msg = document.getElementById("action-result");
      msg.className = r.ok ? "okmsg" : "error";
      msg.textContent = r.ok ? "done: " + action.replace("_", " ") : doc.error;
      if (r.ok && action !== "delete") setTimeout(() => openDetail(grain, name), 300);
    }
    async function openDetail(grain, name) {
      const r = await fetch("api/reminder?" + new URLSearchParams({grain: grain, name: name}));
      const d = await r.json();
      if (!r.ok) { detail.replaceChildren(card("Reminder", h("p", {class: "error"}, d.error))); return; }
      const kv = h("dl", {class: "kv"});
      for (const [k, v] of [["Grain", d.grain_text], ["Name", d.name], ["Schedule", d.schedule],
          ["Expression", d.cron ? d.cron + " " + (d.tz || "UTC") : (d.period_seconds + " s period")],
          ["Next fire times", d.next_slots.map(time).join(" · ") || "none"], ["Last fire", time(d.last_fire)],
          ["Priority", d.priority], ["Missed ticks", d.action], ["Declared", d.declared ? "yes" : "no"],
          ["State", d.paused ? "paused" : "active"], ["Orphaned", d.orphaned ? "yes: no Active silo hosts its type" : "no"],
          ["Labels", Object.entries(d.labels || {}).map(([k, v]) => k + "=" + v).join(", ") || "none"],
          ["Calendar", d.calendar ? d.calendar + " (" + (d.on_excluded || "skip") + ")" : "none"],
          ...(d.counters ? [["Counters", "delivered " + d.counters.delivered + " · failed " + d.counters.failed +
              " · dead-lettered " + d.counters.dead_lettered + " · deduplicated " + d.counters.deduplicated],
            ["Skipped", d.counters.skipped + " (paused " + d.counters.skipped_paused + ", overlap " + d.counters.skipped_overlap +
              ", calendar " + d.counters.skipped_calendar + ", catch-up window " + d.counters.skipped_catchup_window +
              ", late " + d.counters.skipped_late + ")"],
            ["Last error", d.counters.last_error ? d.counters.last_error + " at " + time(d.counters.last_error_at) : "none"]] : [])]) {
        kv.appendChild(h("dt", {}, k)); kv.appendChild(h("dd", {}, v));
      }
      const prio = h("input", {type: "number", min: "-128", max: "127", value: d.priority, id: "new-priority", style: "width:80px"});
      const action = h("select", {id: "new-action"}, ...["fire_immediately", "skip", "notify"].map(a => {
        const o = h("option", {value: a}, a); if (a === d.action) o.selected = true; return o; }));
      const btn = (label, id, fn, cls) => h("button", {type: "button", id: id, class: cls || "", onclick: fn}, label);
      const actions = READ_ONLY ? h("p", {class: "muted"}, "read-only dashboard") : h("div", {class: "actions"},
        d.paused ? btn("Resume", "act-resume", () => act(grain, name, "resume", null, "Resume " + d.name))
                 : btn("Pause", "act-pause", () => act(grain, name, "pause", null, "Pause " + d.name)),
        btn("Trigger now", "act-trigger", () => act(grain, name, "trigger", null, "Deliver one tick of " + d.name + " now")),
        prio, btn("Set priority", "act-priority", () => act(grain, name, "set_priority", Number(prio.value), "Set the priority of " + d.name + " to " + prio.value), "secondary"),
        action, btn("Set action", "act-action", () => act(grain, name, "set_action", action.value, "Set the missed-tick action of " + d.name + " to " + action.value), "secondary"),
        btn("Delete", "act-delete", () => act(grain, name, "delete", null, "Delete " + d.name + " of " + d.grain_text), "danger"),
        h("span", {id: "action-result"}));
      const hist = d.history.map(f => ({cells: [time(f.slot), time(f.at), f.lateness_ms.toFixed(1) + " ms",
        f.outcome + (f.triggered ? " (triggered)" : "") + (f.backfill ? " (backfill)" : ""), f.silo, f.error || ""]}));
      const bf = d.backfill;
      const from = h("input", {id: "backfill-from", placeholder: "2026-12-01T00:00:00Z", maxlength: "64"});
      const to = h("input", {id: "backfill-to", placeholder: "2026-12-02T00:00:00Z", maxlength: "64"});
      const backfill = h("div", {class: "actions", id: "backfill"},
        bf ? h("span", {id: "backfill-progress"}, "backfill " + (bf.delivered + bf.failed) + "/" + bf.total +
               " slots of [" + time(bf.from) + ", " + time(bf.to) + "), next " + time(bf.next) +
               (bf.failed ? ", " + bf.failed + " failed" : ""))
           : h("span", {class: "muted"}, "no backfill running"),
        READ_ONLY ? null : (bf ? btn("Cancel backfill", "act-cancel-backfill", () => act(grain, name, "cancel_backfill", null, "Cancel the backfill of " + d.name), "danger")
                               : h("span", {}, from, to, btn("Backfill", "act-backfill", () => act(grain, name, "backfill", {from: from.value, to: to.value}, "Deliver every slot of " + d.name + " from " + from.value + " to " + to.value + " again"), "secondary"))));
      detail.replaceChildren(card("Reminder " + d.name, kv, actions, h("h2", {}, "Backfill"), backfill,
        h("h2", {}, "Fire history"), hist.length ? table(["Slot", "At", "Lateness", "Outcome", "Silo", "Error"], hist, {id: "history", num: ["Lateness"]})
                                                : h("p", {class: "muted", id: "history-empty"}, "no deliveries recorded"),
        btn("Refresh", "refresh-detail", () => openDetail(grain, name), "secondary")));
    }
    main.replaceChildren(card("Search reminders", form), card("Rows", results, more), detail);
    document.getElementById("live").textContent = "paged from the store";
    const preset = new URLSearchParams(location.search);
    for (const [k, v] of preset) if (form.elements[k]) form.elements[k].value = v;
    search(false);
  }

  // -- audit -----------------------------------------------------------------------------
  function renderAudit() {
    const field = (label, name, attrs) => h("label", {}, label, h("input", Object.assign({name: name, maxlength: "200"}, attrs || {})));
    const form = h("form", {class: "search", id: "audit-search"},
      field("Grain", "grain", {placeholder: "CounterGrain/s:a"}), field("Reminder", "name"),
      field("Principal", "principal", {placeholder: "dashboard:ops"}), field("Action", "action", {placeholder: "pause"}),
      h("button", {type: "submit"}, "Search"));
    const results = h("div", {id: "audit-results"});
    const row = r => ({attrs: {"data-id": r.id, "data-action": r.action, "data-principal": r.principal},
      cells: [time(r.at), r.principal, r.action, dash(r.grain), dash(r.reminder), badge(r.outcome),
              r.detail === null ? "" : JSON.stringify(r.detail), dash(r.via)]});
    async function search() {
      const q = new URLSearchParams();
      for (const [k, v] of new FormData(form)) if (v !== "") q.set(k, v);
      const r = await fetch("api/audit?" + q);
      const doc = await r.json();
      if (!r.ok) { results.replaceChildren(h("p", {class: "error"}, doc.error)); return; }
      results.replaceChildren(doc.records.length
        ? table(["When", "Principal", "Action", "Grain", "Reminder", "Outcome", "Detail", "Via"], doc.records.map(row), {id: "audit"})
        : h("p", {class: "muted"}, "no records match"));
    }
    form.addEventListener("submit", e => { e.preventDefault(); search(); });
    main.replaceChildren(card("Search the audit log", form), card("Management actions, newest first", results));
    document.getElementById("live").textContent = "read from the store";
    search();
  }

  // -- dead letters ----------------------------------------------------------------------
  function renderDeadLetters() {
    const field = (label, name, attrs) => h("label", {}, label, h("input", Object.assign({name: name, maxlength: "1024"}, attrs || {})));
    const form = h("form", {class: "search", id: "letter-search"},
      field("Grain", "grain", {placeholder: "Type/s:key"}), field("Reminder", "name"),
      h("button", {type: "submit"}, "Search"));
    const results = h("div", {id: "letters"}), detail = h("div", {id: "letter-detail"});
    const more = h("button", {class: "secondary", type: "button", id: "more-letters", style: "display:none"}, "More");
    let cursor = null, letters = [], latest = 0;  // latest: as the reminders page's
    function draw(page, next) {
      letters = next ? letters.concat(page.letters) : page.letters;
      cursor = page.cursor;
      more.style.display = cursor ? "" : "none";
      results.replaceChildren(letters.length ? table(["Dead-lettered", "Grain", "Reminder", "Slot", "Attempts", "Error"],
        letters.map(d => ({attrs: {class: "clickable", "data-id": d.id, onclick: () => show(d)},
          cells: [time(d.at), d.grain_text, d.name, time(d.slot), d.attempts, d.error_type + ": " + d.message]})),
        {id: "letter-rows", num: ["Attempts"]}) : h("p", {class: "muted", id: "no-letters"}, "no dead letters"));
    }
    async function search(next) {
      const q = new URLSearchParams();
      for (const [k, v] of new FormData(form)) if (v !== "") q.set(k, v);
      const mine = ++latest;
      next = next && cursor !== null;
      if (next) q.set("cursor", cursor);
      const r = await fetch("api/dead-letters?" + q);
      const doc = await r.json();
      if (mine !== latest) return;
      if (!r.ok) { results.replaceChildren(h("p", {class: "error"}, doc.error)); return; }
      draw(doc, next);
    }
    async function act(d, action) {
      if (!window.confirm((action === "replay" ? "Deliver again " : "Discard ") + d.name + " of " + d.grain_text + " (slot " + d.slot + ")?")) return;
      const r = await fetch("api/action", {method: "POST", headers: {"content-type": "application/json", "x-csrf-token": CSRF},
                                           body: JSON.stringify({action: action, id: d.id})});
      const doc = await r.json();
      const msg = document.getElementById("letter-result");
      msg.className = r.ok ? "okmsg" : "error";
      msg.textContent = r.ok ? "done: " + action : doc.error;
      if (r.ok) setTimeout(() => search(false), 300);
    }
    function show(d) {
      const kv = h("dl", {class: "kv"});
      for (const [k, v] of [["Id (occurrence)", d.id], ["Grain", d.grain_text], ["Reminder", d.name], ["Slot", time(d.slot)],
          ["Attempts", d.attempts], ["Dead-lettered", time(d.at) + " by " + d.silo], ["Error", d.error_type + ": " + d.message]]) {
        kv.appendChild(h("dt", {}, k)); kv.appendChild(h("dd", {}, v));
      }
      const btn = (label, id, fn, cls) => h("button", {type: "button", id: id, class: cls || "", onclick: fn}, label);
      const actions = READ_ONLY ? h("p", {class: "muted"}, "read-only dashboard") : h("div", {class: "actions"},
        btn("Replay", "act-replay", () => act(d, "replay")),
        btn("Discard", "act-discard", () => act(d, "discard"), "danger"),
        h("span", {id: "letter-result"}));
      detail.replaceChildren(card("Dead letter", kv, actions, h("h2", {}, "Traceback"), h("pre", {id: "traceback"}, d.traceback)));
    }
    form.addEventListener("submit", e => { e.preventDefault(); search(false); });
    more.addEventListener("click", () => search(true));
    main.replaceChildren(card("Dead letters", form), card("Ticks that failed their last attempt", results, more), detail);
    document.getElementById("live").textContent = "paged from the store";
    search(false);
  }

  for (const a of document.querySelectorAll("nav a")) if (a.dataset.page === PAGE) a.className = "current";
  if (PAGE === "cluster") live("cluster", renderCluster);
  else if (PAGE === "grains") live("grains", renderGrains);
  else if (PAGE === "timeliness") live("timeliness", renderTimeliness);
  else if (PAGE === "audit") renderAudit();
  else if (PAGE === "dead-letters") renderDeadLetters();
  else renderReminders();
})();
