// The browser boundary (S6) seen from a real browser: security headers and CSP on the UI pages, a fresh
// style nonce per terminal page, the session cookie's flags, and another origin's page that tries to act with
// the user's cookie (a form POST, a credentialed fetch, a WebSocket to the terminal).

import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { withPage } from '../lib/browser.js';
import { Server, fetchT, until } from '../lib/server.js';
import { startOtherOrigin } from '../lib/providers.js';
import { localAdmin, localLogin, wsFromPage, consoleLog } from '../lib/flows.js';

const UI_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

let server;
const started = () => (server ??= Server.start());
after(async () => server && (await server).stop());

function assertHeaders(path, h) {
  assert.equal(h.get('x-frame-options'), 'DENY', `${path}: X-Frame-Options`);
  assert.equal(h.get('x-content-type-options'), 'nosniff', `${path}: nosniff`);
  assert.equal(h.get('referrer-policy'), 'no-referrer', `${path}: Referrer-Policy`);
  const csp = h.get('content-security-policy') ?? '';
  assert.ok(csp.includes("frame-ancestors 'none'"), `${path}: CSP ${csp}`);
  assert.ok(!csp.includes('unsafe-inline') && !csp.includes('unsafe-eval'), `${path}: CSP ${csp}`);
  return csp;
}

// covers: S6
test('UI pages carry the CSP and the security headers; the terminal page a fresh nonce each time', async (t) => {
  const s = await started();
  for (const path of ['/', '/login', '/tokens', '/w/x', '/w/x/agents/new', '/w/x/agents/y']) {
    const r = await fetchT(`${s.base}${path}`);
    assert.equal(r.status, 200, path);
    assert.equal(assertHeaders(path, r.headers), UI_CSP, `${path}: the UI's CSP exactly`);
  }
  for (const path of ['/login/local', '/api/v1/openapi.json', '/auth/providers']) {
    const r = await fetchT(`${s.base}${path}`);
    assertHeaders(path, r.headers);
  }
  const terminal = '/w/x/agents/y/terminal';
  const nonces = [];
  for (let i = 0; i < 2; i++) {
    const r = await fetchT(`${s.base}${terminal}`);
    const csp = assertHeaders(terminal, r.headers);
    const m = /style-src-elem 'self' 'nonce-([A-Za-z0-9+/=_-]+)'/.exec(csp);
    assert.ok(m, `terminal CSP has a style nonce: ${csp}`);
    assert.ok(csp.startsWith(UI_CSP), csp);
    const html = await r.text();
    assert.ok(html.includes(`<meta name="csp-nonce" content="${m[1]}">`), 'the page carries the same nonce');
    nonces.push(m[1]);
  }
  assert.notEqual(nonces[0], nonces[1], 'a nonce per response');
  assert.ok(nonces[0].length >= 16);

  // In the browser: the pages load without a CSP violation, console error or page error (withPage checks).
  await withPage(t, async ({ page }) => {
    // Signed out, both end on the sign-in page.
    for (const path of ['/login', '/']) {
      const resp = await page.goto(`${s.base}${path}`);
      assert.ok(resp.ok(), `${path}: ${resp.status()}`);
      await page.getByRole('heading').first().waitFor();
      await page.waitForURL((u) => u.pathname === '/login');
    }
  });
});

// covers: S6
test('the session cookie is HttpOnly and SameSite=Lax and not readable by scripts', async (t) => {
  const s = await started();
  await withPage(t, async ({ page, context }) => {
    await localLogin(page, s);
    const cookies = await context.cookies(s.base);
    const session = cookies.find((c) => c.name === 'agenthold_session');
    assert.ok(session, `a session cookie: ${JSON.stringify(cookies)}`);
    assert.equal(session.httpOnly, true);
    assert.equal(session.sameSite, 'Lax');
    assert.equal(session.path, '/');
    assert.equal(session.secure, false, 'plain http public URL: no Secure flag (the __Host- name is for https)');
    assert.ok(session.value.length >= 40, '256-bit value');
    const visible = await page.evaluate(() => document.cookie);
    assert.ok(!visible.includes('agenthold_session'), `document.cookie: ${visible}`);
  });
});

