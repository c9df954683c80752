// The playground's behaviour: shows the served family's panel and calls the server's API
// (a GPT's completions streamed as server-sent events, BERT's fill-mask or classify, the
// translator), and for a checkpoint served with PyTorch draws the prompt's attention maps on
// canvases. Plain browser JavaScript, no library.
"use strict";

const $ = (id) => document.getElementById(id);
const number = (id) => ($(id).value === "" ? undefined : Number($(id).value));

function showError(message) { $("error").textContent = message || ""; }

async function post(path, body, signal) {
  const response = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                                      body: JSON.stringify(body), signal});
  if (!response.ok) {
    const problem = await response.json().catch(() => ({}));
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

async function translate() {
  showError("");
  const body = {text: $("source").value.split("\n"), beam: number("beam"),
                length_penalty: number("length_penalty")};
  const {translations} = await (await post("/v1/translate", body)).json();
  $("translations").textContent = translations.join("\n");
}

// --- Attention maps (a checkpoint served with PyTorch: POST /v1/attention) ------------------
const HEAT = [74, 123, 208];  // the colour of weight 1 (weight 0: white)

function shown(token) {
  return token.replace(/\n/g, "\u23ce").replace(/ /g, "\u2423");
}

function heatmap(title, tokens, matrix) {
  const n = tokens.length, cell = Math.max(2, Math.min(14, Math.floor(180 / n)));
  const margin = cell >= 8 ? 28 : 0;
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = margin + n * cell;
  const ctx = canvas.getContext("2d");
  matrix.forEach((weights, q) => weights.forEach((w, k) => {
    const [r, g, b] = HEAT.map((c) => Math.round(255 - w * (255 - c)));
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect(margin + k * cell, margin + q * cell, cell, cell);
  }));
  if (margin) {
    ctx.fillStyle = "#333";
    ctx.font = `${Math.min(cell, 12)}px monospace`;
    ctx.textAlign = "center";
    tokens.forEach((t, i) => {
      ctx.fillText(shown(t), margin + (i + 0.5) * cell, margin - 6);  // keys, on top
      ctx.fillText(shown(t), margin / 2, margin + (i + 0.8) * cell);  // queries, at the left
    });
  }
  const figure = document.createElement("figure");
  const caption = document.createElement("figcaption");
  caption.textContent = title;
  figure.append(canvas, caption);
  return figure;
}

async function attend() {
  showError("");
  const body = {text: $("prompt").value, layer: Number($("attn-layer").value)};
  const {tokens, layers} = await (await post("/v1/attention", body)).json();
  const out = $("attn-maps");
  out.textContent = "";
  for (const {layer, probs} of layers) {
    probs.forEach((matrix, h) => out.appendChild(heatmap(`layer ${layer}, head ${h}`, tokens, matrix)));
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
  $("generate").onclick = generate;
  $("halt").onclick = () => running && running.abort();
  $("fill").onclick = guarded(fill);
  $("classify-go").onclick = guarded(classify);
  $("translate-go").onclick = guarded(translate);
  if (health.attention) {
    for (let i = 0; i < health.attention.layers; i++) $("attn-layer").add(new Option(`${i}`, `${i}`));
    $("attention").hidden = false;
    $("attend").onclick = guarded(attend);
    $("attn-layer").onchange = guarded(attend);
  }
}

start().catch((e) => showError(`cannot reach the server: ${e.message}`));
