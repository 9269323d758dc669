// Runs an ONNX model with ONNX Runtime (CPU) and prints its outputs as JSON.
//   node run.js model.onnx inputs.json
// inputs.json: {"<input name>": {"dtype": "float32"|"int64"|"int32", "shape": [...], "data": [...]}, ...}
// stdout:      {"<output name>": {"shape": [...], "data": [...]}, ...}
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

const ARRAYS = { float32: Float32Array, int32: Int32Array, int64: BigInt64Array };

async function main() {
  const [modelPath, inputsPath] = process.argv.slice(2);
  if (!modelPath || !inputsPath) throw new Error('usage: node run.js model.onnx inputs.json');
  const spec = JSON.parse(fs.readFileSync(inputsPath, 'utf8'));
  const session = await ort.InferenceSession.create(modelPath, { intraOpNumThreads: 1 });
  const feeds = {};
  for (const [name, t] of Object.entries(spec)) {
    const Arr = ARRAYS[t.dtype || 'float32'];
    if (!Arr) throw new Error(`input ${name}: unsupported dtype ${t.dtype}`);
    const data = t.dtype === 'int64' ? Arr.from(t.data.map((v) => BigInt(v))) : Arr.from(t.data);
    feeds[name] = new ort.Tensor(t.dtype || 'float32', data, t.shape);
  }
  const results = await session.run(feeds);
  const out = {};
  for (const name of session.outputNames) {
    const r = results[name];
    out[name] = { shape: r.dims.map(Number), data: Array.from(r.data, Number) };
  }
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((e) => {
  process.stderr.write(`onnx-check: ${e.message}\n`);
  process.exit(1);
});
