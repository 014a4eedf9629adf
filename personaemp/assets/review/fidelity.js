// personaemp review --fidelity: one blinded pair at a time, picked from the keyboard (a / b,
// j / k to move); every pick is POSTed to /api/label at once. The page never gets the answer.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token") || sessionStorage.getItem("personaemp-token") || "";
sessionStorage.setItem("personaemp-token", TOKEN);
const $ = (id) => document.getElementById(id);
const state = { items: [], at: 0, reviewer: "", picks: {}, pending: 0 };

function api(path, options = {}) {
  return fetch(path, { ...options, headers: { ...(options.headers || {}), "X-Review-Token": TOKEN } });
}

function show() {
  const item = state.items[state.at];
  if (!item) return;
  $("position").textContent = `${state.at + 1} of ${state.items.length}`;
  $("dialogue").textContent = item.dialogue;
  $("reply").textContent = item.reply;
  $("first").textContent = item.first;
  $("second").textContent = item.second;
  const picked = state.picks[item.item];
  for (const [id, value] of [["pick-a", "A"], ["pick-b", "B"]]) {
    $(id).classList.toggle("chosen", picked === value);
    $(id).setAttribute("aria-pressed", String(picked === value));
  }
  const done = state.items.filter((i) => state.picks[i.item]).length;
  $("progress").textContent = `${done} picked`;
  const address = new URL(location.href);
  address.searchParams.set("pair", item.item);
  history.replaceState(null, "", address);
}

async function pick(value) {
  const item = state.items[state.at];
  if (!item || !state.reviewer) return;
  const cleared = state.picks[item.item] === value;
  const sent = cleared ? null : value;
  if (cleared) delete state.picks[item.item]; else state.picks[item.item] = value;
  show();
  state.pending += 1;
  document.body.dataset.pending = String(state.pending);
  // One POST at a time, in the order of the keys: quick presses must not reach the server
  // reordered (the last event is the label).
  const body = JSON.stringify({ reviewer: state.reviewer, item: item.item, field: "pick", value: sent });
  state.chain = (state.chain || Promise.resolve()).then(async () => {
    try {
      const response = await api("/api/label", {
        method: "POST", headers: { "Content-Type": "application/json" }, body,
      });
      $("status").textContent = response.ok ? "saved" : `not saved: ${(await response.json()).error}`;
    } catch (error) {
      $("status").textContent = `not saved: ${error}`;
    } finally {
      state.pending -= 1;
      document.body.dataset.pending = String(state.pending);
    }
  });
  await state.chain;
}

function move(step) {
  state.at = Math.max(0, Math.min(state.items.length - 1, state.at + step));
  show();
}

async function start(name) {
  state.reviewer = name;
  $("reviewer").value = name;
  localStorage.setItem("personaemp-reviewer", name);
  $("login").hidden = true;
  const labels = await (await api("/api/labels?reviewer=" + encodeURIComponent(name))).json();
  state.picks = {};
  for (const [item, fields] of Object.entries(labels.labels || {})) {
    if (fields.pick) state.picks[item] = fields.pick;
  }
  const wanted = new URLSearchParams(location.search).get("pair");
  const found = state.items.findIndex((i) => i.item === wanted);
  state.at = found >= 0 ? found : 0;
  show();
  document.body.dataset.pending = "0";
  document.body.dataset.ready = "true";
}

document.addEventListener("keydown", (event) => {
  if (!$("login").hidden || event.target.tagName === "INPUT" || event.ctrlKey || event.metaKey || event.altKey) return;
  const key = event.key;
  if (key === "a" || key === "A") pick("A");
  else if (key === "b" || key === "B") pick("B");
  else if (key === "j" || key === "ArrowRight") move(1);
  else if (key === "k" || key === "ArrowLeft") move(-1);
  else return;
  event.preventDefault();
});

$("pick-a").addEventListener("click", () => pick("A"));
$("pick-b").addEventListener("click", () => pick("B"));
$("next").addEventListener("click", () => move(1));
$("prev").addEventListener("click", () => move(-1));
$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const name = $("login-name").value.trim();
  if (name) start(name);
});

(async () => {
  const answer = await (await api("/api/items")).json();
  state.items = answer.items || [];
  const known = localStorage.getItem("personaemp-reviewer");
  if (known) start(known);
  else { $("login").hidden = false; $("login-name").focus(); }
})();
