// Agents at work in the UI, in Chromium against a real server and real sandboxes: a run started from the
// Runs tab streams its events and ends; a webhook made on the Webhooks tab shows its URL once, and a delivery
// to it starts a run the Runs tab lists as from a webhook; the provider logins page and the agent's overview
// show no login until one is connected.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { withPage } from '../lib/browser.js';
import { Server, fetchT, until } from '../lib/server.js';
import { localAdmin } from '../lib/flows.js';

let server;

before(async () => {
  server = await Server.start({});
});

after(async () => {
  await server?.stop();
});

// covers: P1
test('runs tab: a custom run streams its events and ends succeeded', async (t) => {
  await withPage(t, async ({ page }) => {
    const admin = await localAdmin(page, server);
    const ws = await server.workspace(admin.token, 'team-runs');
    const agent = await server.agent(admin.token, ws, { name: 'worker', policy: { mode: 'allowlist', entries: [] } });
    await page.goto(`${server.base}/w/${ws}/agents/${agent}/runs`);
    await page.getByLabel('Harness').selectOption('custom');
    await page.getByLabel('Command').fill('cat');
    await page.getByLabel('Prompt').fill('hello from the browser; $(not run) `nor this`');
    await page.getByRole('button', { name: 'Start run' }).click();
    const feed = page.getByTestId('run-events');
    await until('the prompt echoed in the run feed', async () => (await feed.innerText()).includes('hello from the browser; $(not run) `nor this`'), 60000);
    await page.locator('[data-testid="run-row"] [data-state="succeeded"]').first().waitFor({ timeout: 60000 });
  });
});

// covers: P2, S8
test('webhooks tab: the URL is shown once, a delivery starts a run listed as from a webhook', async (t) => {
  await withPage(t, async ({ page }) => {
    const admin = await localAdmin(page, server);
    const ws = await server.workspace(admin.token, 'team-hooks');
    const agent = await server.agent(admin.token, ws, { name: 'hooked', policy: { mode: 'allowlist', entries: [] } });
    await page.goto(`${server.base}/w/${ws}/agents/${agent}/webhooks`);
    await page.getByLabel('Sign deliveries (HMAC)').uncheck();
    await page.getByRole('button', { name: 'Create webhook' }).click();
    const url = (await page.getByTestId('new-webhook-url').innerText()).trim();
    assert.match(url, /^http:\/\/127\.0\.0\.1:\d+\/hooks\/[0-9a-f]{64}$/);
    await page.getByRole('button', { name: 'Done' }).click();
    await page.getByTestId('webhook-row').first().waitFor();
    assert.ok(!(await page.content()).includes(url.split('/hooks/')[1]), 'the token is not on the page any more');

    const r = await fetchT(url, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"event":"push"}' });
    assert.equal(r.status, 202, await r.text());
    await page.getByRole('link', { name: 'Runs' }).click();
    await until('a run from the webhook', async () => (await page.getByTestId('run-row').allInnerTexts()).some((x) => x.includes('webhook')), 20000, 500).catch(async () => {
      await page.reload();
      await until('a run from the webhook (after a reload)', async () => (await page.getByTestId('run-row').allInnerTexts()).some((x) => x.includes('webhook')), 20000, 500);
    });
  });
});

// covers: S3
test('provider logins page and the agent overview: no login until one is connected', async (t) => {
  await withPage(t, async ({ page }) => {
    const admin = await localAdmin(page, server);
    const ws = await server.workspace(admin.token, 'team-logins');
    const agent = await server.agent(admin.token, ws, { name: 'nologin', policy: { mode: 'allowlist', entries: [] } });
    await page.goto(`${server.base}/logins`);
    await page.getByRole('heading', { name: 'Provider logins' }).waitFor();
    await page.getByText('No provider logins.').waitFor();
    await page.getByLabel('Provider').selectOption('chatgpt');
    await page.goto(`${server.base}/w/${ws}/agents/${agent}`);
    const login = page.getByTestId('provider-login');
    await login.waitFor();
    assert.match(await login.innerText(), /none/);
    assert.equal(await page.getByTestId('credentials-inside').count(), 0);
  });
});
