// The playground's behaviour: shows the served family's panel and calls the server's API
// (a GPT's completions streamed as server-sent events, BERT's fill-mask, classify, tag (the
// entities highlighted in the text) or answer (the answer highlighted in its context), the
// translator), and for a checkpoint served with PyTorch draws the input's attention maps on
// canvases (a translator's encoder, decoder or cross-attention: target rows by source
// columns). When the API answers 401 (a server started with --api-key) it asks for the key and
// sends it as Authorization: Bearer, keeping it in this tab's sessionStorage. Plain browser
// JavaScript, no library.
"use strict";

const $ = (id) => document.getElementById(id);
const number = (id) => ($(id).value === "" ? undefined : Number($(id).value));

function showError(message) { $("error").textContent = message || ""; }

const KEY = "pygpt-api-key";  // the API key's name in sessionStorage

function useKey(event) {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("api-key").value);
  $("api-key").value = "";
  $("auth").hidden = true;
  showError("");
}

async function post(path, body, signal) {
  const headers = {"Content-Type": "application/json"};
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, {method: "POST", headers, body: JSON.stringify(body), signal});
  if (!response.ok) {
    const problem = await response.json().catch(() => ({}));
    if (response.status === 401) { $("auth").hidden = false; $("api-key").focus(); }
    throw new Error((problem.error && problem.error.message) || response.statusText);
  }
  return response;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell;
    tr.appendChild(td);
  }
  return tr;
}

function bar(p) {
  const div = document.createElement("div");
  div.className = "bar";
  div.style.width = `${Math.round(p * 200)}px`;
  return div;
}

// --- GPT: stream a completion in ------------------------------------------------------------
let running = null;  // the AbortController of the completion streaming in

async function generate() {
  showError("");
  const prompt = $("prompt").value;
  $("completion").querySelector(".prompt-echo").textContent = prompt;
  $("generated").textContent = "";
  const body = {prompt, stream: true, max_tokens: number("max_tokens"),
                temperature: number("temperature"), top_k: number("top_k"),
                top_p: number("top_p"), seed: number("seed")};
  if ($("stop").value) body.stop = $("stop").value;
  running = new AbortController();
  $("generate").disabled = true; $("halt").disabled = false;
  try {
    const response = await post("/v1/completions", body, running.signal);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, end).replace(/^data: /, "");
        buffer = buffer.slice(end + 2);
        if (line === "[DONE]") continue;
        const event = JSON.parse(line);
        if (event.error) throw new Error(event.error.message);
        for (const choice of event.choices) $("generated").textContent += choice.text;
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") showError(e.message);
  } finally {
    $("generate").disabled = false; $("halt").disabled = true; running = null;
  }
}

// --- BERT and the translator ------------------------------------------------------------------
async function fill() {
  showError("");
  const response = await post("/v1/fill-mask", {text: $("mask-text").value, top_k: number("mask-top-k")});
  const {masks} = await response.json();
  const out = $("fills");
  out.textContent = "";
  masks.forEach((candidates, n) => {
    const table = document.createElement("table");
    table.appendChild(row([`[MASK] ${n + 1}`, "", ""]));
    for (const {token, score} of candidates) table.appendChild(row([token, bar(score), score.toFixed(3)]));
    out.appendChild(table);
  });
}

async function classify() {
  showError("");
  const body = {text: $("cls-text").value};
  if ($("cls-pair").value) body.text_pair = $("cls-pair").value;
  const result = await (await post("/v1/classify", body)).json();
  const table = document.createElement("table");
  for (const {label, probability} of result.probabilities) {
    table.appendChild(row([label, bar(probability), probability.toFixed(4)]));
  }
  $("labels").textContent = "";
  $("labels").appendChild(table);
}

// The text with each [start, end) character span of marks ({start, end, kind}, in order, not
// overlapping) in a <mark> coloured by its kind and labelled with it.
const MARK_COLOURS = ["#ffe08a", "#b8e0ff", "#c8f0c0", "#ffc8d8", "#e0d0ff", "#ffd8b0"];
let kinds = [];  // the entity types of the served tagger, in its labels' order

