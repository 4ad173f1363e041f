#!/usr/bin/env node
// browser.mjs — drive headless Chromium over its DevTools port for the course decks.
//
//   node browser.mjs pdf   OUT_DIR  DECK.html...   print each deck to OUT_DIR/NAME.pdf, one page per slide
//   node browser.mjs check SHOT_DIR DECK.html...   open every slide of every deck: fail on console
//                                                  errors, failed loads, broken images and content
//                                                  that overflows its slide; screenshot each slide
//                                                  to SHOT_DIR/NAME/NN.png
// Environment: CHROMIUM (default /usr/bin/chromium).
//
// Why not `chromium --print-to-pdf deck.html?print-pdf`: reveal.js lays the slides out for print
// in JavaScript after load, and the command-line print does not wait for it (a blank page).
// Here we wait until reveal.js reports ready and its .pdf-page elements exist, then print.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const WebSocket = require("ws");

const W = 1280, H = 720;  // the decks' slide size (slides/tools/build.py)

function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }

async function launch() {
  const exe = process.env.CHROMIUM || "/usr/bin/chromium";
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "kit-chromium-"));
  const proc = spawn(exe, [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--allow-file-access-from-files",
    `--user-data-dir=${profile}`, "--remote-debugging-port=0", `--window-size=${W},${H}`,
    "about:blank",
  ], { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (d) => { stderr += d; });
  const portFile = path.join(profile, "DevToolsActivePort");
  for (let i = 0; i < 600 && !fs.existsSync(portFile); i++) {
    if (proc.exitCode !== null) break;
    await sleep(100);
  }
  if (!fs.existsSync(portFile)) {
    proc.kill("SIGKILL");
    throw new Error(`chromium (${exe}) did not open its DevTools port:\n${stderr.slice(-2000)}`);
  }
  let text = "";
  for (let i = 0; i < 50 && text.split("\n").length < 2; i++) {
    text = fs.readFileSync(portFile, "utf8");
    if (text.split("\n").length < 2) await sleep(100);
  }
  const [port, wsPath] = text.trim().split("\n");
  const ws = new WebSocket(`ws://127.0.0.1:${port}${wsPath}`, { perMessageDeflate: false, maxPayload: 512 << 20 });
  await new Promise((res, rej) => { ws.once("open", res); ws.once("error", rej); });
  let next = 1;
  const pending = new Map();
  const listeners = new Set();
  ws.on("message", (data) => {
    const msg = JSON.parse(data.toString());
    if (msg.id && pending.has(msg.id)) {
      const { res, rej, method } = pending.get(msg.id);
      pending.delete(msg.id);
      if (msg.error) rej(new Error(`${method}: ${msg.error.message}`));
      else res(msg.result);
    } else if (msg.method) {
      for (const l of listeners) l(msg);
    }
  });
  const send = (method, params = {}, sessionId) => new Promise((res, rej) => {
    const id = next++;
    pending.set(id, { res, rej, method });
    ws.send(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }));
  });
  const close = async () => {
    try { await send("Browser.close"); } catch { /* already gone */ }
    await Promise.race([new Promise((r) => proc.once("exit", r)), sleep(3000)]);
    if (proc.exitCode === null) proc.kill("SIGKILL");
    ws.terminate();
    fs.rmSync(profile, { recursive: true, force: true });
  };
  return { send, listeners, close };
}

async function openPage(browser) {
  const { targetId } = await browser.send("Target.createTarget", { url: "about:blank" });
  const { sessionId } = await browser.send("Target.attachToTarget", { targetId, flatten: true });
  const problems = [];
  const waiters = [];
  const listener = (msg) => {
    if (msg.sessionId !== sessionId) return;
    const p = msg.params;
    switch (msg.method) {
      case "Runtime.consoleAPICalled":
        if (p.type === "error" || p.type === "assert")
          problems.push(`console.${p.type}: ${p.args.map((a) => a.value ?? a.description).join(" ")}`);
        break;
      case "Runtime.exceptionThrown":
        problems.push(`exception: ${p.exceptionDetails.exception?.description || p.exceptionDetails.text}`);
        break;
      case "Log.entryAdded":
        if (p.entry.level === "error") problems.push(`log: ${p.entry.text} ${p.entry.url || ""}`);
        break;
      case "Network.loadingFailed":
        if (!p.canceled) problems.push(`failed to load ${p.requestId}: ${p.errorText}`);
        break;
      case "Network.responseReceived":
        if (p.response.status >= 400) problems.push(`HTTP ${p.response.status}: ${p.response.url}`);
        break;
    }
    for (const w of waiters.splice(0)) w(msg);
  };
  browser.listeners.add(listener);
  const send = (m, params) => browser.send(m, params, sessionId);
  for (const domain of ["Page", "Runtime", "Log", "Network"]) await send(`${domain}.enable`);
  await send("Emulation.setDeviceMetricsOverride", { width: W, height: H, deviceScaleFactor: 1, mobile: false });
  const evaluate = async (expression) => {
    const r = await send("Runtime.evaluate", { expression, awaitPromise: true, returnByValue: true });
    if (r.exceptionDetails) throw new Error(`evaluate ${expression}: ${r.exceptionDetails.text}`);
    return r.result.value;
  };
  const navigate = async (url) => {
    const loaded = new Promise((res) => {
      const check = (msg) => (msg.method === "Page.loadEventFired" ? res() : waiters.push(check));
      waiters.push(check);
    });
    const r = await send("Page.navigate", { url });
    if (r.errorText) throw new Error(`cannot open ${url}: ${r.errorText}`);
    // 90 s each: slides.browser runs in ./kit test's lanes, beside another test on 2 cores.
    await Promise.race([loaded, sleep(90000).then(() => { throw new Error(`timeout loading ${url}`); })]);
    for (let i = 0; i < 900; i++) {
      if (await evaluate("typeof Reveal !== 'undefined' && Reveal.isReady()")) break;
      if (i === 899) throw new Error(`reveal.js never became ready in ${url}`);
      await sleep(100);
    }
    await evaluate("document.fonts.ready.then(() => true)");
  };
  const close = async () => {
    browser.listeners.delete(listener);
    await browser.send("Target.closeTarget", { targetId });
  };
  return { send, evaluate, navigate, problems, close };
}

