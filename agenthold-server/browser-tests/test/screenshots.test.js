// Screenshots of every UI page for docs/ui.md: runs only with AGENTHOLD_SCREENSHOTS=<dir> (relative to the
// repository root, e.g. docs/ui). 1280×800 for each page, 390×844 for a few. The pages are checked like in
// every other test (no console error, page error or CSP violation).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { withPage } from '../lib/browser.js';
import { Server, REPO, freePort, until } from '../lib/server.js';
import { startUpstream, startOidc, startGithub } from '../lib/providers.js';
import { localAdmin } from '../lib/flows.js';

const OUT = process.env.AGENTHOLD_SCREENSHOTS;
const API = 'api.example.test';
const OTHER = 'other.example.test';

let server, upstream, oidc, gh;

before(async () => {
  if (!OUT) return;
  upstream = await startUpstream();
  const deadDns = await freePort();
  // Providers, so the sign-in page shows its buttons.
  const port = await freePort();
  oidc = await startOidc({ redirectUri: `http://127.0.0.1:${port}/auth/oidc/callback` });
  oidc.name = 'Example SSO';
  gh = await startGithub();
  server = await Server.start({
    port,
    oidc,
    github: gh,
    yaml: `egress:\n  dns_upstream: 127.0.0.1:${deadDns}`,
    args: ['--dangerous-connect-to', `${API}:80=${upstream.addr}`, '--dangerous-connect-to', `${OTHER}:80=${upstream.addr}`],
  });
});

after(async () => {
  await server?.stop();
  await upstream?.stop();
  await oidc?.stop();
  await gh?.stop();
});

/** [file name, path, what to wait for] of every page; `{ws}`/`{agent}` filled in. */
const PAGES = [
  ['workspaces', '/', 'Create workspace'],
  ['agents', '/w/{ws}', 'New agent'],
  ['agent-new', '/w/{ws}/agents/new', 'Create agent'],
  ['agent-overview', '/w/{ws}/agents/{agent}', null],
  ['agent-terminal', '/w/{ws}/agents/{agent}/terminal', 'terminal'],
  ['agent-execs', '/w/{ws}/agents/{agent}/execs', 'Run'],
  ['agent-files', '/w/{ws}/agents/{agent}/files', null],
  ['agent-policy', '/w/{ws}/agents/{agent}/policy', null],
  ['agent-requests', '/w/{ws}/agents/{agent}/requests', 'request-row'],
  ['agent-secrets', '/w/{ws}/agents/{agent}/secrets', null],
  ['agent-grants', '/w/{ws}/agents/{agent}/grants', null],
  ['members', '/w/{ws}/members', null],
  ['secrets', '/w/{ws}/secrets', null],
  ['audit', '/w/{ws}/audit', null],
  ['tokens', '/tokens', 'Create token'],
];
const PHONE = ['workspaces', 'agent-overview', 'agent-requests'];

test('screenshots of the UI for docs/ui.md', { skip: !OUT && 'set AGENTHOLD_SCREENSHOTS=docs/ui to write them' }, async (t) => {
  const dir = path.resolve(REPO, OUT);
  await mkdir(dir, { recursive: true });
  let ws, agent, token;
  await withPage(t, async ({ page }) => {
    const admin = await localAdmin(page, server);
    token = admin.token;
    ws = await server.workspace(token, 'demo');
    agent = await server.agent(token, ws, { name: 'coder', policy: { mode: 'allowlist', entries: [API] } });
    // Some traffic for the request log, one exec, one workspace secret, one more member.
    for (const host of [API, OTHER]) {
      await server.api('POST', `/api/v1/workspaces/${ws}/agents/${agent}/execs`, {
        token,
        body: { argv: ['curl', '-s', '-m', '10', '-o', '/dev/null', `http://${host}/v1/models`] },
        headers: { Accept: 'application/json' },
      });
    }
    await server.api('POST', `/api/v1/workspaces/${ws}/secrets`, { token, body: { name: 'api-key', value: 'not-a-real-key', hosts: [API] } });
    const bob = await server.user('Bob Builder', 'bob@example.test');
    await server.api('PUT', `/api/v1/workspaces/${ws}/members/${bob.id}`, { token, body: { role: 'member' } });
    await page.goto(`${server.base}/tokens`);
    await page.getByLabel('Token name').fill('laptop');
    await page.getByRole('button', { name: 'Create token' }).click();
    await page.getByTestId('new-token').waitFor();
  });

  const shoot = async (viewport, names, suffix) => {
    await withPage(
      t,
      async ({ page }) => {
        await page.goto(`${server.base}/login`);
        await page.getByRole('link', { name: 'Sign in with GitHub' }).waitFor();
        if (names.includes('workspaces')) await page.screenshot({ path: path.join(dir, `login${suffix}.png`) });
        const link = await server.loginLink();
        await page.goto(link);
        await page.waitForURL((u) => !u.pathname.startsWith('/login/local'));
        for (const [name, p, wait] of PAGES.filter(([n]) => names.includes(n))) {
          await page.goto(`${server.base}${p.replace('{ws}', ws).replace('{agent}', agent)}`);
          if (wait === 'terminal' || wait === 'request-row') await page.getByTestId(wait).first().waitFor();
          else if (wait) await page.getByRole('button', { name: wait }).or(page.getByRole('link', { name: wait })).first().waitFor();
          else await page.getByRole('heading').first().waitFor();
          await page.waitForLoadState('networkidle');
          if (wait === 'terminal') {
            await until('a prompt', async () => (await page.locator('.xterm-rows').innerText()).trim().length > 0, 15000);
            await page.getByTestId('terminal').click();
            await page.keyboard.type(`curl -s http://${API}/v1/models`);
            await page.keyboard.press('Enter');
            await until('the answer', async () => (await page.locator('.xterm-rows').innerText()).includes('upstream /v1/models'), 15000);
          }
          if (name === 'agent-execs' && suffix === '') {
            await page.getByLabel('Command').fill('uname -srm');
            await page.getByRole('button', { name: 'Run' }).click();
            await until('the exec output', async () => (await page.getByTestId('exec-output').innerText()).includes('Linux'), 15000);
          }
          await page.screenshot({ path: path.join(dir, `${name}${suffix}.png`) });
        }
      },
      { viewport },
    );
  };
  await shoot({ width: 1280, height: 800 }, PAGES.map(([n]) => n), '');
  await shoot({ width: 390, height: 844 }, PHONE, '-phone');
  assert.ok(true);
});
