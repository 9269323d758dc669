// The classifier page: loads ONNX models into onnxruntime-web (WebAssembly,
// one thread, so no SharedArrayBuffer or cross-origin isolation is needed).
// The image model classifies the test images of samples.json on load, and
// whatever is drawn on the pad when Classify is pressed; the text model (a
// string input: its standardizing, splitting and vocabulary lookup are ops of
// the graph) classifies what is typed when Classify text is pressed. See
// index.html for the query string.
import * as ort from './node_modules/onnxruntime-web/dist/ort.wasm.min.mjs';

// kiln::datasets::fashion_mnist_class_names(), in label order.
const CLASS_NAMES = [
  'T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot',
];
const SIDE = 28;

const params = new URLSearchParams(location.search);
const modelUrl = params.get('model') || 'data/model.onnx';
const samplesUrl = params.get('samples') || 'data/samples.json';
const scale = parseScale(params.get('scale') || '1/255');
const textModelUrl = params.get('text_model') || 'data/text_model.onnx';
const textLabelsUrl = params.get('text_labels') || 'data/text_labels.json';

const $ = (id) => document.getElementById(id);

// "1/255", "0.5" -> a number.
function parseScale(text) {
  const m = /^\s*([0-9.eE+-]+)\s*(?:\/\s*([0-9.eE+-]+))?\s*$/.exec(text);
  const v = m ? Number(m[1]) / (m[2] === undefined ? 1 : Number(m[2])) : NaN;
  if (!Number.isFinite(v)) throw new Error(`scale= must be a number or a fraction like 1/255. Received: ${text}`);
  return v;
}

function setState(state, message) {
  document.body.dataset.state = state;
  if (message !== undefined) $('status').textContent = message;
}

// The model's one input: its name and the shape of one image (without the
// batch dimension), which must hold 28 x 28 values: (784), (28, 28), (28, 28, 1).
function describeInput(session) {
  if (session.inputNames.length !== 1)
    throw new Error(
      `the model has ${session.inputNames.length} inputs (${session.inputNames}); the page feeds one image`,
    );
  const meta = session.inputMetadata.find((m) => m.name === session.inputNames[0]);
  if (!meta || !meta.isTensor) throw new Error(`input '${session.inputNames[0]}' is not a tensor`);
  if (meta.type !== 'float32') throw new Error(`input '${meta.name}' is ${meta.type}; the page feeds float32`);
  const dims = meta.shape.slice(1);
  const size = dims.reduce((a, d) => a * (typeof d === 'number' ? d : NaN), 1);
  if (meta.shape.length < 2 || size !== SIDE * SIDE)
    throw new Error(`input '${meta.name}' has shape (${meta.shape.join(', ')}); expected a batch of 28 x 28 images`);
  return { name: meta.name, dims, shape: meta.shape };
}

// Softmax outputs are shown as they are; anything else (logits) goes through one.
function probabilities(row) {
  const sum = row.reduce((a, v) => a + v, 0);
  if (row.every((v) => v >= 0) && Math.abs(sum - 1) < 1e-3) return row;
  const max = Math.max(...row);
  const e = row.map((v) => Math.exp(v - max));
  const z = e.reduce((a, v) => a + v, 0);
  return e.map((v) => v / z);
}

function argmax(row) {
  let best = 0;
  for (let k = 1; k < row.length; ++k) if (row[k] > row[best]) best = k;
  return best;
}

// Runs `feeds` (a batch of `n`) through the model; one {cls, label, probs}
// per example, labelled with `names` (one per class).
async function classifyBatch(session, feeds, n, names) {
  const out = (await session.run(feeds))[session.outputNames[0]];
  const classes = out.dims[out.dims.length - 1];
  if (out.size !== n * classes || classes !== names.length)
    throw new Error(
      `output '${session.outputNames[0]}' has shape (${out.dims}); expected (batch, ${names.length}) for the labels`,
    );
  return Array.from({ length: n }, (_, i) => {
    const row = Array.from(out.data.subarray(i * classes, (i + 1) * classes));
    const cls = argmax(row);
    return { cls, label: names[cls], probs: probabilities(row) };
  });
}

// Runs a batch of images (arrays of 784 bytes, row-major) through the model.
async function classify(session, input, images) {
  const data = new Float32Array(images.length * SIDE * SIDE);
  images.forEach((pixels, i) => {
    for (let k = 0; k < SIDE * SIDE; ++k) data[i * SIDE * SIDE + k] = pixels[k] * scale;
  });
  const feeds = { [input.name]: new ort.Tensor('float32', data, [images.length, ...input.dims]) };
  return classifyBatch(session, feeds, images.length, CLASS_NAMES);
}

// The text model's one input: strings of shape (batch) or (batch, 1).
function describeTextInput(session) {
  if (session.inputNames.length !== 1)
    throw new Error(`the text model has ${session.inputNames.length} inputs; the page feeds one string`);
  const meta = session.inputMetadata.find((m) => m.name === session.inputNames[0]);
  if (!meta || !meta.isTensor || meta.type !== 'string')
    throw new Error(`text model input '${session.inputNames[0]}' is ${meta && meta.type}; expected strings`);
  const dims = meta.shape.slice(1);
  if (meta.shape.length > 2 || (dims.length === 1 && dims[0] !== 1))
    throw new Error(`text model input '${meta.name}' has shape (${meta.shape.join(', ')}); expected (batch) strings`);
  return { name: meta.name, dims, shape: meta.shape };
}

