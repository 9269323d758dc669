// A small static file server for the classifier page, loopback only.
//   node serve.js [--port 8080] [--host 127.0.0.1] [--data DIR]
// Serves this folder (the page and node_modules/onnxruntime-web/dist) at /
// and DIR (default: the current directory; model.onnx, samples.json) at
// /data/. GET and HEAD only; paths that leave either folder are 404.
// --port 0 picks a free port; the first stdout line is the page's URL.
// Also a module: start({ port, host, data }) resolves to { server, url }.
'use strict';
const fs = require('fs');
const http = require('http');
const path = require('path');

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.wasm': 'application/wasm', // WebAssembly.instantiateStreaming insists on it
  '.onnx': 'application/octet-stream',
  '.png': 'image/png',
  '.map': 'application/json',
};

// The file a URL path names under `root`, or null when it would leave it.
function resolveUnder(root, urlPath) {
  const file = path.resolve(root, '.' + path.posix.normalize('/' + urlPath));
  return file === root || file.startsWith(root + path.sep) ? file : null;
}

function handler(pageRoot, dataRoot) {
  return (req, res) => {
    const send = (code, type, body) => {
      res.writeHead(code, { 'Content-Type': type, 'Cache-Control': 'no-store' });
      res.end(req.method === 'HEAD' ? undefined : body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, 'text/plain', 'GET or HEAD only\n');
    let urlPath;
    try {
      urlPath = decodeURIComponent(new URL(req.url, 'http://localhost').pathname);
    } catch (e) {
      return send(400, 'text/plain', 'bad path\n');
    }
    if (urlPath.endsWith('/')) urlPath += 'index.html';
    const file = urlPath.startsWith('/data/')
      ? resolveUnder(dataRoot, urlPath.slice('/data'.length))
      : resolveUnder(pageRoot, urlPath);
    if (!file) return send(404, 'text/plain', 'not found\n');
    fs.readFile(file, (err, body) => {
      if (err) return send(404, 'text/plain', `not found: ${urlPath}\n`);
      send(200, TYPES[path.extname(file)] || 'application/octet-stream', body);
    });
  };
}

function start({ port = 8080, host = '127.0.0.1', data = process.cwd() } = {}) {
  const server = http.createServer(handler(path.resolve(__dirname), path.resolve(data)));
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      const a = server.address();
      resolve({ server, url: `http://${host}:${a.port}/` });
    });
  });
}

function parseArgs(argv) {
  const o = {};
  for (let i = 0; i < argv.length; i += 2) {
    const [key, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${key} needs a value`);
    if (key === '--port') o.port = Number(value);
    else if (key === '--host') o.host = value;
    else if (key === '--data') o.data = value;
    else throw new Error(`unknown option ${key}; usage: node serve.js [--port N] [--host H] [--data DIR]`);
  }
  if (o.port !== undefined && !(Number.isInteger(o.port) && o.port >= 0 && o.port < 65536))
    throw new Error(`--port must be an integer in [0, 65535]. Received: ${o.port}`);
  return o;
}

if (require.main === module) {
  start(parseArgs(process.argv.slice(2)))
    .then(({ url }) => process.stdout.write(`${url}\n`))
    .catch((e) => {
      process.stderr.write(`serve.js: ${e.message}\n`);
      process.exit(2);
    });
}

module.exports = { start };
