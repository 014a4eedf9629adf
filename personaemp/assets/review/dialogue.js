// personaemp review --dialogues: one supporter's dialogue at a time, the other supporters' dialogue
// of the same query beside it. Loaded after review.js, whose state, saving and start it shares.
"use strict";

const DIMENSIONS = {
  resonation: "understands this user's emotions and the needs under them",
  expression: "strategy, tone and style suit this particular person",
  reception: "this user would feel supported",
};
// the simulator's rules and its LLM check, in the order the record's checks take (names from
// personaemp/instruments/simulator_rules.py); a name a newer run adds is shown after them
const KNOWN_CHECKS = ["language_match", "length_ok", "no_need_leak", "no_emotion_number", "no_early_end",
  "in_character", "grounded"];
const dialogueState = { turnCursor: 0, dimension: 0 };
// SVG's namespace as the HTML parser gives it (the page names no address of any other host)
const SVG_NAMESPACE = (() => { const box = document.createElement("div"); box.innerHTML = "<svg></svg>"; return box.firstChild.namespaceURI; })();

function itemKey(item) { return item.item || item.query_id; }
function byKey(key) { return state.items.findIndex((item) => itemKey(item) === key); }

function dialogueMissing(item) {
  const labels = state.labels[itemKey(item)] || {};
  let count = 0;
  for (const n of item.labelled_turns) {
    if (!labels["realism:" + n]) count += 1;
    if (!labels["character:" + n]) count += 1;
  }
  for (const name of Object.keys(DIMENSIONS)) if (!labels["perm:" + name]) count += 1;
  return count;
}

function checkNames(item) {
  // every name any turn of this dialogue has, known ones first: a name absent from a turn did
  // not run on it and shows as "not checked", never as a pass
  const seen = new Set();
  for (const turn of item.turns) for (const name of Object.keys(turn.checks || {})) seen.add(name);
  return [...KNOWN_CHECKS.filter((n) => seen.has(n) || n === "in_character" || n === "grounded"),
    ...[...seen].filter((n) => !KNOWN_CHECKS.includes(n)).sort()];
}

function emotionChart(item, others) {
  // the simulated emotion over the turns: this dialogue solid, the ones beside it dashed
  const ns = SVG_NAMESPACE;
  const width = 520, height = 150, left = 30, right = 10, top = 10, bottom = 22;
  const series = [item, ...others].map((d) => d.turns.filter((t) => t.role === "user" && t.emotion != null).map((t) => t.emotion));
  const longest = Math.max(2, ...series.map((s) => s.length));
  const x = (i) => left + (i * (width - left - right)) / (longest - 1);
  const y = (v) => top + ((100 - v) * (height - top - bottom)) / 100;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("class", "chart");
  svg.setAttribute("role", "img");
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text != null) node.textContent = text;
    svg.append(node);
    return node;
  };
  for (const v of [0, 40, 100]) {
    add("line", { x1: left, x2: width - right, y1: y(v), y2: y(v), class: "grid" });
    add("text", { x: left - 4, y: y(v) + 4, class: "axis", "text-anchor": "end" }, String(v));
  }
  for (let i = 0; i < longest; i++) add("text", { x: x(i), y: height - 6, class: "axis", "text-anchor": "middle" }, i === 0 ? "open" : String(i));
  series.forEach((values, s) => {
    const points = values.map((v, i) => `${x(i)},${y(v)}`).join(" ");
    add("polyline", { points, class: s === 0 ? "line" : "line beside", "data-series": s === 0 ? item.system : others[s - 1].system });
    values.forEach((v, i) => add("circle", { cx: x(i), cy: y(v), r: s === 0 ? 3.5 : 2.5, class: s === 0 ? "dot" : "dot beside" }));
  });
  const names = [item.system + " (this one)", ...others.map((d) => d.system)];
  svg.setAttribute("aria-label", "emotion over the turns: " + names.join(", "));
  return el("figure", { class: "chart-box" }, svg,
    el("figcaption", { class: "muted" }, el("span", { class: "key solid" }), " " + names[0],
      ...others.map((d) => el("span", {}, "  ", el("span", { class: "key dashed" }), " " + d.system)),
      " — the simulated user's emotion (0-100) after each supporter turn"));
}