const settle = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))";

// What is wrong with the slide on screen: overflowing content, code wider than its box, images
// that did not load.
const inspect = `(() => {
  const s = Reveal.getCurrentSlide(), out = [];
  const h = Reveal.getConfig().height, w = Reveal.getConfig().width;
  if (s.scrollHeight > h + 2) out.push('content is ' + s.scrollHeight + 'px high, the slide ' + h + 'px');
  for (const el of s.querySelectorAll('pre code, table, img, svg, p, li')) {
    const r = el.getBoundingClientRect(), box = s.getBoundingClientRect();
    if (el.scrollWidth > el.clientWidth + 2 && el.matches('pre code'))
      out.push('code wider than its box (' + el.scrollWidth + ' > ' + el.clientWidth + 'px): ' + el.textContent.slice(0, 50));
    if (r.right > box.right + 4 * Reveal.getScale()) out.push(el.tagName + ' sticks out on the right: ' + (el.textContent || el.src || '').slice(0, 50));
  }
  for (const img of s.querySelectorAll('img'))
    if (!img.complete || img.naturalWidth === 0) out.push('image did not load: ' + img.getAttribute('src').slice(0, 80));
  return out;
})()`;

async function checkDeck(browser, file, shotDir) {
  const page = await openPage(browser);
  const name = path.basename(file, ".html");
  const issues = [];
  try {
    await page.navigate(pathToFileURL(file).href);
    const slides = await page.evaluate("Reveal.getSlides().map(s => Reveal.getIndices(s))");
    const total = await page.evaluate("Reveal.getTotalSlides()");
    if (shotDir) fs.mkdirSync(path.join(shotDir, name), { recursive: true });
    for (let i = 0; i < slides.length; i++) {
      const { h, v } = slides[i];
      await page.evaluate(`Reveal.slide(${h}, ${v || 0}); ${settle}`);
      const title = await page.evaluate("(Reveal.getCurrentSlide().querySelector('h1,h2') || {}).textContent || ''");
      for (const p of await page.evaluate(inspect)) issues.push(`${name} slide ${i + 1} (${title}): ${p}`);
      if (shotDir) {
        const { data } = await page.send("Page.captureScreenshot", { format: "png" });
        fs.writeFileSync(path.join(shotDir, name, `${String(i + 1).padStart(2, "0")}.png`), Buffer.from(data, "base64"));
      }
    }
    await page.evaluate(settle);
    for (const p of page.problems) issues.push(`${name}: ${p}`);
    return { name, slides: total, issues };
  } finally {
    await page.close();
  }
}

async function printDeck(browser, file, outDir) {
  const page = await openPage(browser);
  const name = path.basename(file, ".html");
  try {
    await page.navigate(pathToFileURL(file).href + "?print-pdf");
    let pages = 0;
    for (let i = 0; i < 200 && !pages; i++) {
      pages = await page.evaluate("document.querySelectorAll('.pdf-page').length");
      if (!pages) await sleep(100);
    }
    if (!pages) throw new Error(`${name}: reveal.js did not lay out the print pages`);
    await page.evaluate(`Promise.all([...document.images].map(i => i.complete ? 1 : new Promise(r => { i.onload = i.onerror = r; })))`);
    await page.evaluate(settle);
    const { data } = await page.send("Page.printToPDF", {
      preferCSSPageSize: true, printBackground: true, marginTop: 0, marginBottom: 0,
      marginLeft: 0, marginRight: 0,
    });
    fs.mkdirSync(outDir, { recursive: true });
    fs.writeFileSync(path.join(outDir, `${name}.pdf`), Buffer.from(data, "base64"));
    if (page.problems.length) throw new Error(`${name} (print): ${page.problems.join("; ")}`);
    return { name, pages };
  } finally {
    await page.close();
  }
}

async function main() {
  const [cmd, dir, ...files] = process.argv.slice(2);
  if (!["pdf", "check"].includes(cmd) || !dir || !files.length) {
    console.error("usage: browser.mjs pdf OUT_DIR DECK.html... | browser.mjs check SHOT_DIR DECK.html...");
    process.exit(2);
  }
  const browser = await launch();
  let failed = false;
  try {
    for (const f of files) {
      const file = path.resolve(f);
      if (cmd === "pdf") {
        const r = await printDeck(browser, file, dir);
        console.log(`${r.name}: ${r.pages} slides -> ${path.join(dir, r.name + ".pdf")}`);
      } else {
        const r = await checkDeck(browser, file, dir === "-" ? null : dir);
        console.log(`${r.name}: ${r.slides} slides opened, ${r.issues.length} problems`);
        for (const i of r.issues) console.log(`  ${i}`);
        if (r.issues.length) failed = true;
      }
    }
  } finally {
    await browser.close();
  }
  process.exit(failed ? 1 : 0);
}

main().catch((e) => { console.error(`browser.mjs: ${e.message}`); process.exit(1); });
