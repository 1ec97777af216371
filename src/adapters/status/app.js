// The status page's only script: it refreshes the table, an autoscaler's page and the daemon's
// health in place, and
// searches as one types. Without it the page works as plain HTML (the form submits, the
// pager links, a reload refreshes). It loads nothing from anywhere but this daemon.
"use strict";

(function () {
  const TABLE_EVERY_MS = 5000;

  // Fetches `url` (an HTML fragment from this daemon) and puts it into `target`.
  async function swap(target, url) {
    const answer = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (!answer.ok) {
      target.dataset.error = "refresh failed: " + answer.status;
      return false;
    }
    target.innerHTML = await answer.text();
    delete target.dataset.error;
    return true;
  }

  function tablePage(rows) {
    const form = document.getElementById("filter");
    let typing = null;
    let offset = 0;
    const current = () => {
      const params = new URLSearchParams(new FormData(form));
      if (!params.get("state")) params.delete("state");
      if (offset > 0) params.set("offset", String(offset));
      return params;
    };
    const refresh = () => swap(rows, "/ui/table?" + current().toString());
    const search = () => {
      offset = 0;
      const params = current();
      history.replaceState(null, "", "/ui?" + params.toString());
      refresh();
    };
    form.addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(search, 250);
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      search();
    });
    rows.addEventListener("click", (event) => {
      const link = event.target.closest(".pager a");
      if (!link) return;
      event.preventDefault();
      offset = Number(new URL(link.href).searchParams.get("offset") || "0");
      history.replaceState(null, "", link.href);
      refresh();
    });
    const start = new URL(location.href).searchParams.get("offset");
    offset = Number(start || "0");
    setInterval(() => {
      if (!document.hidden) refresh();
    }, TABLE_EVERY_MS);
  }

  // The daemon's health at the top of every page.
  function healthPart(health) {
    setInterval(() => {
      if (!document.hidden) swap(health, health.dataset.fragment);
    }, TABLE_EVERY_MS);
  }

  function detailPage(detail) {
    const every = Math.max(2, Number(detail.dataset.every || "15")) * 1000;
    setInterval(() => {
      if (!document.hidden) swap(detail, detail.dataset.fragment);
    }, every);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const rows = document.getElementById("rows");
    if (rows) tablePage(rows);
    const health = document.getElementById("health");
    if (health) healthPart(health);
    const detail = document.getElementById("detail");
    if (detail) detailPage(detail);
    document.documentElement.classList.add("live");
  });
})();
