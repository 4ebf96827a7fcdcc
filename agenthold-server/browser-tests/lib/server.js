// One real `agenthold serve` per test: its own temp data directory, a free loopback port, a YAML config,
// admin commands through the real binary (SERVER.md §7), API calls with a personal token, and on stop the
// agents deleted through the API, SIGTERM, and a sweep of engine objects the installation left.

import { spawn, execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtemp, writeFile, readFile, rm } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);
const here = path.dirname(fileURLToPath(import.meta.url));
/** The repository's root (browser-tests is agenthold-server/browser-tests). */
export const REPO = path.resolve(here, '..', '..', '..');

/** The binary under test: $AGENTHOLD_BIN, else $CARGO_TARGET_DIR/debug/agenthold, else target/debug. */
export function binary() {
  if (process.env.AGENTHOLD_BIN) return path.resolve(process.env.AGENTHOLD_BIN);
  if (process.env.CARGO_TARGET_DIR) {
    const p = path.join(process.env.CARGO_TARGET_DIR, 'debug', 'agenthold');
    if (existsSync(p)) return p;
  }
  return path.join(REPO, 'target', 'debug', 'agenthold');
}

/**
 * A free TCP port on `host`, for a listener that starts later (a server whose callback URL must be known
 * first). Chosen below Linux's ephemeral range (32768-60999): a port from that range, free when checked, can
 * be taken as the source port of any outgoing connection before our listener binds it, which made servers
 * fail with "Address already in use" when two test files ran at once.
 */
export async function freePort(host = '127.0.0.1') {
  for (let tries = 0; tries < 100; tries++) {
    const port = 10000 + Math.floor(Math.random() * 22000);
    const free = await new Promise((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(false));
      s.listen(port, host, () => s.close(() => resolve(true)));
    });
    if (free) return port;
  }
  throw new Error(`no free port on ${host} below the ephemeral range after 100 tries`);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Poll `fn` until it returns a truthy value, at most `timeout` ms; throws with `what` otherwise. */
