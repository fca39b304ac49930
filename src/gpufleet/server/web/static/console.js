// gpufleet console: the little JavaScript the pages use. Every page works without it;
// this adds confirmation dialogs, live updates and keyboard moves in the health grid.
"use strict";

(function () {
  const POLL_MS = 2000;
  const POLL_MAX_MS = 15000;
  const MAX_EVENTS = 300;

  // -- confirmation dialogs ---------------------------------------------------------
  function setupConfirm() {
    const dialog = document.getElementById("confirm");
    if (!dialog || typeof dialog.showModal !== "function") return; // the link's page asks instead
    const form = dialog.querySelector("[data-confirm-form]");
    const title = dialog.querySelector("#confirm-title");
    const body = dialog.querySelector("#confirm-body");
    const fields = dialog.querySelector("[data-confirm-fields]");
    const reasonBox = dialog.querySelector("[data-confirm-reason]");
    const reason = dialog.querySelector("#confirm-reason");
    const reasonLabel = reasonBox.querySelector("label");
    const submit = dialog.querySelector("[data-confirm-submit]");
    let opener = null;

    document.addEventListener("click", (event) => {
      const link = event.target.closest("[data-confirm]");
      if (!link || event.metaKey || event.ctrlKey || event.shiftKey) return;
      event.preventDefault();
      opener = link;
      form.action = link.dataset.action;
      title.textContent = link.dataset.title;
      body.textContent = link.dataset.body;
      fields.replaceChildren();
      const extra = JSON.parse(link.dataset.fields || "{}");
      for (const [name, value] of Object.entries(extra)) {
        const input = document.createElement("input");
        input.type = "hidden";
        input.name = name;
        input.value = value;
        fields.appendChild(input);
      }
      const mode = link.dataset.reason; // "required", "optional" or ""
      reasonBox.hidden = !mode;
      reason.disabled = !mode;
      reason.required = mode === "required";
      reason.value = "";
      reasonLabel.textContent = (link.dataset.reasonLabel || "Reason") + (mode === "optional" ? " (optional)" : "");
      submit.textContent = link.dataset.submit || "Confirm";
      submit.className = "btn " + (link.dataset.danger ? "btn-danger" : "btn-primary");
      submit.disabled = false;
      dialog.showModal();
      (mode ? reason : submit).focus();
    });
    dialog.querySelector("[data-confirm-cancel]").addEventListener("click", () => dialog.close());
    dialog.addEventListener("close", () => { if (opener) opener.focus(); });
  }

  // -- forms: a visible "working" state, and no double submits ------------------------
  function setupForms() {
    document.addEventListener("submit", (event) => {
      const form = event.target;
      if (form.method.toLowerCase() !== "post") return;
      if (form.dataset.sent) { event.preventDefault(); return; }
      form.dataset.sent = "1";
      form.setAttribute("aria-busy", "true");
      for (const button of form.querySelectorAll("button[type=submit]")) {
        button.disabled = true;
        button.dataset.label = button.textContent;
        button.textContent = "Working…";
      }
    });
    // Coming back through the history cache must not leave forms stuck as "working".
    window.addEventListener("pageshow", () => {
      for (const form of document.querySelectorAll("form[data-sent]")) {
        delete form.dataset.sent;
        form.removeAttribute("aria-busy");
        for (const button of form.querySelectorAll("button[type=submit]")) {
          button.disabled = false;
          if (button.dataset.label) button.textContent = button.dataset.label;
        }
      }
    });
  }

  // -- the health grid: keyboard moves, cell click-through ----------------------------
  function nodesOf(grid) { return Array.from(grid.children); }

  function setupGrid(grid) {
    let current = 0;
    const rove = () => {
      const nodes = nodesOf(grid);
      nodes.forEach((n, i) => { n.tabIndex = i === current ? 0 : -1; });
    };
    grid.rove = (index) => { current = Math.max(0, Math.min(index, grid.children.length - 1)); rove(); };
    rove();
    grid.addEventListener("focusin", (event) => {
      const node = event.target.closest(".n");
      if (node) { current = nodesOf(grid).indexOf(node); rove(); }
    });
    grid.addEventListener("keydown", (event) => {
      const nodes = nodesOf(grid);
      if (!nodes.length) return;
      let next = current;
      const here = nodes[current].getBoundingClientRect();
      const sameColumn = (dir) => {
        // The node in the next row up/down whose centre is closest to this one's.
        let best = -1, bestDist = Infinity;
        for (let i = current + dir; i >= 0 && i < nodes.length; i += dir) {
          const r = nodes[i].getBoundingClientRect();
          if (Math.abs(r.top - here.top) < 2) continue;
          if (best >= 0 && Math.abs(r.top - nodes[best].getBoundingClientRect().top) > 2) break;
          const d = Math.abs(r.left - here.left);
          if (d < bestDist) { best = i; bestDist = d; }
        }
        return best < 0 ? current : best;
      };
      switch (event.key) {
        case "ArrowRight": next = current + 1; break;
        case "ArrowLeft": next = current - 1; break;
        case "ArrowDown": next = sameColumn(1); break;
        case "ArrowUp": next = sameColumn(-1); break;
        case "Home": next = 0; break;
        case "End": next = nodes.length - 1; break;
        default: return;
      }
      event.preventDefault();
      grid.rove(next);
      nodes[current].focus();
    });
    grid.addEventListener("click", (event) => {
      const cell = event.target.closest("i");
      const node = event.target.closest(".n");
      if (!cell || !node) return;
      const index = Array.from(node.querySelectorAll("i")).indexOf(cell);
      if (index >= 0) { event.preventDefault(); window.location.href = node.href + "#gpu-" + index; }
    });
  }

  function applyChanges(grid, changes) {
    const nodes = grid.children;
    for (const [index, cls, cells, label] of changes) {
      const node = nodes[index];
      if (!node) continue;
      const tab = node.tabIndex;
      node.className = cls;
      node.setAttribute("aria-label", label);
      node.title = label;
      node.tabIndex = tab;
      const is = node.querySelectorAll("i");
      for (let j = 0; j < cells.length && j < is.length; j++) is[j].className = cells[j];
    }
  }

  // -- live updates by polling ---------------------------------------------------------
  function setupLive() {
    const panel = document.querySelector("[data-live-url]");
    if (!panel) return;
    const grid = document.querySelector("[data-grid]");
    const events = document.querySelector("[data-events]");
    if (!grid && !events && !document.querySelector("[data-refresh]")) return;
    const status = document.querySelector("[data-live-status]");
    const statusText = status && status.querySelector("[data-live-text]");
    if (status) status.hidden = false;
    let delay = POLL_MS;
    let timer = null;
    let stopped = false;

    const say = (text, cls) => {
      if (!status) return;
      status.className = "live " + (cls || "");
      if (statusText.textContent !== text) statusText.textContent = text;
    };

    const url = () => {
      const params = new URLSearchParams(events ? events.dataset.liveQuery || "" : "");
      if (grid) params.set("grid", grid.dataset.etag);
      if (events) params.set("after", events.dataset.after);
      return panel.dataset.liveUrl + "?" + params.toString();
    };

    const apply = (data) => {
      if (grid && data.etag) {
        if (data.grid_html !== undefined) {
          grid.innerHTML = data.grid_html;
          grid.rove(0);
        } else if (data.changes) {
          applyChanges(grid, data.changes);
        }
        grid.dataset.etag = data.etag;
        for (const [h, n] of Object.entries(data.cells || {})) {
          const el = document.querySelector(`[data-count-cells="${h}"]`);
          if (el) el.textContent = n.toLocaleString();
        }
        const unhealthy = document.querySelector('[data-count-nodes="unhealthy"]');
        if (unhealthy && data.nodes) unhealthy.textContent = data.nodes.unhealthy;
        const attention = document.querySelector("[data-attention]");
        if (attention && data.attention_html !== undefined) attention.innerHTML = data.attention_html;
      }
      if (events && data.events && data.events.length) {
        const tpl = document.createElement("template");
        for (const html of data.events) {
          tpl.innerHTML = html.trim();
          const li = tpl.content.firstElementChild;
          li.classList.add("fresh");
          events.prepend(li);
        }
        while (events.children.length > MAX_EVENTS) events.lastElementChild.remove();
        for (const empty of document.querySelectorAll("[data-events-empty]")) empty.remove();
        events.dataset.after = data.last_event;
      }
      if (data.versions) {
        const changed = [];
        for (const [key, version] of Object.entries(data.versions)) {
          if (key in versions && versions[key] !== version) changed.push(key);
        }
        // Remember a version only once the page shows it (a refresh can wait a poll).
        refreshParts(changed).then((done) => {
          for (const [key, version] of Object.entries(data.versions)) {
            if (!(key in versions) || done) versions[key] = version;
          }
        });
      }
      const badge = document.querySelector("[data-pending-repairs]");
      if (typeof data.pending_repairs === "number") {
        if (badge) {
          badge.textContent = data.pending_repairs;
          badge.hidden = data.pending_repairs === 0;
          badge.setAttribute("aria-label", data.pending_repairs + " waiting for approval");
        }
      }
    };

    const versions = JSON.parse(panel.dataset.versions || "{}"); // what the page shows
    // Parts of the page marked data-refresh="<key>" are fetched again (the whole page,
    // parsed, those parts swapped in) when the server says their data changed.
    const refreshParts = async (keys) => {
      const parts = Array.from(document.querySelectorAll("[data-refresh]"))
        .filter((el) => keys.includes(el.dataset.refresh));
      if (!parts.length) return true;
      if (document.querySelector("dialog[open]")) return false; // never under an open dialog
      try {
        const response = await fetch(window.location.href, { credentials: "same-origin" });
        if (!response.ok) return false;
        const doc = new DOMParser().parseFromString(await response.text(), "text/html");
        for (const el of parts) {
          const fresh = el.id && doc.getElementById(el.id);
          if (fresh) el.innerHTML = fresh.innerHTML;
        }
        return true;
      } catch (err) {
        return false;
      }
    };

    const poll = async () => {
      timer = null;
      if (stopped) return;
      if (document.hidden) { schedule(); return; }
      if (status) status.classList.add("busy");
      try {
        const response = await fetch(url(), { headers: { Accept: "application/json" }, credentials: "same-origin" });
        if (response.status === 401) {
          stopped = true;
          say("Session ended: reload to log in again", "down");
          return;
        }
        if (!response.ok) throw new Error("HTTP " + response.status);
        apply(await response.json());
        delay = POLL_MS;
        say("Live · updated " + new Date().toLocaleTimeString(), "");
      } catch (err) {
        delay = Math.min(delay * 2, POLL_MAX_MS);
        say("Connection lost; retrying in " + Math.round(delay / 1000) + " s", "down");
      }
      schedule();
    };
    const schedule = () => { if (!stopped && timer === null) timer = setTimeout(poll, delay); };
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && timer !== null) { clearTimeout(timer); timer = null; poll(); }
    });
    schedule();
  }

  document.addEventListener("DOMContentLoaded", () => {
    setupConfirm();
    setupForms();
    const grid = document.querySelector("[data-grid]");
    if (grid) setupGrid(grid);
    setupLive();
  });
})();