// covers: S6
test('another origin cannot act with the user cookie: form POST, credentialed fetch, terminal WebSocket', async (t) => {
  const s = await started();
  await withPage(t, async ({ page, expect }) => {
    const admin = await localAdmin(page, s);
    const ws = await s.workspace(admin.token, 'mine');
    const agent = await s.agent(admin.token, ws, { name: 'xo', policy: { mode: 'open' } });
    const target = `${s.base}/api/v1/workspaces`;
    const wsUrl = `${s.base.replace('http:', 'ws:')}/api/v1/workspaces/${ws}/agents/${agent}/terminal`;
    const form = (name) =>
      `<!doctype html><title>elsewhere</title><form id=f method=post action="${target}" enctype="text/plain">` +
      `<input name='{"name":"${name}","x":"' value='"}'></form>`;
    // The same site on another port (SameSite=Lax sends the cookie: the origin check alone must refuse),
    // and another site (localhost).
    const sameSite = await startOtherOrigin('127.0.0.1', { '/': form('evil-same-site') });
    const crossSite = await startOtherOrigin('localhost', { '/': form('evil-cross-site') });
    // Expected noise of refused attempts.
    expect(/status of 40[134]/);
    expect(/WebSocket connection to .* failed/);
    expect(/blocked by CORS policy|Access-Control-Allow-Origin/);
    expect(/Failed to load resource: net::ERR_FAILED/);
    try {
      for (const other of [sameSite, crossSite]) {
        const log = consoleLog(page);
        await page.goto(`${other.origin}/`);
        // 1. A form POST (text/plain JSON, the classic CSRF shape).
        const [resp] = await Promise.all([
          page.waitForResponse((r) => r.url() === target),
          page.evaluate(() => document.getElementById('f').submit()),
        ]);
        await page.waitForURL(target);
        await page.waitForLoadState('load');
        assert.ok([401, 403].includes(resp.status()), `${other.origin} form POST: ${resp.status()}`);
        if (other === sameSite) assert.equal(resp.status(), 403, 'refused for its origin, though the cookie was sent');
        // 2. fetch with credentials (no-cors: the request is sent, the answer opaque).
        await page.goto(`${other.origin}/`);
        const seen = page.waitForResponse((r) => r.url() === target && r.request().method() === 'POST');
        await page.evaluate(async (u) => {
          try {
            await fetch(u, { method: 'POST', credentials: 'include', mode: 'no-cors', headers: { 'Content-Type': 'text/plain' }, body: '{"name":"evil-fetch"}' });
          } catch {
            /* refused either way */
          }
        }, target);
        const fr = await seen;
        assert.ok([401, 403].includes(fr.status()), `${other.origin} fetch: ${fr.status()}`);
        // A CORS request with JSON needs a preflight, which the server does not grant.
        const cors = await page.evaluate(async (u) => {
          try {
            const r = await fetch(u, { method: 'POST', credentials: 'include', headers: { 'Content-Type': 'application/json' }, body: '{"name":"evil-cors"}' });
            return `status ${r.status}`;
          } catch (e) {
            return `refused ${e.name}`;
          }
        }, target);
        assert.match(cors, /^refused|^status 40[13]$/);
        // 3. The terminal WebSocket from the other origin fails (the server answers the upgrade 403).
        const result = await wsFromPage(page, wsUrl);
        assert.notEqual(result, 'open', `${other.origin} WebSocket must not open`);
        await until('the handshake refusal in the console', () => log.some((l) => /WebSocket connection .* failed/.test(l)), 5000);
        const why = log.find((l) => /WebSocket connection .* failed/.test(l));
        if (other === sameSite) assert.match(why, /403/, why);
      }
      // The server's own origin opens it (the refusals above were for the origin, not the agent).
      await page.goto(`${s.base}/`);
      assert.equal(await wsFromPage(page, wsUrl), 'open');
      // Nothing was created.
      const list = await s.api('GET', '/api/v1/workspaces', { token: admin.token });
      const names = (list.body.items ?? list.body).map((w) => w.name);
      assert.deepEqual(names.filter((n) => n.startsWith('evil')), [], JSON.stringify(list.body));
    } finally {
      await sameSite.stop();
      await crossSite.stop();
    }
  });
});

// covers: S6
test('the harness itself: an inline style, an inline script or a page error on a UI page fails the test', async (t) => {
  const s = await started();
  const attempt = (fn) =>
    withPage(t, async ({ page }) => {
      await page.goto(`${s.base}/login`);
      await page.getByRole('heading').first().waitFor();
      await page.evaluate(fn);
      await page.waitForTimeout(300);
    }, { screenshots: false });
  await assert.rejects(
    attempt(() => {
      const el = document.createElement('style');
      el.textContent = 'body { color: red }';
      document.head.append(el);
    }),
    /CSP violation.*style-src/s,
    'an injected <style> is refused by the CSP and reported',
  );
  await assert.rejects(
    attempt(() => {
      const el = document.createElement('script');
      el.textContent = 'window.x = 1';
      document.head.append(el);
    }),
    /CSP violation.*script-src/s,
    'an inline script is refused by the CSP and reported',
  );
  await assert.rejects(
    attempt(() => setTimeout(() => {
      throw new Error('boom from the page');
    }, 0)),
    /page error.*boom from the page/s,
  );
});