function highlighted(box, text, marks) {
  box.textContent = "";
  let at = 0;
  for (const {start, end, kind} of marks) {
    box.append(text.slice(at, start));
    const mark = document.createElement("mark");
    mark.textContent = text.slice(start, end);
    mark.dataset.kind = kind;
    mark.style.background = MARK_COLOURS[Math.max(0, kinds.indexOf(kind)) % MARK_COLOURS.length];
    const label = document.createElement("span");
    label.className = "kind";
    label.textContent = kind;
    mark.appendChild(label);
    box.appendChild(mark);
    at = end;
  }
  box.append(text.slice(at));
}

async function tag() {
  showError("");
  const text = $("tag-text").value;
  const {entities} = await (await post("/v1/tag", {text})).json();
  highlighted($("tagged"), text, entities.map(({type, start, end}) => ({start, end, kind: type})));
  const table = document.createElement("table");
  for (const {type, start, end, text: words} of entities) {
    table.appendChild(row([type, words, `[${start}, ${end})`]));
  }
  $("entities").textContent = entities.length ? "" : "no entities found";
  $("entities").appendChild(table);
}

async function answer() {
  showError("");
  const context = $("qa-context").value;
  const body = {question: $("qa-question").value, context,
                no_answer: $("qa-no-answer").checked, null_threshold: number("qa-threshold") || 0};
  const found = await (await post("/v1/answer", body)).json();
  const marks = found.answer === null ? [] : [{start: found.start, end: found.end, kind: "answer"}];
  highlighted($("answered"), context, marks);
  $("answer-note").textContent = found.answer === null
    ? `no answer: [CLS] scores ${found.null_score.toFixed(4)}, the best span ${found.score.toFixed(4)}`
    : `score ${found.score.toFixed(4)} (start + end logit; [CLS] ${found.null_score.toFixed(4)})`;
}

async function translate() {
  showError("");
  const body = {text: $("source").value.split("\n"), beam: number("beam"),
                length_penalty: number("length_penalty")};
  const {translations} = await (await post("/v1/translate", body)).json();
  $("translations").textContent = translations.join("\n");
}

// --- Attention maps (a checkpoint served with PyTorch: POST /v1/attention) ------------------
const HEAT = [74, 123, 208];  // the colour of weight 1 (weight 0: white)
// Per served task: the input whose attention is drawn, and the panel's title. A question
// answerer reads its pair as the model does: [CLS] question [SEP] context [SEP].
const firstLine = (text) => text.split("\n").find((line) => line.trim()) || "";
const ATTENTION_INPUT = {
  generate: [() => $("prompt").value, "Attention of the prompt"],
  "fill-mask": [() => $("mask-text").value, "Attention of the text"],
  classify: [() => $("cls-text").value, "Attention of the text"],
  tag: [() => $("tag-text").value, "Attention of the text"],
  qa: [() => `${$("qa-question").value} [SEP] ${$("qa-context").value}`,
       "Attention of the question and its context"],
  translate: [() => firstLine($("source").value),
              "Attention of the first source sentence and its translation"],
};
// Per part: what a map's rows (queries) and columns (keys) are.
const AXES = {
  self: "a row per query token, a column per key token it attends to",
  encoder: "a row per source token, a column per source token it attends to",
  decoder: "a row per target token, a column per target token it attends to ([BOS] first)",
  cross: "a row per target token (the decoder's queries), a column per source token (the " +
         "encoder's keys): for a trained translator, the source words each target word is " +
         "read from",
};
let attention = null;  // /health's attention: {parts: {part: layers}, heads, max_tokens}

function shown(token) {
  return token.replace(/\n/g, "\u23ce").replace(/ /g, "\u2423");
}

