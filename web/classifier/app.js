// The classifier page: loads an ONNX model into onnxruntime-web (WebAssembly,
// one thread, so no SharedArrayBuffer or cross-origin isolation is needed),
// classifies the test images of samples.json on load, and whatever is drawn
// on the pad when Classify is pressed. See index.html for the query string.
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

// Runs a batch of images (arrays of 784 bytes, row-major) through the model;
// one {cls, label, probs} per image.
async function classify(session, input, images) {
  const data = new Float32Array(images.length * SIDE * SIDE);
  images.forEach((pixels, i) => {
    for (let k = 0; k < SIDE * SIDE; ++k) data[i * SIDE * SIDE + k] = pixels[k] * scale;
  });
  const feeds = { [input.name]: new ort.Tensor('float32', data, [images.length, ...input.dims]) };
  const out = (await session.run(feeds))[session.outputNames[0]];
  const classes = out.dims[out.dims.length - 1];
  if (out.size !== images.length * classes || classes !== CLASS_NAMES.length)
    throw new Error(`output '${session.outputNames[0]}' has shape (${out.dims}); expected (batch, 10)`);
  return images.map((_, i) => {
    const row = Array.from(out.data.subarray(i * classes, (i + 1) * classes));
    const cls = argmax(row);
    return { cls, label: CLASS_NAMES[cls], probs: probabilities(row) };
  });
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

function showDrawnResult(result, pixels) {
  const out = $('drawn-result');
  out.dataset.state = 'done';
  out.dataset.predictedClass = result.cls;
  out.dataset.predictedLabel = result.label;
  out.dataset.probability = result.probs[result.cls];
  out.dataset.pixels = pixels.join(',');
  out.innerHTML = '';
  out.append('Prediction: ', Object.assign(document.createElement('b'), { textContent: result.label }));
  const list = $('drawn-probs');
  list.innerHTML = '';
  result.probs.forEach((p, k) => {
    const li = document.createElement('li');
    const bar = Object.assign(document.createElement('span'), { className: 'bar' });
    bar.style.width = `${(100 * p).toFixed(1)}%`;
    const track = Object.assign(document.createElement('span'), { className: 'track' });
    track.append(bar);
    const text = (t) => Object.assign(document.createElement('span'), { textContent: t });
    li.append(text(CLASS_NAMES[k]), track, text(`${(100 * p).toFixed(1)}%`));
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

async function main() {
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.proxy = false;
  ort.env.wasm.wasmPaths = new URL('node_modules/onnxruntime-web/dist/', location.href).href;
  const session = await ort.InferenceSession.create(modelUrl, { executionProviders: ['wasm'] });
  const input = describeInput(session);
  document.body.dataset.inputName = input.name;
  document.body.dataset.inputShape = input.shape.join(',');
  const described =
    `${modelUrl}: input '${input.name}' (${input.shape.join(', ')}) float32; ` +
    `onnxruntime-web ${ort.env.versions.web}, wasm, 1 thread`;

  const pad = setUpPad($('pad'));
  $('clear').addEventListener('click', () => pad.clear());
  $('classify').addEventListener('click', async () => {
    const out = $('drawn-result');
    out.dataset.state = 'running';
    try {
      const pixels = pad.pixels();
      const [result] = await classify(session, input, [pixels]);
      showDrawnResult(result, pixels);
    } catch (e) {
      out.dataset.state = 'error';
      out.textContent = `Error: ${e.message}`;
    }
  });
  $('classify').disabled = false;
  setState('ready', `Model ${described}. Classifying the test images...`);

  const samples = await loadSamples();
  const grid = $('samples');
  if (samples.length === 0) {
    grid.textContent = `No test images (${samplesUrl} is missing; make one with make_samples.js).`;
  } else {
    const t0 = performance.now();
    const results = await classify(session, input, samples.map((s) => s.pixels));
    const ms = performance.now() - t0;
    const pick = (sample) => drawPixels($('pad'), sample.pixels);
    samples.forEach((s, i) => grid.append(sampleCard(s, results[i], pick)));
    const right = results.filter((r, i) => r.cls === samples[i].label).length;
    document.body.dataset.correct = right;
    setState('done', `Model ${described}. ${samples.length} test images in ${ms.toFixed(0)} ms, ${right} right.`);
    return;
  }
  setState('done', `Model ${described}.`);
}

main().catch((e) => {
  document.body.dataset.error = e.message;
  setState('error', `Error: ${e.message}`);
  console.error(e);
});
