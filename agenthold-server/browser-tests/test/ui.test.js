// The web UI end to end in Chromium against a real server and real sandboxes: the local admin creates a
// workspace and an agent through the UI and types in its terminal; the request log updates live and "Allow
// this host" lets the next request through; a viewer sees no admin controls and is refused by the API.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { withPage, sessionCookie } from '../lib/browser.js';
import { Server, freePort, until } from '../lib/server.js';
import { startUpstream } from '../lib/providers.js';
import { localAdmin } from '../lib/flows.js';

/** Allowed by the tests' policies; both names lead to the loopback upstream (--dangerous-connect-to). */
const API = 'api.example.test';
/** Denied until a test allows it. */
const OTHER = 'other.example.test';

let server, upstream;

before(async () => {
  upstream = await startUpstream();
  // A DNS upstream nobody answers on: the sandbox's names go through the explicit proxy and the
  // --dangerous-connect-to map, never the host's resolver.
  const deadDns = await freePort();
  server = await Server.start({
    yaml: `egress:\n  dns_upstream: 127.0.0.1:${deadDns}`,
    args: ['--dangerous-connect-to', `${API}:80=${upstream.addr}`, '--dangerous-connect-to', `${OTHER}:80=${upstream.addr}`],
  });
});

after(async () => {
  await server?.stop();
  await upstream?.stop();
});

/** `argv` in the agent through the API (JSON exec, bounded): `{exit_code, stdout}`. */
async function exec(token, ws, agent, argv) {
  const r = await server.api('POST', `/api/v1/workspaces/${ws}/agents/${agent}/execs`, {
    token,
    body: { argv, timeout: 30 },
    headers: { Accept: 'application/json' },
    timeout: 60000,
  });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return r.body;
}

/** curl http://HOST/PATH from inside the agent (through the sandbox's HTTP proxy): the HTTP status. */
async function curl(token, ws, agent, host, path) {
  const r = await exec(token, ws, agent, ['curl', '-s', '-m', '10', '-o', '/dev/null', '-w', '%{http_code}', `http://${host}${path}`]);
  return Number(r.stdout.trim() || 0);
}

// covers: S6, P4
test('local admin: create a workspace and an agent in the UI, then run a command in its terminal', async (t) => {
  await withPage(t, async ({ page }) => {
    const admin = await localAdmin(page, server);
    await page.goto(`${server.base}/`);
    await page.getByLabel('Workspace name').fill('team-ui');
    await page.getByRole('button', { name: 'Create workspace' }).click();
    // The app may open the new workspace by itself, or list it.
    const inWs = (u) => /^\/w\/[^/]+\/?$/.test(u.pathname);
    await Promise.race([page.waitForURL(inWs).catch(() => {}), page.getByRole('link', { name: 'team-ui' }).waitFor().catch(() => {})]);
    if (!inWs(new URL(page.url()))) await page.getByRole('link', { name: 'team-ui' }).click();
    await page.waitForURL(inWs);
    const ws = new URL(page.url()).pathname.split('/')[2];

    await page.getByRole('link', { name: 'New agent' }).click();
    await page.waitForURL((u) => u.pathname === `/w/${ws}/agents/new`);
    await page.getByLabel('Name', { exact: true }).fill('ui-agent');
    await page.getByLabel('Policy mode').selectOption('allowlist');
    await page.getByLabel('Allowed hosts').fill(`${API}\n`);
    await page.getByRole('button', { name: 'Create agent' }).click();
    await page.waitForURL((u) => new RegExp(`^/w/${ws}/agents/(?!new)[^/]+/?$`).test(u.pathname), { timeout: 90000 });
    const agent = new URL(page.url()).pathname.split('/')[4];
    server.track(ws, agent, admin.token);
    const got = await server.api('GET', `/api/v1/workspaces/${ws}/agents/${agent}`, { token: admin.token });
    assert.equal(got.body.name, 'ui-agent');
    assert.deepEqual(got.body.policy?.entries ?? [API], [API]);
    await until('the agent runs', async () => (await server.api('GET', `/api/v1/workspaces/${ws}/agents/${agent}`, { token: admin.token })).body.state === 'running', 60000);

    // The terminal is reached by a full page load (its CSP carries the style nonce).
    await page.getByRole('link', { name: 'Terminal' }).click();
    await page.waitForURL((u) => u.pathname === `/w/${ws}/agents/${agent}/terminal`);
    const term = page.getByTestId('terminal');
    await term.waitFor();
    await until('a prompt', async () => (await page.locator('.xterm-rows').innerText()).trim().length > 0, 20000);
    await term.click();
    await page.keyboard.type('echo agenthold-$((6*7))-ok');
    await page.keyboard.press('Enter');
    await until('the command output in the terminal', async () => (await page.locator('.xterm-rows').innerText()).includes('agenthold-42-ok'), 20000);
  });
});

