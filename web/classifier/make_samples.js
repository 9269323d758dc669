// Writes test-set images for the page: real Fashion-MNIST t10k images.
//   node make_samples.js [--count 16] [--start 0] [--dir DIR] [--output samples.json]
// Takes `count` images evenly spaced from index `start` of the 10,000 test
// images. DIR: $KILN_FASHION_MNIST_DIR or /usr/share/datasets/fashion-mnist
// (Debian's dataset-fashion-mnist), with the IDX files gzipped or not.
// Output: {"source": ..., "images": [{"index": i, "label": y, "pixels": [784 bytes]}, ...]}
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');

function readIdx(dir, name) {
  for (const file of [path.join(dir, name + '.gz'), path.join(dir, name)]) {
    if (fs.existsSync(file)) {
      const raw = fs.readFileSync(file);
      return file.endsWith('.gz') ? zlib.gunzipSync(raw) : raw;
    }
  }
  throw new Error(`${name}(.gz) not found in ${dir} (apt-get install dataset-fashion-mnist)`);
}

// IDX: a big-endian magic (0, 0, type 0x08 = uint8, rank), then the dims.
function idxDims(buf, name) {
  if (buf.length < 4 || buf[0] !== 0 || buf[1] !== 0 || buf[2] !== 0x08)
    throw new Error(`${name}: not a uint8 IDX file`);
  const dims = [];
  for (let k = 0; k < buf[3]; ++k) dims.push(buf.readUInt32BE(4 + 4 * k));
  return { dims, offset: 4 + 4 * buf[3] };
}

function main() {
  const o = { count: 16, start: 0, output: 'samples.json' };
  o.dir = process.env.KILN_FASHION_MNIST_DIR || '/usr/share/datasets/fashion-mnist';
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!(key in o) || argv[i + 1] === undefined)
      throw new Error(
        `bad option ${argv[i]}; usage: node make_samples.js [--count N] [--start I] [--dir DIR] [--output FILE]`,
      );
    o[key] = key === 'count' || key === 'start' ? Number(argv[i + 1]) : argv[i + 1];
  }
  const images = readIdx(o.dir, 't10k-images-idx3-ubyte');
  const labels = readIdx(o.dir, 't10k-labels-idx1-ubyte');
  const x = idxDims(images, 't10k-images');
  const y = idxDims(labels, 't10k-labels');
  const [n, h, w] = x.dims;
  if (x.dims.length !== 3 || h !== 28 || w !== 28 || y.dims.length !== 1 || y.dims[0] !== n)
    throw new Error(`expected (N, 28, 28) images and N labels. Received: images ${x.dims}, labels ${y.dims}`);
  const fits = Number.isInteger(o.count) && Number.isInteger(o.start) && o.count >= 1 && o.start >= 0;
  if (!(fits && o.start + o.count <= n))
    throw new Error(`--count and --start must pick images in [0, ${n}). Received: count=${o.count}, start=${o.start}`);
  const step = Math.floor((n - o.start) / o.count);
  const out = { source: `Fashion-MNIST test set (t10k), ${path.resolve(o.dir)}`, images: [] };
  for (let k = 0; k < o.count; ++k) {
    const index = o.start + k * step;
    const at = x.offset + index * 784;
    out.images.push({ index, label: labels[y.offset + index], pixels: Array.from(images.subarray(at, at + 784)) });
  }
  fs.writeFileSync(o.output, JSON.stringify(out));
}

try {
  main();
} catch (e) {
  process.stderr.write(`make_samples.js: ${e.message}\n`);
  process.exit(2);
}
