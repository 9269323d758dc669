// Opens the classifier page in headless Chromium and prints what it shows.
//   node test/browser_check.js --data DIR [--output FILE.json] [--screenshot FILE.png]
//        [--texts FILE.json] [--chromium /usr/bin/chromium] [--timeout_ms 40000]
// DIR holds model.onnx and samples.json, or text_model.onnx and
// text_labels.json, or all four. Serves the page on a free loopback port
// (serve.js, in this process), loads it with playwright-core driving
// Debian's chromium, waits (polling the DOM) for <body data-state> to be
// "done". With the image model: draws a stroke over the first test image on
// the pad and presses Classify. With the text model: types each sentence of
// --texts (a JSON array of strings) into the text box and presses Classify
// text. Then writes one JSON line to --output (default: stdout):
//   {"samples": [{"index", "predicted_class", "predicted_label", "probability"}, ...],
//    "drawn": {"pixels": [784 bytes], "predicted_class", "predicted_label", "probability"},
//    "texts": [{"text", "predicted_class", "predicted_label", "probability"}, ...],
//    "status": "<the page's status line>"}
// ("samples" and "drawn" with the image model, "texts" with the text model).
// Exit 0 on success, 1 when the page reports an error or times out, 2 on bad
// usage. --chromium defaults to $KILN_CHROMIUM, else /usr/bin/chromium.
// The browser and the server are closed on every path; a watchdog ends the
// process if closing them hangs.
'use strict';
const fs = require('fs');
const path = require('path');
const { chromium } = require('playwright-core');
const { start } = require('../serve.js');

function usage(message) {
  const e = new Error(
    `${message}; usage: node browser_check.js --data DIR [--output FILE] [--screenshot FILE] ` +
      '[--texts FILE] [--chromium PATH] [--timeout_ms N]',
  );
  e.exitCode = 2;
  return e;
}

function parseArgs(argv) {
  const o = { chromium: process.env.KILN_CHROMIUM || '/usr/bin/chromium', timeout_ms: 40000 };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!['data', 'output', 'screenshot', 'texts', 'chromium', 'timeout_ms'].includes(key) || argv[i + 1] === undefined)
      throw usage(`bad option ${argv[i]}`);
    o[key] = key === 'timeout_ms' ? Number(argv[i + 1]) : argv[i + 1];
  }
  if (!o.data) throw usage('--data DIR is required');
  if (!(o.timeout_ms > 0)) throw usage(`--timeout_ms must be a positive number. Received: ${o.timeout_ms}`);
  return o;
}

async function check(o, page, url) {
  page.on('console', (m) => process.stderr.write(`browser console ${m.type()}: ${m.text()}\n`));
  page.on('pageerror', (e) => process.stderr.write(`browser page error: ${e.message}\n`));
  await page.goto(url, { timeout: o.timeout_ms });
  await page.waitForFunction(() => ['done', 'error'].includes(document.body.dataset.state), null, {
    timeout: o.timeout_ms,
    polling: 50,
  });
  const status = await page.textContent('#status');
  if ((await page.getAttribute('body', 'data-state')) === 'error') throw new Error(`the page says: ${status}`);
  const models = ((await page.getAttribute('body', 'data-models')) || '').split(',');
  const result = { status };
  if (models.includes('text')) result.texts = await typeTexts(o, page);
  if (models.includes('image')) Object.assign(result, await checkImages(o, page));
  if (o.screenshot) await page.screenshot({ path: o.screenshot, fullPage: true });
  return result;
}

// Types each sentence of --texts into the text box and classifies it.
async function typeTexts(o, page) {
  const texts = o.texts ? JSON.parse(fs.readFileSync(o.texts, 'utf8')) : [];
  const shown = [];
  for (const text of texts) {
    await page.fill('#text-input', text);
    await page.click('#classify-text');
    await page.waitForFunction(
      () => ['done', 'error'].includes(document.getElementById('text-result').dataset.state),
      null,
      { timeout: o.timeout_ms, polling: 50 },
    );
    const r = await page.$eval('#text-result', (e) => ({ ...e.dataset, shown: e.textContent }));
    if (r.state !== 'done') throw new Error(`classifying the text ${JSON.stringify(text)} failed: ${r.shown}`);
    shown.push({
      text: r.text,
      predicted_class: Number(r.predictedClass),
      predicted_label: r.predictedLabel,
      probability: Number(r.probability),
    });
  }
  return shown;
}

// The image model's test images, and a stroke drawn on the pad.
async function checkImages(o, page) {
  const samples = await page.$$eval('.sample', (figs) =>
    figs.map((f) => ({
      index: Number(f.dataset.index),
      predicted_class: Number(f.dataset.predictedClass),
      predicted_label: f.dataset.predictedLabel,
      probability: Number(f.dataset.probability),
    })),
  );

  // The pad: the first test image, a stroke drawn over it with the mouse, Classify.
  if (samples.length > 0) await page.click('.sample');
  const box = await page.locator('#pad').boundingBox();
  await page.mouse.move(box.x + box.width * 0.3, box.y + box.height * 0.2);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.5, box.y + box.height * 0.6, { steps: 8 });
  await page.mouse.move(box.x + box.width * 0.7, box.y + box.height * 0.3, { steps: 8 });
  await page.mouse.up();
  await page.click('#classify');
  const padDone = () => ['done', 'error'].includes(document.getElementById('drawn-result').dataset.state);
  await page.waitForFunction(padDone, null, {
    timeout: o.timeout_ms,
    polling: 50,
  });
  const drawn = await page.$eval('#drawn-result', (e) => ({ ...e.dataset, text: e.textContent }));
  if (drawn.state !== 'done') throw new Error(`classifying the pad failed: ${drawn.text}`);
  return {
    samples,
    drawn: {
      pixels: drawn.pixels.split(',').map(Number),
      predicted_class: Number(drawn.predictedClass),
      predicted_label: drawn.predictedLabel,
      probability: Number(drawn.probability),
    },
  };
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  // Whatever happens below, the process ends: closing a wedged browser must not hang the test.
  setTimeout(() => {
    process.stderr.write(`browser_check.js: still running after ${o.timeout_ms + 15000} ms; exiting\n`);
    process.exit(1);
  }, o.timeout_ms + 15000).unref();
  const { server, url } = await start({ port: 0, data: path.resolve(o.data) });
  let browser;
  try {
    browser = await chromium.launch({ executablePath: o.chromium, headless: true, timeout: o.timeout_ms });
    const page = await browser.newPage({ viewport: { width: 1320, height: 640 }, deviceScaleFactor: 1 });
    const result = JSON.stringify(await check(o, page, url)) + '\n';
    if (o.output) fs.writeFileSync(o.output, result);
    else process.stdout.write(result);
  } finally {
    if (browser) await browser.close();
    server.closeAllConnections();
    server.close();
  }
}

main().catch((e) => {
  process.stderr.write(`browser_check.js: ${e.message}\n`);
  process.exitCode = e.exitCode || 1;
});
