// The amfs memory browser. Every value from the server is put in the page as text (textContent, text
// nodes, SVG attributes), never parsed as HTML, so a memory holding markup shows that markup and runs nothing.
// The API key lives in sessionStorage only and travels as an Authorization header, never in a URL or cookie.
"use strict";

(function () {
  const KEY_STORAGE = "amfs-ui-key";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const PAGE = 50;
  let me = null; // whoami answer
  let browsePath = null;

  // -- DOM helpers: strings always become text nodes ------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else if (name === "text") node.textContent = value;
      else node.setAttribute(name, String(value));
    }
  }

  function append(node, children) {
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }

  const main = () => document.getElementById("main");
  const fmt = (x, digits = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
  const when = (iso) => (iso ? new Date(iso).toLocaleString() : "–");
  const json = (value) => JSON.stringify(value, null, 2);

  function showError(message) {
    const box = document.getElementById("error");
    box.textContent = message || "";
    box.hidden = !message;
  }

  // -- API ----------------------------------------------------------------------------------------------

  class Unauthorized extends Error {}

  async function api(path, params, options) {
    const query = new URLSearchParams();
    for (const [name, value] of Object.entries(params || {})) {
      if (value !== null && value !== undefined && value !== "") query.set(name, value);
    }
    const headers = Object.assign({ Accept: "application/json" }, (options && options.headers) || {});
    const key = sessionStorage.getItem(KEY_STORAGE);
    if (key) headers.Authorization = "Bearer " + key;
    const url = "/ui/api/" + path + (query.toString() ? "?" + query.toString() : "");
    const response = await fetch(url, Object.assign({}, options || {}, { headers, credentials: "omit", cache: "no-store" }));
    let body = null;
    try { body = await response.json(); } catch (e) { body = { error: response.statusText }; }
    if (response.status === 401) throw new Unauthorized(body.error);
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }

  // -- log in -------------------------------------------------------------------------------------------

  async function start() {
    document.getElementById("login-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const input = document.getElementById("login-key");
      sessionStorage.setItem(KEY_STORAGE, input.value.trim());
      input.value = "";
      await boot(true);
    });
    document.getElementById("logout").addEventListener("click", () => {
      sessionStorage.removeItem(KEY_STORAGE);
      me = null;
      boot(false);
    });
    window.addEventListener("hashchange", route);
    await boot(false);
  }

  async function boot(afterLogin) {
    showError("");
    try {
      me = await api("whoami");
    } catch (error) {
      if (error instanceof Unauthorized) {
        if (afterLogin) document.getElementById("login-error").textContent = "That key was not accepted.";
        sessionStorage.removeItem(KEY_STORAGE);
        showLogin(true);
        return;
      }
      showError(error.message);
      return;
    }
    document.getElementById("login-error").textContent = "";
    showLogin(false);
    const who = document.getElementById("who");
    who.textContent = !me.keyed ? "no API keys on this server (loopback)"
      : (me.access === "rw" ? "read-write key" : "read-only key") + (me.entity_prefix ? " · limited to " + me.entity_prefix : "");
    document.getElementById("logout").hidden = !me.keyed;
    for (const link of document.querySelectorAll("nav a")) {
      const storeWide = link.dataset.view === "learning" || link.dataset.view === "ml";
      link.hidden = storeWide && !!me.entity_prefix;
    }
    route();
  }

  function showLogin(show) {
    document.getElementById("login").hidden = !show;
    document.getElementById("nav").hidden = show;
    if (show) {
      clear(main());
      document.getElementById("who").textContent = "";
      document.getElementById("logout").hidden = true;
      document.getElementById("login-key").focus();
    }
  }

  // -- routing: #/view?param=... ------------------------------------------------------------------------

  function parseHash() {
    const hash = location.hash.replace(/^#\/?/, "");
    const [view, query] = hash.split("?");
    return { view: view || "browse", params: new URLSearchParams(query || "") };
  }

  function link(view, params, ...children) {
    const query = new URLSearchParams(params || {}).toString();
    return el("a", { href: "#/" + view + (query ? "?" + query : "") }, ...children);
  }

  async function route() {
    if (!me) return;
    const { view, params } = parseHash();
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === view);
    showError("");
    const views = { browse: viewBrowse, entry: viewEntry, search: viewSearch, outcomes: viewOutcomes, learning: viewLearning, ml: viewML };
    const render = views[view] || viewBrowse;
    try {
      await render(params);
    } catch (error) {
      if (error instanceof Unauthorized) { sessionStorage.removeItem(KEY_STORAGE); me = null; showLogin(true); return; }
      showError(error.message);
    }
  }

  // -- browse: tree with counts, and the entries at the selected path -------------------------------------

  async function viewBrowse(params) {
    browsePath = params.get("path") || me.entity_prefix || null;
    const treeBox = el("div", { class: "panel", id: "tree" }, el("h2", { text: "Entities" }));
    const listBox = el("div", { class: "panel", id: "entries" });
    clear(main()).appendChild(el("div", { class: "columns", "data-view": "browse" }, treeBox, listBox));
    const root = await api("tree", { path: me.entity_prefix });
    treeBox.appendChild(el("p", { class: "muted", id: "tree-total" }, root.total + " entries in " + (me.entity_prefix || "the store")));
    const list = el("ul", { class: "tree root" });
    if (me.entity_prefix) {
      list.appendChild(treeNode({ path: root.path, name: root.path, total: root.total, here: root.here, has_children: root.num_children > 0 }, true));
    } else {
      renderChildren(list, root);
    }
    treeBox.appendChild(list);
    performance.mark("amfs-tree-shown"); // read by the page-load benchmark (server/ui/bench.py)
    if (browsePath) await showEntries(listBox, browsePath, Number(params.get("offset") || 0));
    else listBox.appendChild(el("p", { class: "muted" }, "Pick an entity on the left to list its entries."));
  }

  function renderChildren(list, answer) {
    for (const child of answer.children) list.appendChild(treeNode(child, false));
    if (answer.num_children > answer.children.length + answer.offset) {
      list.appendChild(el("li", { class: "muted" }, (answer.num_children - answer.children.length) + " more…"));
    }
  }

  function treeNode(node, open) {
    const item = el("li", { "data-path": node.path });
    const sub = el("ul", { class: "tree" });
    let loaded = false;
    const toggle = el("button", { type: "button", class: "toggle", "aria-label": "expand " + node.path, text: node.has_children ? "▸" : "" });
    const expand = async () => {
      if (!node.has_children) return;
      const opening = !sub.hasChildNodes() || sub.hidden;
      if (opening && !loaded) {
        loaded = true;
        renderChildren(sub, await api("tree", { path: node.path }));
      }
      sub.hidden = !opening;
      toggle.textContent = opening ? "▾" : "▸";
    };
    toggle.addEventListener("click", () => expand().catch((e) => showError(e.message)));
    const name = link("browse", { path: node.path }, node.name);
    if (node.path === browsePath) name.classList.add("selected");
    item.append(toggle, name, el("span", { class: "count", title: node.here + " here" }, String(node.total)));
    item.appendChild(sub);
    if (open || (browsePath && (browsePath === node.path || browsePath.startsWith(node.path + "/")))) expand().catch((e) => showError(e.message));
    return item;
  }

  async function showEntries(box, path, offset) {
    const page = await api("entries", { path, offset, limit: PAGE });
    box.appendChild(el("h2", {}, path));
    box.appendChild(el("p", { class: "muted" }, page.total + " entries at this path"));
    const rows = page.entries.map((e) => el("tr", { "data-entry": e.entry_key },
      el("td", {}, link("entry", { path: e.entity_path, key: e.key }, e.key)),
      el("td", {}, e.preview),
      el("td", { class: "num" }, fmt(e.effective_confidence)),
      el("td", {}, e.tier),
      el("td", { class: "num" }, "v" + e.version),
      el("td", {}, when(e.written_at))));
    box.appendChild(el("table", {}, el("thead", {}, el("tr", {}, ["key", "value", "confidence", "tier", "version", "written"].map((h) => el("th", { text: h })))), el("tbody", {}, rows)));
    box.appendChild(pager(page.total, offset, PAGE, (next) => "#/browse?" + new URLSearchParams({ path, offset: next })));
  }

  function pager(total, offset, size, href) {
    const box = el("div", { class: "pager" });
    if (offset > 0) box.appendChild(el("a", { href: href(Math.max(0, offset - size)), class: "prev" }, "← previous"));
    box.appendChild(el("span", { class: "muted" }, total ? (offset + 1) + "–" + Math.min(total, offset + size) + " of " + total : "none"));
    if (offset + size < total) box.appendChild(el("a", { href: href(offset + size), class: "next" }, "next →"));
    return box;
  }

  // -- one entry: value, versions + diff, provenance, confidence chart, forget -----------------------------

  async function viewEntry(params) {
    const path = params.get("path"), key = params.get("key");
    const data = await api("entry", { path, key });
    const e = data.entry;
    const box = clear(main());
    const facts = el("dl", { class: "facts" });
    const fact = (name, value) => facts.append(el("dt", { text: name }), el("dd", { "data-fact": name }, value));
    fact("version", "v" + e.version + " of " + (data.versions.length + (data.older_versions || 0)));
    fact("stored confidence", fmt(e.confidence));
    fact("effective confidence", fmt(e.effective_confidence) + (data.decay_half_life_days ? " (decay half-life " + data.decay_half_life_days + " days)" : " (no decay configured)"));
    fact("tier", e.tier_name + " (priority " + fmt(e.priority_score) + ")");
    fact("memory type", e.memory_type);
    fact("provenance", e.provenance_tier + " · agent " + e.provenance.agent_id + " · session " + e.provenance.session_id);
    fact("written", when(e.provenance.written_at));
    fact("outcomes / recalls", e.outcome_count + " / " + e.recall_count);
    if (e.ttl_at) fact("expires", when(e.ttl_at));
    if (e.importance_score !== null) fact("importance", fmt(e.importance_score));

    const head = el("div", { class: "panel" },
      el("p", {}, link("browse", { path: e.entity_path }, "← " + e.entity_path)),
      el("h2", { id: "entry-title" }, e.entry_key),
      el("h3", { text: "Current value" }), el("pre", { id: "entry-value" }, json(e.value)), facts);
    if (me.can_forget) head.appendChild(forgetControls(e));
    box.appendChild(head);

    const chartPanel = el("div", { class: "panel", id: "chart-panel" }, el("h3", { text: "Confidence over time" }));
    const detail = el("div", { id: "point-detail", class: "muted" }, "Open a point to see its outcome.");
    chartPanel.append(confidenceChart(data, detail), detail);
    box.appendChild(chartPanel);

    const outcomesPanel = el("div", { class: "panel" }, el("h3", { text: "Outcomes on this entry" }), outcomeTable(data.outcomes));
    if (data.older_outcomes) outcomesPanel.appendChild(el("p", { class: "muted", id: "older-outcomes" }, "The newest " + data.outcomes.length + " are shown; " + data.older_outcomes + " older ones are not."));
    box.appendChild(outcomesPanel);
    box.appendChild(versionsPanel(e, data.versions, data.older_versions || 0));
  }

  function confidenceChart(data, detail) {
    // Points: each version as written (its confidence before any outcome changed it), each outcome's result,
    // and now (effective confidence, after decay).
    const firstBefore = {};
    for (const o of data.outcomes) if (!(o.version_updated in firstBefore)) firstBefore[o.version_updated] = o.confidence_before;
    const points = [];
    for (const v of data.versions.slice().reverse()) {
      const c = v.version in firstBefore ? firstBefore[v.version] : v.confidence;
      points.push({ t: Date.parse(v.provenance.written_at), c, kind: "write", label: "v" + v.version + " written", data: v });
    }
    for (const o of data.outcomes) points.push({ t: Date.parse(o.committed_at), c: o.confidence_after, kind: o.outcome_type, label: o.outcome_ref, data: o });
    points.sort((a, b) => a.t - b.t);
    const now = { t: Date.parse(data.now), c: data.entry.effective_confidence, kind: "now", label: "now (effective)", data: null };

    // Events are spaced evenly in time order (agents often act in bursts, which a linear time axis would
    // pile onto one spot); the axis labels give the first and last dates.
    const W = 720, H = 260, L = 44, R = 16, T = 14, B = 34;
    const all = [...points, now];
    const x = (i) => L + (all.length > 1 ? i / (all.length - 1) : 0.5) * (W - L - R);
    // Outcome multipliers may lift confidence above 1, so the scale grows to the highest point.
    const top = Math.max(1, Math.ceil(Math.max(...all.map((p) => p.c)) * 4) / 4);
    const y = (c) => T + (1 - Math.max(0, Math.min(top, c)) / top) * (H - T - B);
    const chart = svg("svg", { class: "chart", id: "confidence-chart", viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "confidence over time" });
    for (const c of [0, 0.25, 0.5, 0.75, 1].map((f) => f * top)) {
      chart.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(c), y2: y(c) }), svg("text", { x: 6, y: y(c) + 4 }, c.toFixed(2)));
    }
    chart.append(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }), svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
    chart.append(svg("text", { x: L, y: H - 10 }, new Date(all[0].t).toLocaleString()), svg("text", { x: W - R, y: H - 10, "text-anchor": "end" }, "now"));
    if (points.length) {
      chart.appendChild(svg("polyline", { class: "line", points: points.map((p, i) => x(i) + "," + y(p.c)).join(" ") }));
      const last = points.length - 1;
      chart.appendChild(svg("polyline", { class: "decay", points: x(last) + "," + y(points[last].c) + " " + x(last + 1) + "," + y(now.c) }));
    }
    let selected = null;
    all.forEach((p, i) => {
      const dot = svg("circle", { class: p.kind + " point", cx: x(i), cy: y(p.c), r: p.kind === "write" ? 5 : 6, tabindex: 0, "data-kind": p.kind, "data-label": p.label },
        svg("title", {}, p.label + ": " + fmt(p.c)));
      const open = () => {
        if (selected) selected.classList.remove("selected");
        selected = dot;
        dot.classList.add("selected");
        clear(detail).classList.remove("muted");
        detail.appendChild(pointDetail(p));
      };
      dot.addEventListener("click", open);
      dot.addEventListener("keydown", (event) => { if (event.key === "Enter") open(); });
      chart.appendChild(dot);
    });
    return chart;
  }

  function pointDetail(p) {
    if (p.kind === "now") return el("p", {}, "Now: effective confidence " + fmt(p.c) + " (stored confidence decayed by age).");
    if (p.kind === "write") return el("p", {}, "Version " + p.data.version + " written " + when(p.data.provenance.written_at) + " by " + p.data.provenance.agent_id + " at confidence " + fmt(p.c) + ".");
    const o = p.data;
    return el("div", { id: "outcome-detail" },
      el("p", {}, el("span", { class: "badge " + o.outcome_type }, o.outcome_type), " ", el("strong", {}, o.outcome_ref), " · " + when(o.committed_at) + " · agent " + o.agent_id),
      el("p", {}, "confidence " + fmt(o.confidence_before) + " → " + fmt(o.confidence_after) + " (×" + fmt(o.multiplier, 2) + "), version read " + (o.version_read === null ? "–" : "v" + o.version_read) + ", updated v" + o.version_updated));
  }

  function outcomeTable(outcomes) {
    if (!outcomes.length) return el("p", { class: "muted" }, "No outcome has touched this entry yet.");
    return el("table", { id: "entry-outcomes" },
      el("thead", {}, el("tr", {}, ["ref", "type", "when", "confidence", "Δ"].map((h) => el("th", { text: h })))),
      el("tbody", {}, outcomes.map((o) => el("tr", {},
        el("td", {}, o.outcome_ref), el("td", {}, el("span", { class: "badge " + o.outcome_type }, o.outcome_type)), el("td", {}, when(o.committed_at)),
        el("td", { class: "num" }, fmt(o.confidence_before) + " → " + fmt(o.confidence_after)), delta(o.confidence_after - o.confidence_before)))));
  }

  function delta(d) {
    return el("td", { class: "num " + (d >= 0 ? "delta-up" : "delta-down") }, (d >= 0 ? "+" : "") + d.toFixed(3));
  }

  function versionsPanel(e, versions, older) {
    const panel = el("div", { class: "panel", id: "versions" }, el("h3", { text: "Versions" }));
    if (older) panel.appendChild(el("p", { class: "note" }, "The newest " + versions.length + " versions; " + older + " older ones are not shown (amfs_history pages to them)."));
    const table = el("table", {}, el("thead", {}, el("tr", {}, ["version", "written", "by", "confidence", "value"].map((h) => el("th", { text: h })))),
      el("tbody", {}, versions.map((v) => el("tr", { "data-version": v.version },
        el("td", {}, "v" + v.version), el("td", {}, when(v.provenance.written_at)), el("td", {}, v.provenance.agent_id),
        el("td", { class: "num" }, fmt(v.confidence)), el("td", {}, el("pre", {}, v.value_truncated ? v.value : json(v.value)))))));
    panel.appendChild(table);
    if (versions.length > 1) {
      const numbers = versions.map((v) => v.version);
      const from = el("select", { id: "diff-from" }, numbers.map((n) => el("option", { value: n }, "v" + n)));
      const to = el("select", { id: "diff-to" }, numbers.map((n) => el("option", { value: n }, "v" + n)));
      from.value = String(numbers[1]);
      to.value = String(numbers[0]);
      const out = el("div", { class: "diff", id: "diff" });
      const show = async () => {
        const d = await api("diff", { path: e.entity_path, key: e.key, from: from.value, to: to.value });
        clear(out).append(...d.lines.map((line) => el("div", { class: line.op }, (line.op === "add" ? "+ " : line.op === "remove" ? "- " : "  ") + line.text)));
        if (d.coarse) out.prepend(el("p", { class: "note", id: "diff-coarse" }, "Too many changed lines to match them one by one: between the lines both versions share at the start and the end, the old lines are shown removed and the new ones added."));
      };
      from.addEventListener("change", () => show().catch((err) => showError(err.message)));
      to.addEventListener("change", () => show().catch((err) => showError(err.message)));
      panel.append(el("h3", { text: "Diff" }), el("p", {}, "from ", from, " to ", to), out);
      show().catch((err) => showError(err.message));
    }
    return panel;
  }

  function forgetControls(e) {
    const box = el("div", { id: "forget" });
    const ask = el("button", { type: "button", id: "forget-button", text: "Forget this entry…" });
    ask.addEventListener("click", () => {
      ask.hidden = true;
      const yes = el("button", { type: "button", class: "danger", id: "forget-confirm" }, "Yes, forget every version of " + e.entry_key);
      const no = el("button", { type: "button", id: "forget-cancel", text: "Cancel" });
      const confirm = el("div", { class: "confirm" }, el("p", {}, "This deletes all versions of this entry for every agent. It cannot be undone."), yes, " ", no);
      no.addEventListener("click", () => { confirm.remove(); ask.hidden = false; });
      yes.addEventListener("click", async () => {
        try {
          const result = await api("forget", {}, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ entity_path: e.entity_path, key: e.key }) });
          clear(box).appendChild(el("p", { class: "good", id: "forget-done" }, "Forgot " + result.forgotten + " (" + result.versions_removed + " versions)."));
        } catch (err) { showError(err.message); }
      });
      box.appendChild(confirm);
    });
    box.appendChild(ask);
    return box;
  }

  // -- search: the retrieval agents get, with each strategy's rank and contribution ------------------------

  async function viewSearch(params) {
    const q = params.get("q") || "";
    const input = el("input", { id: "search-input", type: "search", placeholder: "What are you looking for?", value: q });
    const form = el("form", { class: "searchbar", id: "search-form" }, input, el("button", { type: "submit", id: "search-submit", text: "Search" }));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      location.hash = "#/search?" + new URLSearchParams({ q: input.value });
    });
    const panel = el("div", { class: "panel", id: "search-results" });
    clear(main()).append(form, panel);
    if (!q.trim()) { panel.appendChild(el("p", { class: "muted" }, "Runs amfs_retrieve with explain: each strategy's rank and share of the fused score. Searching here does not count as a read.")); return; }
    const data = await api("search", { q, path: me.entity_prefix });
    const strategies = Object.keys(data.weights).filter((s) => data.weights[s] > 0);
    panel.appendChild(el("p", { class: "muted" }, "Weights: " + strategies.map((s) => s + " " + fmt(data.weights[s], 2)).join(", ")));
    if (!data.results.length) { panel.appendChild(el("p", {}, "Nothing found.")); return; }
    panel.appendChild(el("table", {},
      el("thead", {}, el("tr", {}, el("th", { text: "#" }), el("th", { text: "entry" }), el("th", { text: "value" }), el("th", { class: "num", text: "score" }),
        strategies.map((s) => el("th", { class: "num", title: "rank · contribution" }, s)))),
      el("tbody", {}, data.results.map((r) => el("tr", { "data-entry": r.entry.entry_key },
        el("td", {}, String(r.rank)), el("td", {}, link("entry", { path: r.entry.entity_path, key: r.entry.key }, r.entry.entry_key)),
        el("td", {}, r.entry.preview), el("td", { class: "num" }, fmt(r.score, 4)),
        strategies.map((s) => {
          const hit = r.strategies[s];
          return el("td", { class: "num", "data-strategy": s }, hit ? "#" + hit.rank + " · " + fmt(hit.contribution, 4) : "–");
        }))))));
  }

  // -- outcomes ------------------------------------------------------------------------------------------

  async function viewOutcomes(params) {
    const offset = Number(params.get("offset") || 0);
    const data = await api("outcomes", { offset, limit: PAGE });
    const panel = el("div", { class: "panel", id: "outcomes" }, el("h2", { text: "Outcomes" }));
    if (!data.total) panel.appendChild(el("p", { class: "muted" }, "No outcomes recorded yet."));
    else panel.appendChild(el("table", {},
      el("thead", {}, el("tr", {}, ["ref", "type", "when", "agent", "entries touched (confidence change)"].map((h) => el("th", { text: h })))),
      el("tbody", {}, data.outcomes.map((o) => el("tr", { "data-outcome": o.outcome_ref },
        el("td", {}, o.outcome_ref), el("td", {}, el("span", { class: "badge " + o.outcome_type }, o.outcome_type)),
        el("td", {}, when(o.committed_at)), el("td", {}, o.agent_id),
        el("td", {}, o.effects.map((f) => {
          const d = f.confidence_after - f.confidence_before;
          return el("div", {}, link("entry", { path: f.entity_path, key: f.key }, f.entry_key), " ",
            el("span", { class: d >= 0 ? "delta-up" : "delta-down" }, fmt(f.confidence_before) + " → " + fmt(f.confidence_after) + " (" + (d >= 0 ? "+" : "") + d.toFixed(3) + ")"));
        })))))));
    panel.appendChild(pager(data.total, offset, PAGE, (next) => "#/outcomes?offset=" + next));
    clear(main()).appendChild(panel);
  }

  // -- learning --------------------------------------------------------------------------------------------

  async function viewLearning() {
    const data = await api("learning");
    const box = clear(main());
    if (!data.enabled) { box.appendChild(el("div", { class: "panel" }, el("p", {}, "Learning is off on this server."))); return; }
    const t = data.thresholds;
    box.appendChild(el("p", { class: "muted" }, "Action levels: suggest ≥ " + t.suggest + ", confirm ≥ " + t.confirm + ", auto_apply ≥ " + t.auto_apply));
    box.appendChild(el("div", { class: "panel", id: "preferences" }, el("h2", { text: "Preferences" }),
      !data.preferences.length ? el("p", { class: "muted" }, "None learned yet.") : el("table", {},
        el("thead", {}, el("tr", {}, ["user", "preference", "value", "confidence", "support", "action", "source", "updated"].map((h) => el("th", { text: h })))),
        el("tbody", {}, data.preferences.map((p) => el("tr", {},
          el("td", {}, p.user_id), el("td", {}, p.category + "." + p.key), el("td", {}, el("pre", {}, json(p.value))),
          el("td", { class: "num" }, fmt(p.confidence)), el("td", { class: "num" }, String(p.support)),
          el("td", {}, el("span", { class: "badge" }, p.action)), el("td", {}, p.source), el("td", {}, when(p.updated_at))))))));
    box.appendChild(el("div", { class: "panel", id: "patterns" }, el("h2", { text: "Patterns" }),
      !data.patterns.length ? el("p", { class: "muted" }, "None detected yet.") : el("table", {},
        el("thead", {}, el("tr", {}, ["user", "type", "pattern", "occurrences", "frequency", "confidence", "action"].map((h) => el("th", { text: h })))),
        el("tbody", {}, data.patterns.map((p) => el("tr", {},
          el("td", {}, p.user_id), el("td", {}, p.pattern_type), el("td", {}, p.description),
          el("td", { class: "num" }, String(p.occurrences)), el("td", { class: "num" }, fmt(p.frequency)),
          el("td", { class: "num" }, fmt(p.confidence)), el("td", {}, el("span", { class: "badge" }, p.action))))))));
  }

  // -- ML ------------------------------------------------------------------------------------------------

  function bar(fraction) {
    const b = el("span", { class: "bar" });
    b.style.width = Math.round(Math.max(0, Math.min(1, fraction)) * 160) + "px";
    return b;
  }

  async function viewML() {
    const data = await api("ml");
    const box = clear(main());
    const weights = el("table", {}, el("tbody", {}, Object.entries(data.retrieval_weights).map(([s, w]) => el("tr", {}, el("td", {}, s), el("td", { class: "num" }, fmt(w, 2)), el("td", {}, bar(w))))));
    box.appendChild(el("div", { class: "panel", id: "ml-applied" }, el("h2", { text: "What is applied" }),
      el("p", {}, "Learned ranking strategy: ", el("strong", { class: data.learned_strategy_on ? "good" : "muted" }, data.learned_strategy_on ? "on" : "off (no trained model)")),
      el("p", {}, "Outcome multipliers: ", el("strong", {}, data.calibration_applied ? "calibrated (applied)" : "configured defaults")),
      el("table", {}, el("thead", {}, el("tr", {}, ["outcome type", "in force", "configured"].map((h) => el("th", { text: h })))),
        el("tbody", {}, Object.keys(data.configured_multipliers).map((t) => el("tr", {}, el("td", {}, t), el("td", { class: "num" }, fmt(data.multipliers_in_force[t], 3)), el("td", { class: "num" }, fmt(data.configured_multipliers[t], 3)))))),
      el("h3", { text: "Retrieval weights" }), weights));
    const ranker = el("div", { class: "panel", id: "ml-ranker" }, el("h2", { text: "Ranker" }));
    if (!data.ranker_models.length) ranker.appendChild(el("p", { class: "muted" }, "No ranker trained yet (amfs_retrain needs 20+ outcome-linked reads)."));
    for (const m of data.ranker_models) {
      const importances = Object.entries(m.feature_importances).sort((a, b) => b[1] - a[1]);
      const top = importances.length ? importances[0][1] || 1 : 1;
      ranker.append(el("h3", {}, m.entity_path ? "Model for " + m.entity_path : "Global model"),
        el("p", {}, "trained " + when(m.trained_at) + " on " + m.num_samples + " samples (" + m.num_positive + " positive, " + m.num_negative + " negative)"),
        el("p", {}, "held-out accuracy " + fmt(m.accuracy) + " vs baseline " + fmt(m.holdout_baseline_accuracy) + ", AUC " + fmt(m.holdout_auc) + " on " + m.num_holdout + " samples"),
        el("table", { class: "importances" }, el("tbody", {}, importances.map(([f, v]) => el("tr", {}, el("td", {}, f), el("td", { class: "num" }, fmt(v, 1)), el("td", {}, bar(v / top)))))));
    }
    box.appendChild(ranker);
    const calibration = el("div", { class: "panel", id: "ml-calibration" }, el("h2", { text: "Calibration report" }));
    const run = el("button", { type: "button", id: "calibration-run", text: "Compute report (applies nothing)" });
    const out = el("div", {});
    run.addEventListener("click", async () => {
      clear(out).appendChild(el("p", { class: "muted" }, "computing…"));
      try { renderCalibration(clear(out), await api("ml/calibration")); } catch (err) { clear(out).appendChild(el("p", { class: "bad" }, err.message)); }
    });
    calibration.append(run, out);
    box.appendChild(calibration);
  }

  function renderCalibration(out, report) {
    out.appendChild(el("p", {}, report.total_outcomes + " outcomes over " + report.total_entries + " entries; suggested decay half-life " + fmt(report.global_multipliers.decay_half_life_days, 1) + " days"));
    const sets = [report.global_multipliers, ...report.entity_multipliers];
    out.appendChild(el("table", {}, el("thead", {}, el("tr", {}, ["scope", "type", "outcomes", "later incident rate", "multiplier", "calibrated", "note"].map((h) => el("th", { text: h })))),
      el("tbody", {}, sets.flatMap((set) => Object.values(set.signals).map((s) => el("tr", {},
        el("td", {}, set.entity_path || "global"), el("td", {}, s.outcome_type), el("td", { class: "num" }, String(s.num_outcomes)),
        el("td", { class: "num" }, fmt(s.later_incident_rate)), el("td", { class: "num" }, fmt(s.multiplier)), el("td", {}, s.calibrated ? "yes" : "no"), el("td", {}, s.note || "")))))));
  }

  document.addEventListener("DOMContentLoaded", () => { start().catch((e) => showError(e.message)); });
})();
