// OIDC and GitHub logins in a real browser against a real OIDC provider (oidc-provider 9, PKCE required) and
// a GitHub stand-in that checks the S256 verifier: success lands on `next` with the user's name shown; a
// tampered state, a replayed callback, a wrong nonce and a wrong PKCE challenge are refused; `next` never
// leaves the origin (open redirects); the provider list.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { withPage } from '../lib/browser.js';
import { Server, freePort, fetchT } from '../lib/server.js';
import { startOidc, oidcLogin, startGithub } from '../lib/providers.js';
import { meFromPage, meStatus, localLogin } from '../lib/flows.js';

let server, oidc, gh;

before(async () => {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  oidc = await startOidc({
    redirectUri: `${base}/auth/oidc/callback`,
    accounts: {
      ada: { name: 'Ada Lovelace', email: 'ada@example.test' },
      grace: { name: 'Grace Hopper', email: 'grace@example.test' },
      lin: { name: 'Lin Invitee', email: 'lin@example.test' },
    },
  });
  oidc.name = 'Test IdP';
  gh = await startGithub({ user: { id: 583231, login: 'octocat', name: 'Mona Octocat', email: 'mona@example.test' } });
  server = await Server.start({ port, oidc, github: gh });
});

after(async () => {
  await server?.stop();
  await oidc?.stop();
  await gh?.stop();
});

const callback = (p) => `${server.base}/auth/${p}/callback`;

/**
 * Let the test see and change each redirect hop of the login flows. Playwright routes only the first
 * request of a navigation, not the redirects the browser follows, so a routed navigation is fetched here
 * without following redirects: each Location goes through `onHop(url)`, which may answer `{rewrite}` (go
 * there instead) or `{hold: true}` (stop: the page shows a blank text, the URL is the test's). Hops that are
 * the provider's own redirect endpoints (`/auth…` of the issuer, the GitHub authorize URL) are followed
 * here too; any other hop is handed back to the browser as a 303.
 */
async function routeHops(page, onHop) {
  const context = page.context();
  const followHere = (u) => u.startsWith(`${oidc.issuer}/auth`) || u.startsWith(`${gh.base}/login/oauth/authorize`);
  await page.route(
    () => true,
    async (route) => {
      const req = route.request();
      if (!req.isNavigationRequest()) return route.fallback(); // the context's loopback-only rule
      let resp = await route.fetch({ maxRedirects: 0, timeout: 15000 });
      for (let i = 0; i < 10 && resp.status() >= 300 && resp.status() < 400; i++) {
        let next = new URL(resp.headers().location, resp.url()).href;
        const d = (await onHop(next)) ?? {};
        if (d.hold) return route.fulfill({ status: 200, contentType: 'text/plain', body: 'held by the test' });
        if (d.rewrite) next = d.rewrite;
        if (!followHere(next)) return route.fulfill({ status: 303, headers: { Location: next } });
        resp = await context.request.get(next, { maxRedirects: 0, timeout: 15000 });
      }
      return route.fulfill({ response: resp });
    },
  );
}

/** Hold the browser at the callback and hand back its URL (not yet used). */
async function captureCallback(page, provider, start) {
  let url;
  await routeHops(page, (u) => (u.startsWith(`${callback(provider)}?`) ? ((url = u), { hold: true }) : undefined));
  await page.goto(start);
  if (provider === 'oidc') await oidcLogin(page, oidc.issuer, 'grace');
  await page.waitForFunction(() => document.body?.innerText.includes('held by the test'));
  await page.unrouteAll({ behavior: 'ignoreErrors' });
  assert.ok(url, 'the provider came back');
  return new URL(url);
}

/** Rewrite parameter `name` of the way to `authorize` (the provider's authorization URL). */
async function rewriteParam(page, authorize, name, value) {
  await routeHops(page, (u) => {
    if (!u.startsWith(`${authorize}?`)) return undefined;
    const x = new URL(u);
    x.searchParams.set(name, value);
    return { rewrite: x.href };
  });
}

/** Visit a callback URL expecting a refusal: 400/401, a page linking to /login, and no session. */
async function refused(page, url, why) {
  const resp = await page.goto(typeof url === 'string' ? url : url.href);
  assert.ok([400, 401].includes(resp.status()), `${why}: status ${resp.status()}`);
  assert.ok(await page.locator('a[href^="/login"]').count(), `${why}: the error page links to /login`);
  assert.equal(await meStatus(page.context(), server.base), 401, `${why}: no session`);
}