// covers: E16, E8, S6
test('request log updates live; "Allow this host" on a denied row lets the next request through', async (t) => {
  await withPage(t, async ({ page, expect }) => {
    expect(/status of 40[34]/);
    const admin = await localAdmin(page, server);
    const ws = await server.workspace(admin.token, 'team-log');
    const agent = await server.agent(admin.token, ws, { name: 'log', policy: { mode: 'allowlist', entries: [API] } });
    await page.goto(`${server.base}/w/${ws}/agents/${agent}/requests`);
    const rows = page.getByTestId('request-row');
    await page.getByRole('heading').first().waitFor();
    const rowsAtStart = await rows.count();

    assert.equal(await curl(admin.token, ws, agent, API, '/allowed-first'), 200);
    await page.locator(`[data-testid="request-row"][data-verdict="allowed"][data-host="${API}"]`).first().waitFor();
    assert.notEqual(await curl(admin.token, ws, agent, OTHER, '/denied-first'), 200);
    const denied = page.locator(`[data-testid="request-row"][data-verdict="denied"][data-host="${OTHER}"]`).first();
    await denied.waitFor();
    assert.ok((await rows.count()) > rowsAtStart, 'rows appeared without a reload');
    assert.ok(!upstream.seen.some((r) => r.path === '/denied-first'), 'the denied request never reached the upstream');

    await denied.getByRole('button', { name: 'Allow this host' }).click();
    await until('the policy allows the host', async () => {
      const p = await server.api('GET', `/api/v1/workspaces/${ws}/agents/${agent}/network-policy`, { token: admin.token });
      return JSON.stringify(p.body).includes(OTHER);
    }, 10000);
    assert.equal(await curl(admin.token, ws, agent, OTHER, '/after-allow'), 200, 'allowed at once');
    assert.ok(upstream.seen.some((r) => r.path === '/after-allow'));
    await page.locator(`[data-testid="request-row"][data-verdict="allowed"][data-host="${OTHER}"]`).first().waitFor();
  });
});

// covers: S5, S6, P4
test('a viewer sees no admin controls and the API refuses admin calls made from the page', async (t) => {
  const owner = await server.user('owner', 'owner@example.test');
  const viewer = await server.user('vera', 'vera@example.test');
  const ws = await server.workspace(owner.token, 'team-view');
  const agent = await server.agent(owner.token, ws, { name: 'seen', policy: { mode: 'allowlist', entries: [API] } });
  let r = await server.api('PUT', `/api/v1/workspaces/${ws}/members/${viewer.id}`, { token: owner.token, body: { role: 'member' } });
  assert.ok([200, 201].includes(r.status), JSON.stringify(r.body));
  r = await server.api('PUT', `/api/v1/workspaces/${ws}/agents/${agent}/grants/${viewer.id}`, { token: owner.token, body: { role: 'viewer' } });
  assert.ok([200, 201].includes(r.status), JSON.stringify(r.body));
  assert.notEqual(await curl(owner.token, ws, agent, OTHER, '/viewer-sees-this'), 200);
  const cookie = sessionCookie(server.base, await server.session(viewer.id));

  await withPage(
    t,
    async ({ page, expect }) => {
      expect(/status of 40[34]/);
      const at = (tab) => `${server.base}/w/${ws}/agents/${agent}${tab}`;
      await page.goto(at('/requests'));
      await page.locator(`[data-testid="request-row"][data-verdict="denied"][data-host="${OTHER}"]`).first().waitFor();
      assert.equal(await page.getByRole('button', { name: 'Allow this host' }).count(), 0, 'no "Allow this host" for a viewer');

      await page.goto(at('/policy'));
      await page.getByRole('heading').first().waitFor();
      await page.waitForLoadState('networkidle');
      const save = page.getByRole('button', { name: /save/i });
      for (let i = 0; i < (await save.count()); i++) assert.ok(await save.nth(i).isDisabled(), 'no policy save for a viewer');

      await page.goto(at('/grants'));
      await page.getByRole('heading').first().waitFor();
      await page.waitForLoadState('networkidle');
      const edit = page.getByRole('button', { name: /grant|save|remove|revoke|add/i });
      for (let i = 0; i < (await edit.count()); i++) assert.ok(await edit.nth(i).isDisabled(), 'no grants editing for a viewer');

      // A plain member of the workspace: the member list without the admin's controls.
      await page.goto(`${server.base}/w/${ws}/members`);
      await page.getByTestId('member-row').first().waitFor();
      assert.equal(await page.getByRole('button', { name: 'Add member' }).count(), 0, 'no "Add member" for a member');
      assert.equal(await page.getByTestId('member-row').getByRole('combobox').count(), 0, 'no role pickers for a member');

      // The same calls made directly from the page (same origin, the viewer's cookie): refused.
      const calls = await page.evaluate(
        async ({ ws, agent, api, other, me }) => {
          const base = `/api/v1/workspaces/${ws}/agents/${agent}`;
          const send = async (method, path, body) => {
            const res = await fetch(path, { method, credentials: 'same-origin', headers: { 'Content-Type': 'application/json' }, body: body && JSON.stringify(body) });
            return `${method} ${path.replace(base, '…')} ${res.status}`;
          };
          return [
            await send('PUT', `${base}/network-policy`, { mode: 'allowlist', entries: [api, other] }),
            await send('POST', `${base}/network-policy/suggestions/approve`, { host: other }),
            await send('PUT', `${base}/grants/${me}`, { role: 'admin' }),
            await send('POST', `${base}/execs`, { argv: ['true'] }),
            await send('DELETE', base),
            await send('POST', `/api/v1/workspaces/${ws}/secrets`, { name: 'x', value: 'y', hosts: [api] }),
            await send('POST', `/api/v1/workspaces/${ws}/members`, { email: 'friend@example.test', role: 'admin' }),
          ];
        },
        { ws, agent, api: API, other: OTHER, me: viewer.id },
      );
      for (const c of calls) assert.match(c, / 40[34]$/, c);
    },
    { cookies: [cookie] },
  );
  const policy = await server.api('GET', `/api/v1/workspaces/${ws}/agents/${agent}/network-policy`, { token: owner.token });
  assert.ok(!JSON.stringify(policy.body).includes(OTHER), 'the policy did not change');
});