export async function until(what, fn, timeout = 20000, every = 200) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}${last ? `: ${last}` : ''}`);
    await sleep(every);
  }
}

/** fetch with a timeout (every wait bounded). */
export async function fetchT(url, opts = {}, timeout = 30000) {
  return fetch(url, { redirect: 'manual', ...opts, signal: AbortSignal.timeout(timeout) });
}

const START_TIMEOUT = 60000;

/** A running `agenthold serve`. */
export class Server {
  /**
   * Start a server. `yaml` is appended to the config (top-level keys other than data_dir, server and
   * auth); `auth` is YAML lines put under `auth:`; `oidc` ({issuer, clientId, clientSecret, name?}) and
   * `github` ({base, clientId, clientSecret}) turn those providers on; `args` are extra serve flags;
   * `port` fixes the port (the providers need the callback URL before the server starts).
   */
  static async start({ yaml = '', auth = '', args = [], env = {}, port, oidc, github } = {}) {
    const s = new Server();
    s.tmp = await mkdtemp(path.join(os.tmpdir(), 'agenthold-browser-'));
    s.dataDir = path.join(s.tmp, 'data');
    s.port = port ?? (await freePort());
    s.base = `http://127.0.0.1:${s.port}`;
    s.config = path.join(s.tmp, 'config.yaml');
    const authLines = ['rate_unauthenticated: 0', ...auth.split('\n').filter((l) => l.trim() !== '')];
    // The login providers (config keys of agenthold-core's AuthConfig): secrets in 0600 files.
    if (oidc) {
      const file = path.join(s.tmp, 'oidc-secret');
      await writeFile(file, `${oidc.clientSecret}\n`, { mode: 0o600 });
      authLines.push('oidc:', `  issuer: ${oidc.issuer}`, `  client_id: ${oidc.clientId}`, `  client_secret_file: ${file}`);
      if (oidc.name) authLines.push(`  name: ${JSON.stringify(oidc.name)}`);
    }
    if (github) {
      const file = path.join(s.tmp, 'github-secret');
      await writeFile(file, `${github.clientSecret}\n`, { mode: 0o600 });
      authLines.push(
        'github:',
        `  client_id: ${github.clientId}`,
        `  client_secret_file: ${file}`,
        `  authorize_url: ${github.base}/login/oauth/authorize`,
        `  token_url: ${github.base}/login/oauth/access_token`,
        `  api_url: ${github.base}`,
      );
    }
    const text = [
      `data_dir: ${s.dataDir}`,
      'server:',
      `  listen: 127.0.0.1:${s.port}`,
      `  public_url: ${s.base}`,
      'auth:',
      ...authLines.map((l) => `  ${l}`),
      yaml,
    ].join('\n');
    await writeFile(s.config, `${text}\n`);
    s.args = args;
    s.env = env;
    s.agents = new Map(); // id -> ws, for cleanup
    s.cleanupToken = null;
    try {
      await s.spawn();
    } catch (e) {
      await s.stop();
      throw e;
    }
    return s;
  }

  /** Start the process and wait (bounded) for /healthz. */
  async spawn() {
    const { openSync } = await import('node:fs');
    this.logPath = path.join(this.tmp, 'serve.log');
    const fd = openSync(this.logPath, 'a');
    this.child = spawn(binary(), ['serve', '--config', this.config, ...this.args], {
      env: { ...process.env, AGENTHOLD_LOG: 'info', ...this.env },
      stdio: ['ignore', fd, fd],
    });
    let exited = null;
    this.child.once('exit', (code, sig) => {
      exited = `${code ?? sig}`;
    });
    this.child.once('error', (e) => {
      exited = `${e.message} (set AGENTHOLD_BIN)`;
    });
    const deadline = Date.now() + START_TIMEOUT;
    for (;;) {
      if (exited !== null) throw new Error(`agenthold serve exited (${exited}):\n${await this.log()}`);
      try {
        const r = await fetchT(`${this.base}/healthz`, {}, 2000);
        if (r.status === 200) return;
      } catch {
        /* not up yet */
      }
      if (Date.now() > deadline) throw new Error(`agenthold serve did not answer /healthz:\n${await this.log()}`);
      await sleep(100);
    }
  }

  /** What the server printed so far. */
  async log() {
    return readFile(this.logPath, 'utf8').catch(() => '');
  }

  /** `agenthold admin ARGS --config CONFIG`: its one line of output. */
  async admin(...args) {
    const { stdout } = await run(binary(), ['admin', ...args, '--config', this.config], { timeout: 30000 });
    return stdout.trim();
  }

  /** A new user (`--email` when given) and a personal token: `{id, token, name}`. */
  async user(name, email) {
    const id = await this.admin('user', 'create', '--name', name, ...(email ? ['--email', email] : []));
    const token = await this.admin('token', 'create', '--user', id);
    this.cleanupToken ??= token;
    return { id, token, name };
  }

  /** A browser session cookie value for a user. */
  async session(userId) {
    return this.admin('session', 'create', '--user', userId);
  }

  /** A one-time local admin link. */
  async loginLink() {
    return this.admin('login-link');
  }

  /** An API call with a token: `{status, headers, body}` (body JSON when it parses). */
  async api(method, p, { token, body, headers = {}, timeout = 120000 } = {}) {
    const h = { ...headers };
    if (token) h.Authorization = `Bearer ${token}`;
    if (body !== undefined) h['Content-Type'] = 'application/json';
    const r = await fetchT(`${this.base}${p}`, { method, headers: h, body: body === undefined ? undefined : JSON.stringify(body) }, timeout);
    const raw = await r.text();
    let json;
    try {
      json = JSON.parse(raw);
    } catch {
      json = raw;
    }
    return { status: r.status, headers: r.headers, body: json };
  }

  /** A workspace of the token's user: its id. */
  async workspace(token, name = 'w') {
    const r = await this.api('POST', '/api/v1/workspaces', { token, body: { name } });
    if (r.status !== 201) throw new Error(`create workspace: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body.id;
  }

  /** Remember an agent for cleanup (agents made through the UI). */
  track(ws, agentId, token) {
    this.agents.set(agentId, { ws, token });
  }

  /** A running agent (retries the engine's "Pool overlaps" races); its id. */
  async agent(token, ws, body) {
    for (let i = 0; i < 5; i++) {
      const r = await this.api('POST', `/api/v1/workspaces/${ws}/agents`, { token, body });
      if (r.status === 502 && String(r.body?.detail ?? '').includes('Pool overlaps')) {
        await sleep(500);
        continue;
      }
      if (r.status !== 201) throw new Error(`create agent: ${r.status} ${JSON.stringify(r.body)}\n${await this.log()}`);
      this.track(ws, r.body.id, token);
      return r.body.id;
    }
    throw new Error('the engine kept refusing the agent network');
  }

  /** Delete the agents (API), SIGTERM (bounded), sweep leftover engine objects, remove the temp dir. */
  async stop({ keep = false } = {}) {
    for (const [id, { ws, token }] of this.agents) {
      await this.api('DELETE', `/api/v1/workspaces/${ws}/agents/${id}`, { token, timeout: 60000 }).catch(() => {});
    }
    this.agents.clear();
    if (this.child && this.child.exitCode === null && this.child.signalCode === null) {
      const gone = new Promise((r) => this.child.once('exit', r));
      this.child.kill('SIGTERM');
      const t = await Promise.race([gone.then(() => 'ok'), sleep(30000).then(() => 'timeout')]);
      if (t === 'timeout') this.child.kill('SIGKILL');
    }
    await sweep(this.dataDir);
    if (!keep) await rm(this.tmp, { recursive: true, force: true }).catch(() => {});
  }
}

/** Remove containers, networks and volumes labelled with the installation of `dataDir` (bounded). */
async function sweep(dataDir) {
  const instance = createHash('sha256').update(dataDir).digest('hex').slice(0, 12);
  const label = `label=agenthold.instance=${instance}`;
  const list = async (...args) => {
    try {
      const { stdout } = await run('docker', args, { timeout: 30000 });
      return stdout.split(/\s+/).filter(Boolean);
    } catch {
      return [];
    }
  };
  const quiet = (...args) => run('docker', args, { timeout: 60000 }).catch(() => {});
  const containers = await list('ps', '-aq', '--filter', label);
  if (containers.length) await quiet('rm', '-fv', ...containers);
  for (const n of await list('network', 'ls', '-q', '--filter', label)) await quiet('network', 'rm', n);
  const volumes = await list('volume', 'ls', '-q', '--filter', label);
  if (volumes.length) await quiet('volume', 'rm', '-f', ...volumes);
}