// covers: S6
test('the sign-in page lists the providers', async (t) => {
  const r = await fetchT(`${server.base}/auth/providers`);
  const body = await r.json();
  const ids = body.providers.map((p) => p.id);
  assert.ok(ids.includes('oidc') && ids.includes('github'), JSON.stringify(body));
  assert.equal(body.providers.find((p) => p.id === 'oidc').name, 'Test IdP');
  assert.equal(body.providers.find((p) => p.id === 'oidc').start, '/auth/oidc/start');
  await withPage(t, async ({ page }) => {
    await page.goto(`${server.base}/login?next=/tokens`);
    await page.getByRole('link', { name: 'Sign in with Test IdP' }).waitFor();
    await page.getByRole('link', { name: 'Sign in with GitHub' }).waitFor();
  });
});

// covers: S6
test('OIDC login with PKCE, state and nonce lands on next and shows the user name', async (t) => {
  await withPage(t, async ({ page, foreign }) => {
    foreign(oidc.issuer);
    const mark = { auth: oidc.events.auth.length, token: oidc.events.token.length };
    await page.goto(`${server.base}/tokens`);
    // Not signed in: the app sends us to the sign-in page with next.
    await page.waitForURL((u) => u.pathname === '/login' && u.searchParams.get('next') === '/tokens');
    await page.getByRole('link', { name: 'Sign in with Test IdP' }).click();
    await oidcLogin(page, oidc.issuer, 'ada', server.base);
    await page.waitForURL(`${server.base}/tokens`);

    const auth = oidc.events.auth.slice(mark.auth).at(-1).params;
    assert.equal(auth.code_challenge_method, 'S256');
    assert.ok(auth.code_challenge?.length >= 43, 'a code_challenge');
    assert.ok(auth.state?.length >= 16, 'a state');
    assert.ok(auth.nonce?.length >= 16, 'a nonce');
    const tok = oidc.events.token.slice(mark.token);
    assert.equal(tok.length, 1, 'one code exchange');
    assert.ok(tok[0].params.code_verifier, 'our server sent the PKCE verifier');
    assert.equal(tok[0].status, 200);

    // The user's name from the provider (a conformant provider such as oidc-provider puts the profile and
    // email claims in the userinfo answer, not in the ID token, when an access token is issued).
    const me = await meFromPage(page);
    const idToken = tok[0].body?.id_token ?? '';
    const claims = Object.keys(JSON.parse(Buffer.from(idToken.split('.')[1] ?? '', 'base64url').toString() || '{}'));
    assert.equal(
      me.body.name,
      'Ada Lovelace',
      `the provider's name claim (from userinfo: the ID token has only ${claims.join(',')}), not the subject: ${JSON.stringify(me.body)}`,
    );
    assert.equal(me.body.email, 'ada@example.test', `the provider's email claim: ${JSON.stringify(me.body)}`);
    await page.getByText('Ada Lovelace').first().waitFor();
  });
});

// covers: S6
test('OIDC: a tampered state is refused', async (t) => {
  await withPage(t, async ({ page, foreign, expect }) => {
    foreign(oidc.issuer);
    expect(/status of 40[01]/);
    const cb = await captureCallback(page, 'oidc', `${server.base}/auth/oidc/start?next=/`);
    const state = cb.searchParams.get('state');
    cb.searchParams.set('state', `${state.slice(0, -2)}${state.endsWith('AA') ? 'BB' : 'AA'}`);
    await refused(page, cb, 'tampered state');
  });
});

// covers: S6
test('OIDC: replaying the same callback (same code) is refused', async (t) => {
  await withPage(t, async ({ page, foreign, expect }) => {
    foreign(oidc.issuer);
    expect(/status of 40[01]/);
    const cb = await captureCallback(page, 'oidc', `${server.base}/auth/oidc/start?next=/tokens`);
    await page.goto(cb.href);
    await page.waitForURL(`${server.base}/tokens`);
    assert.equal((await meFromPage(page)).status, 200, 'signed in by the first visit');
    await page.context().clearCookies();
    await refused(page, cb, 'replayed callback');
  });
});