// covers: S6, S7
test('tokens page: a new token is shown once, works, and is revoked', async (t) => {
  await withPage(t, async ({ page }) => {
    await localAdmin(page, server);
    await page.goto(`${server.base}/tokens`);
    await page.getByLabel('Token name').fill('laptop');
    await page.getByRole('button', { name: 'Create token' }).click();
    const value = (await page.getByTestId('new-token').innerText()).trim();
    assert.match(value, /^ahp_/);
    assert.equal((await server.api('GET', '/api/v1/me', { token: value })).status, 200);
    const row = page.getByTestId('token-row').filter({ hasText: 'laptop' });
    await row.waitFor();
    assert.ok(!(await row.innerText()).includes(value), 'the list shows a prefix, not the value');
    await page.reload();
    assert.equal(await page.getByTestId('new-token').count(), 0, 'shown once');
    await row.getByRole('button', { name: 'Revoke' }).click();
    await row.getByRole('button', { name: 'Yes, revoke' }).click();
    await row.waitFor({ state: 'detached' });
    assert.equal((await server.api('GET', '/api/v1/me', { token: value })).status, 401, 'revoked at once');
  });
});

// covers: P1, S6
test('execs page: output streams live, and after a reload "Reattach" follows the running exec to its end', async (t) => {
  await withPage(t, async ({ page }) => {
    const admin = await localAdmin(page, server);
    const ws = await server.workspace(admin.token, 'team-exec');
    const agent = await server.agent(admin.token, ws, { name: 'exec', policy: { mode: 'allowlist', entries: [API] } });
    await page.goto(`${server.base}/w/${ws}/agents/${agent}/execs`);
    await page.getByLabel('Command').fill('for i in 1 2 3 4 5 6; do echo tick-$i; sleep 1; done');
    await page.getByLabel(/Run in/).check();
    await page.getByRole('button', { name: 'Run' }).click();
    const out = page.getByTestId('exec-output');
    await until('the first line, live', async () => (await out.innerText()).includes('tick-1'), 15000);
    assert.ok(!(await out.innerText()).includes('tick-6'), 'seen before the command ended');
    await page.reload();
    const row = page.getByTestId('exec-row').first();
    await row.getByRole('button', { name: 'Reattach' }).click();
    await until('the whole output after reattaching', async () => {
      const text = await page.getByTestId('exec-output').innerText();
      return ['tick-1', 'tick-2', 'tick-6'].every((s) => text.includes(s));
    }, 20000);
    await row.getByRole('button', { name: 'Show output' }).waitFor({ timeout: 15000 });
  });
});

// covers: S13, S6
test('workspace secrets page: a value is sent once and never comes back to the browser', async (t) => {
  await withPage(t, async ({ page }) => {
    const admin = await localAdmin(page, server);
    const ws = await server.workspace(admin.token, 'team-secret');
    const value = `sk-test-${Date.now()}-do-not-show`;
    const bodies = [];
    page.on('response', async (r) => {
      if (r.url().startsWith(`${server.base}/api/`)) bodies.push(await r.text().catch(() => ''));
    });
    await page.goto(`${server.base}/w/${ws}/secrets`);
    await page.getByLabel('Secret name').fill('upstream-key');
    await page.getByLabel('Value', { exact: true }).fill(value);
    await page.getByLabel('Hosts and header').check();
    await page.getByLabel(/^Hosts/).fill(API);
    await page.getByLabel('Header', { exact: true }).fill('Authorization');
    await page.getByRole('button', { name: 'Create secret' }).click();
    const row = page.getByTestId('secret-row').filter({ hasText: 'upstream-key' });
    await row.waitFor();
    assert.equal(await page.getByLabel('Value', { exact: true }).inputValue(), '', 'the form forgets the value');
    await page.reload();
    await row.waitFor();
    assert.ok(!(await page.content()).includes(value), 'not in the page');
    assert.ok(bodies.length > 0 && bodies.every((b) => !b.includes(value)), 'no API answer carried the value');
    const list = await server.api('GET', `/api/v1/workspaces/${ws}/secrets`, { token: admin.token });
    assert.ok(!JSON.stringify(list.body).includes(value));
  });
});
