// Steps several tests share: signing in with the local admin link, asking the page who it is, a token for
// the signed-in user, and a WebSocket attempt made from inside a page.

/** Sign in with a fresh local admin link (optionally `next`); waits until the page left /login/local. */
export async function localLogin(page, server, next) {
  const link = new URL(await server.loginLink());
  if (next !== undefined) link.searchParams.set('next', next);
  await page.goto(link.href);
  await page.waitForURL((u) => !u.pathname.startsWith('/login/local'));
}

/** GET /api/v1/me from inside the page (the session cookie): `{status, body}`. */
export async function meFromPage(page) {
  return page.evaluate(async () => {
    const r = await fetch('/api/v1/me', { credentials: 'same-origin' });
    return { status: r.status, body: r.ok ? await r.json() : null };
  });
}

/** GET /api/v1/me with the context's cookies, outside any page (error pages allow no fetch): the status. */
export async function meStatus(context, base) {
  const r = await context.request.get(`${base}/api/v1/me`, { timeout: 10000 });
  return r.status();
}

/** The local admin, signed in on `page`: `{id, name, token}` (a personal token made with `admin token create`). */
export async function localAdmin(page, server) {
  await localLogin(page, server);
  const me = await meFromPage(page);
  if (me.status !== 200) throw new Error(`/api/v1/me after local login: ${me.status}`);
  const token = await server.admin('token', 'create', '--user', me.body.id);
  server.cleanupToken ??= token;
  return { id: me.body.id, name: me.body.name, token };
}

/** Open a WebSocket from the page: 'open', or 'closed CODE' / 'error' (bounded). */
export async function wsFromPage(page, url) {
  return page.evaluate(
    (u) =>
      new Promise((resolve) => {
        let ws;
        try {
          ws = new WebSocket(u);
        } catch (e) {
          resolve(`throw ${e}`);
          return;
        }
        ws.onopen = () => {
          ws.close();
          resolve('open');
        };
        ws.onclose = (e) => resolve(`closed ${e.code}`);
        setTimeout(() => resolve('timeout'), 15000);
      }),
    url,
  );
}

/** Collect console messages of a page (all types) into an array. */
export function consoleLog(page) {
  const out = [];
  page.on('console', (m) => out.push(m.text()));
  return out;
}
