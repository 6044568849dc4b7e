// The dashboard's only script: keeps the page's main part fresh, and sends an
// operator's actions to the JSON API with the session's CSRF token. Every value it
// shows comes from the server already escaped (Jinja2); it never builds HTML itself.
"use strict";

const csrf = document.querySelector('meta[name="csrf-token"]')?.content ?? "";
const live = document.getElementById("live");

async function refresh() {
  if (!live || document.hidden || live.contains(document.activeElement)) return;
  const url = new URL(location.href);
  url.searchParams.set("fragment", "1");
  try {
    const response = await fetch(url, {credentials: "same-origin"});
    if (response.redirected || response.status === 401) { location.reload(); return; }
    if (response.ok) live.innerHTML = await response.text();
  } catch (_) { /* the server is restarting: the next tick tries again */ }
}

async function act(button) {
  const box = button.closest(".actions");
  const reason = box.querySelector(".reason").value.trim();
  const outcome = box.querySelector(".outcome");
  if (!reason) { outcome.textContent = "Say why first: the reason goes into the history."; return; }
  const action = button.dataset.action;
  if (!confirm(`${button.textContent}?\nReason: ${reason}`)) return;
  const path = box.dataset.task
    ? `/api/v1/tasks/${box.dataset.task}/${action}`
    : `/api/v1/alerts/${box.dataset.alert}/${action}`;
  button.disabled = true;
  const response = await fetch(path, {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
    body: JSON.stringify({reason}),
  });
  const body = await response.json().catch(() => ({}));
  outcome.textContent = response.ok ? "Done." : (body.error?.message ?? `Failed (${response.status}).`);
  button.disabled = false;
  if (response.ok) { document.activeElement?.blur(); await refresh(); }
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-action]");
  if (button) { event.preventDefault(); act(button); }
});

if (live) setInterval(refresh, Number(live.dataset.refresh) || 2000);