// A heatmap of matrix (a row per token of rows, a column per token of columns), the tokens
// written on top (columns) and at the left (rows) when the cells are large enough to name.
function heatmap(title, rows, columns, matrix) {
  const n = Math.max(rows.length, columns.length);
  const cell = Math.max(2, Math.min(14, Math.floor(180 / n)));
  const canvas = document.createElement("canvas");
  const ctx = canvas.getContext("2d");
  const font = `${Math.min(cell, 12)}px monospace`;
  ctx.font = font;
  const widest = Math.max(...rows.map((t) => ctx.measureText(shown(t)).width));
  const [top, left] = cell >= 8 ? [28, Math.max(28, Math.ceil(widest) + 6)] : [0, 0];
  canvas.width = left + columns.length * cell;  // (resizing resets the context's settings)
  canvas.height = top + rows.length * cell;
  matrix.forEach((weights, q) => weights.forEach((w, k) => {
    const [r, g, b] = HEAT.map((c) => Math.round(255 - w * (255 - c)));
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect(left + k * cell, top + q * cell, cell, cell);
  }));
  if (top) {
    ctx.fillStyle = "#333";
    ctx.font = font;
    ctx.textAlign = "center";
    columns.forEach((t, i) => ctx.fillText(shown(t), left + (i + 0.5) * cell, top - 6));  // keys
    ctx.textAlign = "right";
    rows.forEach((t, i) => ctx.fillText(shown(t), left - 3, top + (i + 0.8) * cell));  // queries
  }
  const figure = document.createElement("figure");
  const caption = document.createElement("figcaption");
  caption.textContent = title;
  figure.append(canvas, caption);
  return figure;
}

function fillLayers() {
  const select = $("attn-layer"), kept = select.value;
  const count = attention.parts[$("attn-part").value];
  select.textContent = "";
  for (let i = 0; i < count; i++) select.add(new Option(`${i}`, `${i}`));
  if (kept !== "" && Number(kept) < count) select.value = kept;
  $("attn-note").textContent = `Each head's softmax weights: ${AXES[$("attn-part").value]} ` +
                               "(darker: more weight).";
}

async function attend() {
  showError("");
  const part = $("attn-part").value;
  const body = {text: ATTENTION_INPUT[attention.task][0](), layer: Number($("attn-layer").value), part};
  const given = $("attn-target").value;
  if (attention.task === "translate" && given) body.target = given;
  const answer = await (await post("/v1/attention", body)).json();
  const source = answer.tokens, target = answer.target_tokens;
  const [rows, columns] = {self: [source, source], encoder: [source, source],
                           decoder: [target, target], cross: [target, source]}[part];
  $("attn-tokens").textContent = target.length
    ? `source: ${source.map(shown).join(" ")} · target: ${target.map(shown).join(" ")}` : "";
  const out = $("attn-maps");
  out.textContent = "";
  for (const {layer, probs} of answer.layers) {
    const name = part === "self" ? "" : `${part} `;
    probs.forEach((matrix, h) => out.appendChild(
      heatmap(`${name}layer ${layer}, head ${h}`, rows, columns, matrix)));
  }
}

function guarded(action) {
  return () => action().catch((e) => showError(e.message));
}

async function start() {
  const health = await (await fetch("/health")).json();
  $("model").textContent = `${health.model} · ${health.family} · ${health.task}`;
  const panel = {gpt: "gpt", bert: health.task, seq2seq: "translate"}[health.family];
  $(panel).hidden = false;
  $("auth").onsubmit = useKey;
  $("generate").onclick = generate;
  $("halt").onclick = () => running && running.abort();
  $("fill").onclick = guarded(fill);
  $("classify-go").onclick = guarded(classify);
  $("translate-go").onclick = guarded(translate);
  $("tag-go").onclick = guarded(tag);
  $("answer-go").onclick = guarded(answer);
  if (health.task === "tag") {
    kinds = [...new Set(health.labels.filter((l) => l !== "O").map((l) => l.slice(2)))];
  }
  if (health.attention) {
    attention = {...health.attention, task: health.task};
    const parts = Object.keys(attention.parts);
    for (const part of parts) $("attn-part").add(new Option(part, part));
    if (parts.includes("cross")) $("attn-part").value = "cross";
    $("attn-part-label").hidden = parts.length < 2;
    $("attn-target-label").hidden = health.task !== "translate";
    $("attn-heading").textContent = ATTENTION_INPUT[health.task][1];
    fillLayers();
    $("attention").hidden = false;
    $("attend").onclick = guarded(attend);
    $("attn-layer").onchange = guarded(attend);
    $("attn-part").onchange = guarded(() => { fillLayers(); return attend(); });
  }
}

start().catch((e) => showError(`cannot reach the server: ${e.message}`));