// Runs texts (strings) through the text model.
async function classifyTexts(session, input, names, texts) {
  const feeds = { [input.name]: new ort.Tensor('string', texts, [texts.length, ...input.dims]) };
  return classifyBatch(session, feeds, texts.length, names);
}

function drawPixels(canvas, pixels) {
  const ctx = canvas.getContext('2d', { willReadFrequently: true });
  const img = ctx.createImageData(SIDE, SIDE);
  for (let k = 0; k < SIDE * SIDE; ++k) {
    img.data.set([pixels[k], pixels[k], pixels[k], 255], 4 * k);
  }
  ctx.putImageData(img, 0, 0);
}

// The pad: 28 x 28 canvas pixels shown at 280 x 280; strokes are drawn in
// image pixels with a soft round brush, light on black like the data.
function setUpPad(pad) {
  const ctx = pad.getContext('2d', { willReadFrequently: true });
  const clear = () => {
    ctx.fillStyle = '#000';
    ctx.fillRect(0, 0, SIDE, SIDE);
  };
  clear();
  let last = null;
  const at = (e) => {
    const r = pad.getBoundingClientRect();
    return [((e.clientX - r.left) / r.width) * SIDE, ((e.clientY - r.top) / r.height) * SIDE];
  };
  const stroke = (from, to) => {
    ctx.strokeStyle = '#fff';
    ctx.lineWidth = 2.5;
    ctx.lineCap = 'round';
    ctx.lineJoin = 'round';
    ctx.beginPath();
    ctx.moveTo(...from);
    ctx.lineTo(...to);
    ctx.stroke();
  };
  pad.addEventListener('pointerdown', (e) => {
    pad.setPointerCapture(e.pointerId);
    last = at(e);
    stroke(last, last);
  });
  pad.addEventListener('pointermove', (e) => {
    if (!last) return;
    const p = at(e);
    stroke(last, p);
    last = p;
  });
  const end = () => (last = null);
  pad.addEventListener('pointerup', end);
  pad.addEventListener('pointercancel', end);
  return {
    clear,
    // The image as bytes (the red channel; the pad is gray).
    pixels: () => {
      const rgba = ctx.getImageData(0, 0, SIDE, SIDE).data;
      return Array.from({ length: SIDE * SIDE }, (_, k) => rgba[4 * k]);
    },
  };
}

// A result in the <output> `out` (its data-* carry it for tests) and its
// probabilities as bars in the list `list`.
function showResult(out, list, result, names, data) {
  out.dataset.state = 'done';
  out.dataset.predictedClass = result.cls;
  out.dataset.predictedLabel = result.label;
  out.dataset.probability = result.probs[result.cls];
  Object.assign(out.dataset, data);
  out.innerHTML = '';
  out.append('Prediction: ', Object.assign(document.createElement('b'), { textContent: result.label }));
  list.innerHTML = '';
  result.probs.forEach((p, k) => {
    const li = document.createElement('li');
    const bar = Object.assign(document.createElement('span'), { className: 'bar' });
    bar.style.width = `${(100 * p).toFixed(1)}%`;
    const track = Object.assign(document.createElement('span'), { className: 'track' });
    track.append(bar);
    const text = (t) => Object.assign(document.createElement('span'), { textContent: t });
    li.append(text(names[k]), track, text(`${(100 * p).toFixed(1)}%`));
    list.append(li);
  });
}

function sampleCard(sample, result, onPick) {
  const fig = document.createElement('figure');
  fig.className = 'sample';
  Object.assign(fig.dataset, {
    index: sample.index,
    trueClass: sample.label,
    trueLabel: CLASS_NAMES[sample.label],
    predictedClass: result.cls,
    predictedLabel: result.label,
    probability: result.probs[result.cls],
    correct: result.cls === sample.label,
  });
  fig.title = `test image #${sample.index}: click to copy it to the pad`;
  const canvas = Object.assign(document.createElement('canvas'), { width: SIDE, height: SIDE });
  drawPixels(canvas, sample.pixels);
  const caption = document.createElement('figcaption');
  caption.append(
    Object.assign(document.createElement('b'), { textContent: result.label }),
    ` ${(100 * result.probs[result.cls]).toFixed(0)}%`,
    document.createElement('br'),
    Object.assign(document.createElement('small'), {
      textContent: `#${sample.index} · true: ${CLASS_NAMES[sample.label]}`,
    }),
  );
  fig.append(canvas, caption);
  fig.addEventListener('click', () => onPick(sample));
  return fig;
}

