// personaemp review: one query at a time; every click is POSTed to /api/label at once.
"use strict";

const LLM_CHECKS = ["emotional_support", "logical_consistency", "role_awareness", "category_match"];
const BIG_FIVE = ["openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism"];
const state = { items: [], labels: {}, index: 0, reviewer: "", traitCursor: 0, queue: Promise.resolve(), pending: 0, refused: false };
const $ = (id) => document.getElementById(id);

// The session's token comes in the address `personaemp review` prints and goes with every API
// call; a page opened without it (or by another site) gets nothing from the server.
const TOKEN = new URLSearchParams(location.search).get("token") || sessionStorage.getItem("personaemp-token") || "";
sessionStorage.setItem("personaemp-token", TOKEN);

function api(path, options = {}) {
  return fetch(path, { ...options, headers: { ...(options.headers || {}), "X-Review-Token": TOKEN } });
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

// --- saving ------------------------------------------------------------------------------------

function setStatus(text, kind) {
  const status = $("status");
  status.textContent = text;
  status.className = "status " + (kind || "");
}

function send(event) {
  // One request at a time, in click order; "saved" only once the server says the line is on
  // disk. Unreachable or not writing: retried until it answers; refused: shown, not retried.
  if (state.pending === 0) state.refused = false;
  state.pending += 1;
  setStatus("saving…");
  state.queue = state.queue.then(async () => {
    for (let attempt = 0; ; attempt++) {
      try {
        const response = await api("/api/label", {
          method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(event),
        });
        if (response.status >= 400 && response.status < 500) {
          const answer = await response.json();
          state.refused = true;
          setStatus("NOT SAVED — refused: " + answer.error, "error");
          break;
        }
        if (!response.ok) throw new Error("HTTP " + response.status);
        break;
      } catch (error) {
        setStatus("NOT SAVED — server unreachable or not writing, retrying", "error");
        await new Promise((done) => setTimeout(done, Math.min(5000, 500 * (attempt + 1))));
      }
    }
    state.pending -= 1;
    if (state.pending === 0 && !state.refused) setStatus("saved", "saved");
    document.body.dataset.pending = String(state.pending);
  });
  document.body.dataset.pending = String(state.pending);
}

function labelsOf(item) {
  const key = itemKey(item);
  if (!state.labels[key]) state.labels[key] = {};
  return state.labels[key];
}

function target(item) {
  // what a label names: a query by its id, a dialogue by its item (system/dialogue_id)
  return item.kind === "dialogue" ? { item: item.item } : { query_id: item.query_id };
}

function setLabel(field, value, toggle = true) {
  const item = state.items[state.index];
  const labels = labelsOf(item);
  if (toggle && labels[field] === value) value = null; // the same choice again clears it
  if (value === null || value === "") delete labels[field];
  else labels[field] = value;
  send({ reviewer: state.reviewer, ...target(item), field, value });
  render();
}

// --- what is left to do -------------------------------------------------------------------------

function missing(item) {
  if (item.kind === "dialogue") return dialogueMissing(item);
  const labels = state.labels[item.query_id] || {};
  let count = labels.query ? 0 : 1;
  for (const name of LLM_CHECKS) if (name in item.checks && !labels["check:" + name]) count += 1;
  item.traits.forEach((_, n) => { if (!labels["trait:" + n]) count += 1; });
  return count;
}

function nextToDo(from) {
  for (let step = 1; step <= state.items.length; step++) {
    const n = (from + step) % state.items.length;
    if (missing(state.items[n])) return n;
  }
  return from;
}

// --- drawing -----------------------------------------------------------------------------------

function cite(id) {
  return el("a", { class: "cite", href: "#memory-" + id, "data-memory": id, onclick: (e) => {
    e.preventDefault();
    const target = $("memory-" + id);
    if (!target) return;
    target.scrollIntoView({ block: "center", behavior: "smooth" });
    target.classList.add("flash");
    setTimeout(() => target.classList.remove("flash"), 1200);
  } }, id);
}

function choice(field, value, text, kind, key) {
  const labels = labelsOf(state.items[state.index]);
  return el("button", {
    class: `choice small ${kind}`, "data-field": field, "data-value": value,
    "aria-pressed": String(labels[field] === value), title: key || "",
    onclick: () => setLabel(field, value),
  }, text);
}

function render() {
  const item = state.items[state.index];
  if (!item) return;
  if (item.kind === "dialogue") return renderDialogue();
  const labels = labelsOf(item);
  const done = state.items.filter((i) => !missing(i)).length;
  $("position").textContent = `${state.index + 1} of ${state.items.length}`;
  $("progress").textContent = `${done} fully labelled`;
  document.title = `${state.index + 1}/${state.items.length} · personaemp review`;
  if (location.hash !== "#" + (state.index + 1)) history.replaceState(null, "", location.search + "#" + (state.index + 1));

  $("badges").replaceChildren(
    el("span", { text: item.category || "?" }),
    el("span", { text: item.language || "language unknown" }),
    el("span", { class: item.accepted ? "accepted" : "rejected", text: item.accepted ? "accepted by the build" : "rejected by the build" }),
    el("span", { class: "muted", text: item.query_id }),
  );
  $("situation-topic").textContent = item.situation.topic || "";
  $("situation").replaceChildren(item.situation.text || "", " ", ...(item.situation.memory_ids || item.memory_ids).map(cite));
  $("query").textContent = item.query;
  for (const id of ["accept", "reject"]) $(id).setAttribute("aria-pressed", String(labels.query === id));
  const note = $("note");
  if (document.activeElement !== note) note.value = labels.note || "";

  const rows = [el("tr", {}, el("th", { text: "check" }), el("th", { text: "verdict" }), el("th", { text: "you" }))];
  let number = 0;
  for (const [name, ok] of Object.entries(item.checks)) {
    const llm = LLM_CHECKS.includes(name);
    if (llm) number += 1;
    const reason = item.reasons[name] || "";
    const enforced = item.enforced ? (item.enforced.includes(name) ? "" : " (recorded only)") : "";
    rows.push(el("tr", { "data-check": name },
      el("td", {}, llm ? el("kbd", { text: String(number) }) : null, " ", name, el("span", { class: "muted", text: enforced })),
      el("td", {}, el("span", { class: ok ? "pass" : "fail", text: ok ? "pass" : "fail" }),
        reason ? el("div", { class: "reason", text: reason }) : null),
      el("td", { class: "buttons" }, llm ? choice("check:" + name, "agree", "agree", "good", String(number)) : null, " ",
        llm ? choice("check:" + name, "disagree", "disagree", "bad", "Shift+" + number) : el("span", { class: "muted", text: "deterministic" })),
    ));
  }
  if (item.judge_language) rows.push(el("tr", {}, el("td", { text: "judge reads language" }), el("td", { text: item.judge_language }), el("td")));
  $("checks").replaceChildren(...rows);

  state.traitCursor = Math.min(state.traitCursor, Math.max(0, item.traits.length - 1));
  const light = (ids, on) => ids.forEach((id) => { const m = $("memory-" + id); if (m) m.classList.toggle("flash", on); });
  $("traits").replaceChildren(...item.traits.map((trait, n) => el("li", {
    class: n === state.traitCursor ? "cursor" : "", "data-trait": String(n),
    onmouseenter: () => light(trait.evidence || [], true), onmouseleave: () => light(trait.evidence || [], false) },
    el("div", { class: "aspect", text: (trait.aspect || "").replace(/_/g, " ") }),
    el("div", { text: trait.statement || "" }),
    el("div", {}, ...(trait.evidence || []).map(cite), " ",
      choice("trait:" + n, "supported", "supported", "good", "s"), " ",
      choice("trait:" + n, "unsupported", "unsupported", "bad", "u")),
  )));
  if (!item.traits.length) $("traits").replaceChildren(el("li", { class: "muted", text: "no traits" }));

  $("big-five").replaceChildren(...BIG_FIVE.filter((t) => item.big_five[t]).map((t) => {
    const level = item.big_five[t];
    return el("tr", {}, el("td", { text: t }), el("td", {}, el("strong", { text: level.level || "?" })),
      el("td", {}, ...(level.evidence || []).map(cite), el("div", { class: "reason", text: level.rationale || "" })));
  }));

  const cited = new Set(item.memory_ids);
  $("memory-count").textContent = `(${item.memories.length}; the query cites ${cited.size})`;
  $("memories").replaceChildren(...item.memories.map((m) => el("li", { id: "memory-" + m.memory_id, class: cited.has(m.memory_id) ? "cited" : "" },
    el("span", { class: "memory-id", text: m.memory_id }), el("span", { class: "label", text: m.label || "" }),
    el("div", { text: m.value || "" }),
    m.evidence_text ? el("div", { class: "evidence", text: "“" + m.evidence_text + "”" }) : null,
  )));
  document.body.dataset.index = String(state.index);
}

function go(index) {
  if (!state.items.length) return;
  saveNote();
  state.index = (index + state.items.length) % state.items.length;
  state.traitCursor = 0;
  dialogueState.turnCursor = 0;
  dialogueState.dimension = 0;
  window.scrollTo(0, 0);
  render();
}

// --- the note ----------------------------------------------------------------------------------

let noteTimer = null;
function saveNote() {
  clearTimeout(noteTimer);
  const item = state.items[state.index];
  if (!item) return;
  const value = $("note").value;
  const labels = labelsOf(item);
  if ((labels.note || "") === value) return;
  if (value) labels.note = value; else delete labels.note;
  send({ reviewer: state.reviewer, ...target(item), field: "note", value: value || null });
}

// --- keys --------------------------------------------------------------------------------------

function onKey(event) {
  if (!$("login").hidden) return;
  const typing = ["INPUT", "TEXTAREA"].includes(document.activeElement.tagName);
  if (typing) {
    if (event.key === "Escape") { saveNote(); document.activeElement.blur(); }
    return;
  }
  if (event.ctrlKey || event.metaKey || event.altKey) return;
  const item = state.items[state.index];
  if (!item) return;
  const digit = /^Digit([1-9])$/.exec(event.code);
  if (event.key === "?") {
    $("help").hidden = !$("help").hidden;
  } else if (event.key === "Escape") {
    $("help").hidden = true;
  } else if (event.key === "j" || event.key === "ArrowRight") go(state.index + 1);
  else if (event.key === "k" || event.key === "ArrowLeft") go(state.index - 1);
  else if (event.key === "g") go(nextToDo(state.index));
  else if (event.key === "n") { $("note").focus(); }
  else if (item.kind === "dialogue") {
    if (!onDialogueKey(event, item)) return;
  } else if (digit) {
    const names = LLM_CHECKS.filter((name) => name in item.checks);
    const name = names[Number(digit[1]) - 1];
    if (name) setLabel("check:" + name, event.shiftKey ? "disagree" : "agree");
  } else if (event.key === "a") setLabel("query", "accept");
  else if (event.key === "r") setLabel("query", "reject");
  else if (event.key === "s" || event.key === "u") {
    if (!item.traits.length) return;
    setLabel("trait:" + state.traitCursor, event.key === "s" ? "supported" : "unsupported", false);
    state.traitCursor = Math.min(state.traitCursor + 1, item.traits.length - 1);
    render();
  } else if (event.key === "t" || event.key === "T") {
    const step = event.key === "T" ? -1 : 1;
    state.traitCursor = (state.traitCursor + step + item.traits.length) % Math.max(1, item.traits.length);
    render();
  } else return;
  event.preventDefault();
}

// --- start -------------------------------------------------------------------------------------

async function loadLabels() {
  const answer = await (await api("/api/labels?reviewer=" + encodeURIComponent(state.reviewer))).json();
  state.labels = answer.labels || {};
  return answer;
}

async function start(name) {
  state.reviewer = name.trim();
  localStorage.setItem("personaemp-reviewer", state.reviewer);
  $("reviewer").value = state.reviewer;
  $("login").hidden = true;
  const params = new URLSearchParams(location.search);
  if (params.get("reviewer") !== state.reviewer) {
    params.set("reviewer", state.reviewer);
    history.replaceState(null, "", "?" + params + location.hash);
  }
  await loadLabels();
  // resume: the position in the address, else the first query this reviewer has not decided
  const fromHash = Number(location.hash.slice(1));
  let index = state.items.findIndex((item) =>
    item.kind === "dialogue" ? dialogueMissing(item) > 0 : !(state.labels[item.query_id] || {}).query);
  if (fromHash >= 1 && fromHash <= state.items.length) index = fromHash - 1;
  state.index = index < 0 ? 0 : index;
  setStatus("ready");
  render();
  document.body.dataset.ready = "true";
}

async function main() {
  const response = await api("/api/items");
  const answer = await response.json();
  if (!response.ok) {
    setStatus(answer.error, "error");
    return;
  }
  state.items = answer.items;
  document.querySelectorAll(".labels-file").forEach((node) => { node.textContent = answer.labels; });
  const dialogues = state.items.length > 0 && state.items[0].kind === "dialogue";
  document.body.dataset.mode = dialogues ? "dialogue" : "query";
  $("main").hidden = dialogues;
  $("dialogue-main").hidden = !dialogues;
  $("help-query").hidden = dialogues;
  $("help-dialogue").hidden = !dialogues;
  if (dialogues) $("dialogue-note-slot").append($("note-box"));
  $("prev").onclick = () => go(state.index - 1);
  $("next").onclick = () => go(state.index + 1);
  $("todo").onclick = () => go(nextToDo(state.index));
  $("accept").onclick = () => setLabel("query", "accept");
  $("reject").onclick = () => setLabel("query", "reject");
  $("help-button").onclick = () => { $("help").hidden = !$("help").hidden; };
  $("help-close").onclick = () => { $("help").hidden = true; };
  $("note").addEventListener("input", () => { clearTimeout(noteTimer); noteTimer = setTimeout(saveNote, 600); });
  $("note").addEventListener("blur", saveNote);
  $("reviewer").addEventListener("change", () => { if ($("reviewer").value.trim()) start($("reviewer").value); });
  $("login-form").addEventListener("submit", (event) => { event.preventDefault(); start($("login-name").value); });
  document.addEventListener("keydown", onKey);
  window.addEventListener("beforeunload", saveNote);
  const name = new URLSearchParams(location.search).get("reviewer") || localStorage.getItem("personaemp-reviewer");
  if (name && name.trim()) return start(name);
  const known = (await loadLabels()).reviewers || [];
  $("known").textContent = known.length ? "Reviewers so far: " + known.join(", ") : "";
  $("login").hidden = false;
  $("login-name").focus();
}

main();
