// The test providers themselves: the OIDC provider refuses a wrong or missing PKCE verifier and a replayed
// code, and so does the GitHub stand-in. The login tests rely on this: a login that succeeds against them
// proves our server sent the right verifier.
// covers: S6

import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { withPage } from '../lib/browser.js';
import { startOidc, oidcLogin, startGithub, s256 } from '../lib/providers.js';
import { fetchT } from '../lib/server.js';

/** A callback endpoint that only records the query. */
async function callbackSink() {
  const hits = [];
  const server = http.createServer((req, res) => {
    hits.push(new URL(req.url, 'http://x').searchParams);
    res.writeHead(200, { 'Content-Type': 'text/plain' });
    res.end('ok');
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${server.address().port}/cb`, hits, stop: () => new Promise((r) => server.close(r)) };
}

async function token(oidc, redirectUri, code, verifier) {
  const body = new URLSearchParams({ grant_type: 'authorization_code', code, redirect_uri: redirectUri });
  if (verifier !== undefined) body.set('code_verifier', verifier);
  const r = await fetchT(`${oidc.issuer}/token`, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/x-www-form-urlencoded',
      Authorization: `Basic ${Buffer.from(`${oidc.clientId}:${oidc.clientSecret}`).toString('base64')}`,
    },
    body,
  });
  return { status: r.status, body: await r.json() };
}

test('oidc-provider requires PKCE and refuses a wrong verifier and a replayed code', async (t) => {
  const sink = await callbackSink();
  const oidc = await startOidc({ redirectUri: sink.url, accounts: { ada: { name: 'Ada L', email: 'ada@example.test' } } });
  try {
    await withPage(t, async ({ page, foreign }) => {
      foreign(oidc.issuer);
      const verifier = randomBytes(32).toString('hex');
      const q = (extra) =>
        new URLSearchParams({
          client_id: oidc.clientId,
          response_type: 'code',
          scope: 'openid email profile',
          redirect_uri: sink.url,
          state: 's1',
          nonce: 'n1',
          ...extra,
        });
      // Without a code_challenge the provider refuses the authorization request (back to the client).
      await page.goto(`${oidc.issuer}/auth?${q({})}`);
      await page.waitForURL((u) => u.href.startsWith(sink.url));
      assert.equal(sink.hits.at(-1).get('error'), 'invalid_request');

      const codeFor = async () => {
        await page.goto(`${oidc.issuer}/auth?${q({ code_challenge: s256(verifier), code_challenge_method: 'S256' })}`);
        if (!page.url().startsWith(sink.url)) await oidcLogin(page, oidc.issuer, 'ada');
        await page.waitForURL((u) => u.href.startsWith(sink.url));
        const code = sink.hits.at(-1).get('code');
        assert.ok(code, `a code: ${sink.hits.at(-1)}`);
        return code;
      };
      let code = await codeFor();
      let r = await token(oidc, sink.url, code, 'x'.repeat(43));
      assert.equal(r.body.error, 'invalid_grant', JSON.stringify(r.body));
      code = await codeFor();
      r = await token(oidc, sink.url, code, undefined);
      assert.ok(r.status >= 400, JSON.stringify(r.body));
      code = await codeFor();
      r = await token(oidc, sink.url, code, verifier);
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.ok(r.body.id_token);
      r = await token(oidc, sink.url, code, verifier);
      assert.equal(r.body.error, 'invalid_grant', 'a replayed code is refused');
    });
  } finally {
    await oidc.stop();
    await sink.stop();
  }
});

test('the GitHub stand-in checks the S256 verifier and refuses a replayed code', async () => {
  const gh = await startGithub();
  try {
    const verifier = randomBytes(32).toString('hex');
    const authorize = async () => {
      const u = new URL(`${gh.base}/login/oauth/authorize`);
      for (const [k, v] of Object.entries({
        client_id: gh.clientId,
        redirect_uri: 'http://127.0.0.1:9/cb',
        state: 'st',
        code_challenge: s256(verifier),
        code_challenge_method: 'S256',
      }))
        u.searchParams.set(k, v);
      const r = await fetchT(u.href);
      assert.equal(r.status, 302);
      return new URL(r.headers.get('location')).searchParams.get('code');
    };
    const exchange = async (code, v) => {
      const r = await fetchT(`${gh.base}/login/oauth/access_token`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/x-www-form-urlencoded', Accept: 'application/json' },
        body: new URLSearchParams({ client_id: gh.clientId, client_secret: gh.clientSecret, code, code_verifier: v, redirect_uri: 'http://127.0.0.1:9/cb' }),
      });
      return r.json();
    };
    assert.equal((await exchange(await authorize(), 'wrong')).error, 'bad_verification_code');
    const code = await authorize();
    const ok = await exchange(code, verifier);
    assert.ok(ok.access_token, JSON.stringify(ok));
    assert.equal((await exchange(code, verifier)).error, 'bad_verification_code', 'replay refused');
    const me = await fetchT(`${gh.base}/user`, { headers: { Authorization: `Bearer ${ok.access_token}` } });
    assert.equal((await me.json()).login, 'octo');
  } finally {
    await gh.stop();
  }
});
