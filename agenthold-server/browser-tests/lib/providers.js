// The identity providers the login tests talk to, all on loopback: a real OIDC provider (npm oidc-provider 9,
// PKCE required, devInteractions login form), a GitHub stand-in that checks PKCE (S256) and refuses replayed
// codes, and a plain HTTP upstream for the sandbox's egress.

import http from 'node:http';
import { createHash, randomBytes } from 'node:crypto';
import Provider from 'oidc-provider';

/** Listen on `host`:0; resolves to the port. */
function listen(server, host = '127.0.0.1') {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve(server.address().port));
  });
}

function close(server) {
  return new Promise((resolve) => {
    server.closeAllConnections?.();
    server.close(() => resolve());
  });
}

const b64url = (buf) => buf.toString('base64').replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
/** PKCE S256 of a verifier. */
export const s256 = (verifier) => b64url(createHash('sha256').update(verifier).digest());

/**
 * A real OIDC provider. `accounts` maps login name → claims ({name, email}); the devInteractions form takes
 * any login (the password is ignored), and the account id is that login. `redirectUri` is the server's
 * callback. `events` records each authorization and token request the provider saw.
 */
export async function startOidc({ redirectUri, accounts = {}, clientId = 'agenthold-test', clientSecret = randomBytes(16).toString('hex') } = {}) {
  const server = http.createServer();
  const port = await listen(server);
  const issuer = `http://127.0.0.1:${port}`;
  const events = { auth: [], token: [] };
  const provider = new Provider(issuer, {
    clients: [
      {
        client_id: clientId,
        client_secret: clientSecret,
        redirect_uris: [redirectUri],
        grant_types: ['authorization_code'],
        response_types: ['code'],
        token_endpoint_auth_method: 'client_secret_basic',
      },
    ],
    clientAuthMethods: ['client_secret_basic', 'client_secret_post'],
    pkce: { required: () => true },
    features: { devInteractions: { enabled: true } },
    claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name', 'preferred_username'] },
    cookies: { keys: [randomBytes(16).toString('hex')] },
    async findAccount(_ctx, sub) {
      const a = accounts[sub] ?? { name: sub, email: `${sub}@example.test` };
      return {
        accountId: sub,
        async claims() {
          return { sub, name: a.name, preferred_username: sub, email: a.email, email_verified: a.email_verified ?? true };
        },
      };
    },
  });
  provider.use(async (ctx, next) => {
    await next();
    const route = ctx.oidc?.route;
    if (route === 'authorization') events.auth.push({ params: { ...ctx.oidc.params }, status: ctx.status });
    if (route === 'token') {
      events.token.push({ params: { ...ctx.oidc.params }, status: ctx.status, body: ctx.body });
    }
  });
  server.on('request', provider.callback());
  return {
    issuer,
    clientId,
    clientSecret,
    provider,
    events,
    accounts,
    stop: () => close(server),
  };
}

/**
 * Fill the devInteractions login form as `login` and consent (oidc-provider's dev pages), unless the page
 * comes back to `returnTo` by itself. Bounded waits.
 */
export async function oidcLogin(page, issuer, login, returnTo) {
  const atProvider = (u) => u.href.startsWith(`${issuer}/interaction/`);
  // A provider session from an earlier login in the same context skips the forms.
  await page.waitForURL((u) => atProvider(u) || (returnTo && u.href.startsWith(returnTo)));
  if (!atProvider(new URL(page.url()))) return;
  await page.locator('input[name="login"]').fill(login);
  await page.locator('input[name="password"]').fill('any');
  // The login form, then (first login for this client) the consent form: each a submit that navigates.
  for (let i = 0; i < 4 && atProvider(new URL(page.url())); i++) {
    if (!(await page.locator('button[type="submit"]').count())) break; // held by a test's route
    await Promise.all([
      page.waitForEvent('framenavigated', { predicate: (f) => f === page.mainFrame() }),
      page.locator('button[type="submit"]').first().click(),
    ]);
    await page.waitForLoadState('load');
  }
}

/**
 * A GitHub stand-in. `/login/oauth/authorize` remembers the code_challenge and redirects back with a code;
 * `/login/oauth/access_token` checks client secret, redirect, and that SHA-256(code_verifier) matches
 * (S256), and refuses a code used before; `/user` and `/user/emails` answer for the token's user.
 */