function checkChips(turn, names) {
  const checks = turn.checks || {};
  return el("div", { class: "chips" }, ...names.map((name) => {
    const ran = name in checks;
    const verdict = ran ? (checks[name] ? "pass" : "fail") : "not checked";
    return el("span", { class: "chip " + verdict.replace(" ", "-"), "data-check": name, title: verdict }, name + ": " + verdict);
  }));
}

function rejectedList(turn) {
  // the replies' texts are not shown here: the blind check offers them unmarked among the kept ones
  if (!turn.rejected.length) return null;
  return el("details", { class: "rejected" }, el("summary", { text: `${turn.rejected.length} repl${turn.rejected.length === 1 ? "y" : "ies"} asked again (texts in the blind check)` }),
    ...turn.rejected.map((r) => el("div", { class: "rejected-reply" },
      ...Object.keys(r.failed).map((rule) => el("div", { class: "fail-why" }, el("strong", { text: rule }))))));
}

function blindCheck(item) {
  return (item.probes || []).map((probe) => el("li", { class: "turn user probe", "data-target": probe.target },
    el("div", { class: "reason", dir: "auto", text: "answering: " + probe.answering }),
    el("div", { class: "text", dir: "auto", text: probe.text }),
    el("div", { class: "turn-labels" }, el("span", { class: "muted", text: "in character? " }),
      choice("character:" + probe.target, "in", "in", "good"), " ",
      choice("character:" + probe.target, "out", "out", "bad"))));
}

function turnBlock(item, turn, n, names, labelling) {
  const simulated = item.labelled_turns.includes(n);
  const who = turn.role === "assistant" ? "supporter" : n === 0 ? "user (the query)" : "simulated user";
  const parts = [el("div", { class: "who" }, who,
    turn.emotion != null ? el("span", { class: "emotion", text: ` emotion ${turn.emotion}` + (turn.change != null ? ` (${turn.change >= 0 ? "+" : ""}${turn.change})` : "") }) : null,
    turn.need_met ? el("span", { class: "met", text: " need met" }) : null),
    el("div", { class: "text", dir: "auto", text: turn.text })];
  if (simulated) {
    if (turn.thought) parts.push(el("div", { class: "reason", text: "thought: " + turn.thought }));
    if (turn.reason) parts.push(el("div", { class: "reason", text: "why the emotion moved: " + turn.reason }));
    parts.push(checkChips(turn, names), rejectedList(turn));
    if (labelling) {
      parts.push(el("div", { class: "turn-labels" },
        el("span", { class: "muted", text: "how this person would write? " }),
        choice("realism:" + n, "realistic", "realistic", "good", "r"), " ",
        choice("realism:" + n, "unrealistic", "not like them", "bad", "Shift+R"),
        el("span", { class: "muted", text: "  in character? " }),
        choice("character:" + n, "in", "in", "good", "c"), " ",
        choice("character:" + n, "out", "out", "bad", "Shift+C")));
    }
  }
  const cursor = labelling && simulated && item.labelled_turns[dialogueState.turnCursor] === n;
  return el("li", { class: `turn ${turn.role}${cursor ? " cursor" : ""}`, "data-turn": String(n) }, ...parts);
}