// covers: S6
test('OIDC: a nonce rewritten on the way to the provider is refused', async (t) => {
  await withPage(t, async ({ page, foreign, expect }) => {
    foreign(oidc.issuer);
    expect(/status of 40[01]/);
    const tokens = oidc.events.token.length;
    await rewriteParam(page, `${oidc.issuer}/auth`, 'nonce', 'forged-nonce-forged-nonce');
    await page.goto(`${server.base}/auth/oidc/start?next=/`);
    await oidcLogin(page, oidc.issuer, 'grace', callback('oidc'));
    await page.waitForURL((u) => u.href.startsWith(callback('oidc')));
    await page.waitForLoadState('load');
    const status = await page.evaluate(() => document.readyState && performance.getEntriesByType('navigation')[0]?.responseStatus);
    assert.ok([400, 401].includes(status), `wrong nonce: status ${status}`);
    assert.equal(await meStatus(page.context(), server.base), 401, 'no session');
    assert.ok(oidc.events.token.length > tokens, 'the provider did issue an ID token (with the forged nonce)');
  });
});

// covers: S6
test('OIDC: a code_challenge rewritten on the way makes the provider refuse our verifier, and the login fails', async (t) => {
  await withPage(t, async ({ page, foreign, expect }) => {
    foreign(oidc.issuer);
    expect(/status of 40[0-9]|status of 50[0-9]/);
    const tokens = oidc.events.token.length;
    const forged = 'A'.repeat(43);
    await rewriteParam(page, `${oidc.issuer}/auth`, 'code_challenge', forged);
    await page.goto(`${server.base}/auth/oidc/start?next=/`);
    await oidcLogin(page, oidc.issuer, 'grace', callback('oidc'));
    await page.waitForURL((u) => u.href.startsWith(callback('oidc')));
    const status = await page.evaluate(() => performance.getEntriesByType('navigation')[0]?.responseStatus);
    assert.ok(status >= 400 && status < 500, `refused login: status ${status}`);
    assert.equal(await meStatus(page.context(), server.base), 401, 'no session');
    const tok = oidc.events.token.slice(tokens);
    assert.ok(tok.length >= 1 && tok.every((e) => e.status === 400), `the provider refused: ${JSON.stringify(tok.map((e) => e.status))}`);
  });
});

// covers: S6
test('GitHub login with PKCE against the stand-in lands on next and shows the user name', async (t) => {
  await withPage(t, async ({ page, expect }) => {
    expect(/status of 40[01]/);
    const mark = gh.events.token.length;
    await page.goto(`${server.base}/login?next=/tokens`);
    await page.getByRole('link', { name: 'Sign in with GitHub' }).click();
    await page.waitForURL(`${server.base}/tokens`);
    await page.getByText('Mona Octocat').first().waitFor();
    assert.equal((await meFromPage(page)).body.name, 'Mona Octocat');
    const tok = gh.events.token.slice(mark);
    assert.equal(tok.length, 1);
    assert.equal(tok[0].result, 'ok', 'the verifier matched the S256 challenge');
    const auth = gh.events.authorize.at(-1);
    assert.equal(auth.code_challenge_method, 'S256');
    assert.ok(auth.state?.length >= 16);

    // The same callback again: refused (state used, code used).
    const cbUrl = `${callback('github')}?code=${[...gh.codes.keys()].at(-1)}&state=${encodeURIComponent(auth.state)}`;
    await page.context().clearCookies();
    await refused(page, cbUrl, 'replayed GitHub callback');
  });
});

// covers: S6
test('GitHub: a forged code_challenge makes the stand-in refuse our verifier, and the login fails', async (t) => {
  await withPage(t, async ({ page, expect }) => {
    expect(/status of 40[0-9]|status of 50[0-9]/);
    const mark = gh.events.token.length;
    await rewriteParam(page, `${gh.base}/login/oauth/authorize`, 'code_challenge', 'B'.repeat(43));
    await page.goto(`${server.base}/auth/github/start?next=/`);
    await page.waitForURL((u) => u.href.startsWith(callback('github')));
    const status = await page.evaluate(() => performance.getEntriesByType('navigation')[0]?.responseStatus);
    assert.ok(status >= 400 && status < 500, `refused: ${status}`);
    assert.equal(await meStatus(page.context(), server.base), 401);
    assert.equal(gh.events.token.slice(mark).at(-1)?.result, 'bad_verification_code');
  });
});