// samples.json, or [] when there is none (the page then only has the pad).
async function loadSamples() {
  const res = await fetch(samplesUrl);
  if (res.status === 404) return [];
  if (!res.ok) throw new Error(`${samplesUrl}: HTTP ${res.status}`);
  const json = await res.json();
  for (const s of json.images) {
    if (!Array.isArray(s.pixels) || s.pixels.length !== SIDE * SIDE)
      throw new Error(`${samplesUrl}: image #${s.index} does not have 784 pixels`);
  }
  return json.images;
}

// The model at `url` in an inference session, or null when the server has none (404).
async function loadModel(url) {
  const res = await fetch(url);
  if (res.status === 404) return null;
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
  return ort.InferenceSession.create(new Uint8Array(await res.arrayBuffer()), { executionProviders: ['wasm'] });
}

// The image model: the pad, and the test images classified. Returns the status line's part.
async function runImageModel(session) {
  const input = describeInput(session);
  document.body.dataset.inputName = input.name;
  document.body.dataset.inputShape = input.shape.join(',');
  const described = `${modelUrl}: input '${input.name}' (${input.shape.join(', ')}) float32`;

  const pad = setUpPad($('pad'));
  $('clear').addEventListener('click', () => pad.clear());
  $('classify').addEventListener('click', async () => {
    const out = $('drawn-result');
    out.dataset.state = 'running';
    try {
      const pixels = pad.pixels();
      const [result] = await classify(session, input, [pixels]);
      showResult(out, $('drawn-probs'), result, CLASS_NAMES, { pixels: pixels.join(',') });
    } catch (e) {
      out.dataset.state = 'error';
      out.textContent = `Error: ${e.message}`;
    }
  });
  $('classify').disabled = false;

  const samples = await loadSamples();
  const grid = $('samples');
  if (samples.length === 0) {
    grid.textContent = `No test images (${samplesUrl} is missing; make one with make_samples.js).`;
    return `Model ${described}.`;
  }
  const t0 = performance.now();
  const results = await classify(session, input, samples.map((s) => s.pixels));
  const ms = performance.now() - t0;
  const pick = (sample) => drawPixels($('pad'), sample.pixels);
  samples.forEach((s, i) => grid.append(sampleCard(s, results[i], pick)));
  const right = results.filter((r, i) => r.cls === samples[i].label).length;
  document.body.dataset.correct = right;
  return `Model ${described}. ${samples.length} test images in ${ms.toFixed(0)} ms, ${right} right.`;
}

// text_labels.json's class names, or "class k" for each of the model's `classes` outputs.
async function loadTextLabels() {
  const res = await fetch(textLabelsUrl);
  if (res.status === 404) return null;
  if (!res.ok) throw new Error(`${textLabelsUrl}: HTTP ${res.status}`);
  const names = (await res.json()).class_names;
  if (!Array.isArray(names) || names.length === 0)
    throw new Error(`${textLabelsUrl}: expected {"class_names": ["...", ...]}`);
  return names;
}

// The text model: the text box and its Classify text button. Returns the status line's part.
async function runTextModel(session) {
  const input = describeTextInput(session);
  let names = await loadTextLabels();
  if (!names) {
    const feeds = { [input.name]: new ort.Tensor('string', [''], [1, ...input.dims]) };
    const out = (await session.run(feeds))[session.outputNames[0]];
    names = Array.from({ length: out.dims[out.dims.length - 1] }, (_, k) => `class ${k}`);
  }
  const panel = $('text-panel');
  const out = $('text-result');
  $('classify-text').addEventListener('click', async () => {
    out.dataset.state = 'running';
    const text = $('text-input').value;
    try {
      const [result] = await classifyTexts(session, input, names, [text]);
      showResult(out, $('text-probs'), result, names, { text });
    } catch (e) {
      out.dataset.state = 'error';
      out.textContent = `Error: ${e.message}`;
    }
  });
  $('classify-text').disabled = false;
  out.textContent = `Type a sentence about: ${names.join(', ')}.`;
  panel.dataset.state = 'ready';
  return `Text model ${textModelUrl}: input '${input.name}' (${input.shape.join(', ')}) string, ${names.length} classes.`;
}

async function main() {
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.proxy = false;
  ort.env.wasm.wasmPaths = new URL('node_modules/onnxruntime-web/dist/', location.href).href;
  const [image, text] = await Promise.all([loadModel(modelUrl), loadModel(textModelUrl)]);
  if (!image && !text) throw new Error(`neither ${modelUrl} nor ${textModelUrl} is there`);
  document.body.dataset.models = [image && 'image', text && 'text'].filter(Boolean).join(',');
  const runtime = `onnxruntime-web ${ort.env.versions.web}, wasm, 1 thread.`;
  setState('ready', `Loaded; ${runtime} Classifying...`);
  const parts = [];
  if (text) parts.push(await runTextModel(text));
  else {
    $('text-panel').dataset.state = 'none';
    $('text-panel').hidden = true;
  }
  if (image) parts.push(await runImageModel(image));
  else {
    $('draw-panel').hidden = true;
    $('samples-panel').hidden = true;
  }
  setState('done', `${parts.join(' ')} ${runtime}`);
}

main().catch((e) => {
  document.body.dataset.error = e.message;
  setState('error', `Error: ${e.message}`);
  console.error(e);
});