function renderDialogue() {
  const item = state.items[state.index];
  if (!item) return;
  const labels = labelsOf(item);
  const others = item.beside.map((key) => state.items[byKey(key)]).filter(Boolean);
  const names = checkNames(item);
  const done = state.items.filter((i) => !dialogueMissing(i)).length;
  $("position").textContent = `${state.index + 1} of ${state.items.length}`;
  $("progress").textContent = `${done} fully labelled`;
  document.title = `${state.index + 1}/${state.items.length} · personaemp review`;
  if (location.hash !== "#" + (state.index + 1)) history.replaceState(null, "", location.search + "#" + (state.index + 1));

  $("d-badges").replaceChildren(
    el("span", { class: "system", text: item.system }),
    el("span", { text: "supporter " + item.supporter_model }),
    el("span", { text: item.category || "?" }),
    el("span", { text: item.language || "language unknown" }),
    el("span", { text: "ended by " + item.ended_by }),
    el("span", { text: `emotion ${item.initial_emotion} → ${item.final_emotion}` }),
    el("span", { text: item.need_met_at_turn != null ? `need met after supporter turn ${item.need_met_at_turn}` : "need not met" }),
    el("span", { class: "muted", text: item.dialogue_id }),
  );
  $("d-need").textContent = item.hidden_need;
  $("d-chart").replaceChildren(emotionChart(item, others));
  dialogueState.turnCursor = Math.min(dialogueState.turnCursor, Math.max(0, item.labelled_turns.length - 1));
  $("d-turns").replaceChildren(...item.turns.map((turn, n) => turnBlock(item, turn, n, names, true)));
  $("d-blind").replaceChildren(...blindCheck(item));

  $("d-perm").replaceChildren(...Object.entries(DIMENSIONS).map(([name, meaning], d) => el("tr",
    { "data-dimension": name, class: d === dialogueState.dimension ? "cursor" : "" },
    el("td", {}, el("strong", { text: name }), el("div", { class: "reason", text: meaning })),
    el("td", { class: "buttons" }, ...[1, 2, 3, 4, 5].map((score) => {
      const button = el("button", { class: "choice small score", "data-field": "perm:" + name, "data-value": String(score),
        "aria-pressed": String(labels["perm:" + name] === score), title: String(score),
        onclick: () => setLabel("perm:" + name, score) }, String(score));
      return button;
    })))));
  const note = $("note");
  if (document.activeElement !== note) note.value = labels.note || "";

  $("d-beside").replaceChildren(...(others.length ? others.map((other) => el("div", { class: "beside-dialogue", "data-item": other.item },
    el("div", { class: "badges" }, el("span", { class: "system", text: other.system }),
      el("span", { text: `emotion ${other.initial_emotion} → ${other.final_emotion}` }),
      el("span", { text: "ended by " + other.ended_by })),
    el("ol", { class: "turns compact" }, ...other.turns.map((turn, n) => turnBlock(other, turn, n, checkNames(other), false))),
    el("button", { class: "open-beside", onclick: () => go(byKey(other.item)) }, el("kbd", { text: "b" }), " label this one"),
  )) : [el("p", { class: "muted", text: "no other supporter's dialogue of this query in the sample" })]));
  document.body.dataset.index = String(state.index);
}

function onDialogueKey(event, item) {
  // the keys of a dialogue (review.js handles j, k, g, n, ?, Esc)
  const turns = item.labelled_turns;
  const marked = turns[dialogueState.turnCursor];
  const digit = /^Digit([1-5])$/.exec(event.code);
  const dimensions = Object.keys(DIMENSIONS);
  if (digit && !event.shiftKey) {
    setLabel("perm:" + dimensions[dialogueState.dimension], Number(digit[1]), false);
    dialogueState.dimension = Math.min(dialogueState.dimension + 1, dimensions.length - 1);
    render();
  } else if (event.key === "p" || event.key === "P") {
    const step = event.key === "P" ? -1 : 1;
    dialogueState.dimension = (dialogueState.dimension + step + dimensions.length) % dimensions.length;
    render();
  } else if ((event.key === "r" || event.key === "R") && marked != null) {
    setLabel("realism:" + marked, event.key === "r" ? "realistic" : "unrealistic", false);
  } else if ((event.key === "c" || event.key === "C") && marked != null) {
    setLabel("character:" + marked, event.key === "c" ? "in" : "out", false);
    dialogueState.turnCursor = Math.min(dialogueState.turnCursor + 1, turns.length - 1);
    render();
  } else if ((event.key === "t" || event.key === "T") && turns.length) {
    const step = event.key === "T" ? -1 : 1;
    dialogueState.turnCursor = (dialogueState.turnCursor + step + turns.length) % turns.length;
    render();
  } else if (event.key === "b" && item.beside.length) {
    go(byKey(item.beside[0]));
  } else return false;
  const marker = document.querySelector("#d-turns li.cursor");
  if (marker) marker.scrollIntoView({ block: "nearest" });
  return true;
}