const EVIL = ['//evil.example', '/\\evil.example', 'https://evil.example/', '/%2F/evil.example', '\\\\evil.example', 'javascript:alert(1)'];

// covers: S6
test('open redirect: next pointing elsewhere lands on / after OIDC, GitHub and local logins', async (t) => {
  for (const next of EVIL) {
    for (const provider of ['oidc', 'github', 'local']) {
      await withPage(t, async ({ page, foreign, blocked }) => {
        foreign(oidc.issuer);
        if (provider === 'local') {
          const link = new URL(await server.loginLink());
          link.searchParams.set('next', next);
          await page.goto(link.href);
          await page.waitForURL((u) => !u.pathname.startsWith('/login/local'));
        } else {
          await page.goto(`${server.base}/auth/${provider}/start?next=${encodeURIComponent(next)}`);
          if (provider === 'oidc') await oidcLogin(page, oidc.issuer, 'ada', `${server.base}/`);
        }
        await page.waitForURL((u) => u.origin === server.base && !u.pathname.startsWith('/auth/'));
        const u = new URL(page.url());
        assert.equal(u.origin, server.base, `${provider} ${next}: stayed on the origin`);
        assert.equal(u.pathname, '/', `${provider} ${next}: landed on /`);
        assert.deepEqual(blocked.filter((b) => b.includes('evil')), [], `${provider} ${next}: never went to evil.example`);
        assert.equal((await meFromPage(page)).status, 200, 'signed in');
      });
    }
    // /auth/local answers the sanitised next itself.
    const link = new URL(await server.loginLink());
    const r = await fetchT(`${server.base}/auth/local`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Origin: server.base },
      body: JSON.stringify({ token: link.hash.slice(1), next }),
    });
    assert.equal(r.status, 200, `POST /auth/local ${next}`);
    assert.equal((await r.json()).next, '/', `POST /auth/local sanitises ${next}`);
  }
});

// covers: S6, P4
test('people invited by email in the UI join at their first OIDC or GitHub login; Sign out ends the session', async (t) => {
  let ws;
  await withPage(t, async ({ page }) => {
    await localLogin(page, server);
    await page.getByLabel('Workspace name').fill('invited');
    await page.getByRole('button', { name: 'Create workspace' }).click();
    await page.waitForURL((u) => /^\/w\/[^/]+\/?$/.test(u.pathname));
    ws = new URL(page.url()).pathname.split('/')[2];
    await page.getByRole('link', { name: 'Members' }).click();
    for (const email of ['lin@example.test', 'newbie@example.test']) {
      await page.getByLabel('By email').check();
      await page.getByLabel('Email address').fill(email);
      await page.getByRole('button', { name: 'Add member' }).click();
      await page.locator('[data-testid="member-row"]', { hasText: email }).waitFor();
    }
  });
  gh.state.user = { id: 90210, login: 'newbie', name: 'New Bie', email: 'newbie@example.test' };
  for (const [provider, name] of [
    ['oidc', 'Lin Invitee'],
    ['github', 'New Bie'],
  ]) {
    await withPage(t, async ({ page, context, foreign }) => {
      foreign(oidc.issuer);
      await page.goto(`${server.base}/auth/${provider}/start?next=/`);
      if (provider === 'oidc') await oidcLogin(page, oidc.issuer, 'lin', `${server.base}/`);
      await page.waitForURL(`${server.base}/`);
      await page.getByText(name).first().waitFor();
      // The invitation became a membership: the workspace is in their list and opens.
      await page.getByRole('link', { name: 'invited' }).click();
      await page.waitForURL((u) => u.pathname.startsWith(`/w/${ws}`));
      await page.getByRole('link', { name: 'New agent' }).waitFor();
      // Sign out: back to the sign-in page, the cookie and the session are gone.
      await page.getByRole('button', { name: 'Sign out' }).click();
      await page.waitForURL((u) => u.pathname === '/login');
      assert.equal(await meStatus(context, server.base), 401);
      assert.deepEqual((await context.cookies(server.base)).filter((c) => c.name === 'agenthold_session'), []);
    });
  }
});