export async function startGithub({ clientId = 'gh-test-client', clientSecret = randomBytes(16).toString('hex'), user } = {}) {
  const codes = new Map(); // code -> {challenge, method, redirect, used}
  const tokens = new Map(); // access token -> user
  const events = { authorize: [], token: [], api: [] };
  const state = { user: user ?? { id: 4242, login: 'octo', name: 'Octo Cat', email: 'octo@example.test' } };
  const server = http.createServer(async (req, res) => {
    const url = new URL(req.url, 'http://x');
    const send = (status, body, type = 'application/json') => {
      res.writeHead(status, { 'Content-Type': type });
      res.end(typeof body === 'string' ? body : JSON.stringify(body));
    };
    try {
      if (req.method === 'GET' && url.pathname === '/login/oauth/authorize') {
        const q = Object.fromEntries(url.searchParams);
        events.authorize.push(q);
        if (q.client_id !== clientId) return send(400, 'unknown client', 'text/plain');
        if (q.code_challenge_method !== 'S256' || !q.code_challenge) return send(400, 'PKCE S256 required', 'text/plain');
        if (!q.state) return send(400, 'state required', 'text/plain');
        const code = randomBytes(10).toString('hex');
        codes.set(code, { challenge: q.code_challenge, redirect: q.redirect_uri, used: false, user: state.user });
        const back = new URL(q.redirect_uri);
        back.searchParams.set('code', code);
        back.searchParams.set('state', q.state);
        res.writeHead(302, { Location: back.href });
        return res.end();
      }
      if (req.method === 'POST' && url.pathname === '/login/oauth/access_token') {
        const raw = await new Promise((resolve) => {
          let s = '';
          req.on('data', (c) => (s += c));
          req.on('end', () => resolve(s));
        });
        const p = Object.fromEntries(new URLSearchParams(raw));
        const basic = /^Basic (.+)$/i.exec(req.headers.authorization ?? '');
        if (basic) {
          const [id, secret] = Buffer.from(basic[1], 'base64').toString().split(':').map(decodeURIComponent);
          p.client_id ??= id;
          p.client_secret ??= secret;
        }
        const rec = { params: { ...p }, result: null };
        events.token.push(rec);
        const refuse = (error) => {
          rec.result = error;
          return send(200, { error, error_description: error });
        };
        if (p.client_id !== clientId || p.client_secret !== clientSecret) return refuse('incorrect_client_credentials');
        const c = codes.get(p.code);
        if (!c) return refuse('bad_verification_code');
        if (c.used) return refuse('bad_verification_code'); // replayed
        c.used = true;
        if (p.redirect_uri && p.redirect_uri !== c.redirect) return refuse('redirect_uri_mismatch');
        if (!p.code_verifier || s256(p.code_verifier) !== c.challenge) return refuse('bad_verification_code');
        const token = `gho_${randomBytes(16).toString('hex')}`;
        tokens.set(token, c.user);
        rec.result = 'ok';
        return send(200, { access_token: token, token_type: 'bearer', scope: 'read:user,user:email' });
      }
      if (req.method === 'GET' && (url.pathname === '/user' || url.pathname === '/user/emails')) {
        const m = /^(?:Bearer|token) (.+)$/i.exec(req.headers.authorization ?? '');
        const u = m && tokens.get(m[1]);
        events.api.push({ path: url.pathname, ok: !!u, ua: req.headers['user-agent'] });
        if (!u) return send(401, { message: 'Bad credentials' });
        if (url.pathname === '/user') return send(200, { id: u.id, login: u.login, name: u.name, email: null });
        return send(200, [{ email: u.email, primary: true, verified: true, visibility: 'private' }]);
      }
      send(404, { message: 'Not Found' });
    } catch (e) {
      send(500, String(e), 'text/plain');
    }
  });
  const port = await listen(server);
  const base = `http://127.0.0.1:${port}`;
  return {
    base,
    clientId,
    clientSecret,
    events,
    state,
    codes,
    stop: () => close(server),
  };
}

/** A plain HTTP upstream on loopback that answers 200 "upstream <path>" and records paths. */
export async function startUpstream() {
  const seen = [];
  const server = http.createServer((req, res) => {
    seen.push({ path: req.url, host: req.headers.host });
    res.writeHead(200, { 'Content-Type': 'text/plain' });
    res.end(`upstream ${req.url}\n`);
  });
  const port = await listen(server);
  return { port, addr: `127.0.0.1:${port}`, seen, stop: () => close(server) };
}

/** A page server on another origin (host:port), serving `pages` (path → html). */
export async function startOtherOrigin(host, pages) {
  const server = http.createServer((req, res) => {
    const body = pages[new URL(req.url, 'http://x').pathname];
    if (body === undefined) {
      res.writeHead(404);
      return res.end();
    }
    res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
    res.end(body);
  });
  const port = await listen(server, host);
  return { origin: `http://${host === '127.0.0.1' ? '127.0.0.1' : host}:${port}`, port, stop: () => close(server) };
}
