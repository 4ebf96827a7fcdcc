// Debian's Chromium under playwright-core, one browser per test file, one context per test. Every page of
// every test is watched: a console error, an uncaught page error or a CSP violation fails the test (unless
// the test names that exact message as expected); requests leaving loopback are blocked; on failure each
// open page is saved as a screenshot in a temp dir whose path is printed.
// covers: S6

import { chromium } from 'playwright-core';
import { mkdtemp } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after } from 'node:test';

export const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
/** Bound of every single wait in the browser (navigation, locator, expectation). */
export const STEP_TIMEOUT = 20000;

let browserPromise = null;

/** The shared browser of this test file (closed after the file's tests). */
export function browser() {
  browserPromise ??= chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    timeout: 60000,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  return browserPromise;
}

after(async () => {
  if (browserPromise) await (await browserPromise).close().catch(() => {});
});

/** Hosts a test's pages may reach: loopback only. */
function loopback(url) {
  try {
    const u = new URL(url);
    if (u.protocol === 'data:' || u.protocol === 'about:' || u.protocol === 'blob:') return true;
    return ['127.0.0.1', '127.0.0.2', 'localhost', '[::1]'].includes(u.hostname);
  } catch {
    return false;
  }
}

// Runs in every document before its own scripts: CSP violations are reported to the test.
const INIT = `document.addEventListener('securitypolicyviolation', (e) => {
  try { window.__agentholdReport(JSON.stringify({directive: e.violatedDirective, blocked: e.blockedURI,
    source: e.sourceFile, line: e.lineNumber, sample: e.sample, page: location.href})); } catch (_) {}
}, true);`;

/**
 * Run `fn({context, page, newPage, expect, foreign, problems, blocked})` in a fresh context. `expect(re)`
 * marks a console message matching `re` as expected (it does not fail the test); `foreign(origin)` names a
 * provider's origin whose pages may have their internet requests blocked quietly (their fonts). Checks
 * problems at the end.
 * Options: `viewport`, `cookies` (added before the first page), `screenshots: false` (a test that expects
 * the failure).
 */
export async function withPage(t, fn, { viewport = { width: 1280, height: 800 }, cookies = [], screenshots = true } = {}) {
  const b = await browser();
  const context = await b.newContext({ viewport });
  context.setDefaultTimeout(STEP_TIMEOUT);
  context.setDefaultNavigationTimeout(STEP_TIMEOUT);
  const problems = [];
  // The app asks who is signed in when it starts; signed out, that is a 401 the browser logs.
  const expected = [/status of 401 \(Unauthorized\) \(http:\/\/127\.0\.0\.1:\d+\/api\/v1\/me\)$/];
  const blocked = [];
  const pages = [];
  const foreign = [];
  await context.exposeBinding('__agentholdReport', ({ page }, json) => {
    problems.push(`CSP violation on ${page?.url()}: ${json}`);
  });
  await context.addInitScript(INIT);
  await context.route('**/*', (route) => {
    const url = route.request().url();
    if (loopback(url)) return route.continue();
    blocked.push(url);
    return route.abort('blockedbyclient');
  });
  if (cookies.length) await context.addCookies(cookies);
  const watch = (page) => {
    pages.push(page);
    page.on('console', (msg) => {
      if (msg.type() !== 'error') return;
      const text = `${msg.text()} (${msg.location()?.url ?? ''})`;
      if (expected.some((re) => re.test(text))) return;
      // Pages of the test's providers (not ours) may try to load fonts from the internet, which is blocked.
      if (/ERR_BLOCKED_BY_CLIENT/.test(text) && foreign.some((o) => page.url().startsWith(o))) return;
      problems.push(`console error on ${page.url()}: ${text}`);
    });
    page.on('pageerror', (err) => problems.push(`page error on ${page.url()}: ${err?.stack ?? err}`));
  };
  context.on('page', watch);
  const newPage = () => context.newPage();
  const page = await newPage();
  try {
    await fn({ context, page, newPage, expect: (re) => expected.push(re), foreign: (o) => foreign.push(o), problems, blocked });
    // Late reports (a violation fired while the test finished) still count.
    await new Promise((r) => setTimeout(r, 200));
    if (problems.length) throw new Error(`the browser reported problems:\n  ${problems.join('\n  ')}`);
  } catch (err) {
    if (!screenshots) throw err;
    const dir = await mkdtemp(path.join(os.tmpdir(), 'agenthold-shots-'));
    let i = 0;
    for (const p of pages) {
      if (p.isClosed()) continue;
      const file = path.join(dir, `${safe(t?.name ?? 'test')}-${i++}.png`);
      await p.screenshot({ path: file, fullPage: true, timeout: 10000 }).catch(() => {});
      console.error(`# screenshot of ${p.url()}: ${file}`);
    }
    if (problems.length && !String(err.message).includes('the browser reported problems')) {
      err.message += `\nthe browser also reported:\n  ${problems.join('\n  ')}`;
    }
    throw err;
  } finally {
    await context.close().catch(() => {});
  }
}

function safe(s) {
  return s.replace(/[^a-zA-Z0-9_-]+/g, '_').slice(0, 80);
}

/** The session cookie for `base` as playwright wants it. */
export function sessionCookie(base, value, name = 'agenthold_session') {
  return { name, value, url: base, httpOnly: true, sameSite: 'Lax' };
}

/** Poll `fn` in node until truthy (bounded). */
export { until } from './server.js';
