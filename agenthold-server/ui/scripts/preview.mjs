// Serve the built UI (dist/) the way `agenthold serve` does — the same CSP (with a fresh nonce and the
// <meta name="csp-nonce"> on terminal pages), index.html for every UI path — and proxy /api, /auth, /login/local
// and /healthz (WebSocket upgrades included) to a running server. For trying the production build in a browser
// before the server embeds it: `npm run build && npm run preview` (AGENTHOLD_URL, default
// http://127.0.0.1:8080; PORT, default 5174).
import http from 'node:http';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { extname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';

const dist = fileURLToPath(new URL('../dist/', import.meta.url));
const upstream = new URL(process.env.AGENTHOLD_URL ?? 'http://127.0.0.1:8080');
const port = Number(process.env.PORT ?? 5174);
const proxied = ['/api/', '/auth/', '/login/local', '/healthz', '/readyz'];
const types = { '.js': 'text/javascript', '.css': 'text/css', '.svg': 'image/svg+xml', '.html': 'text/html; charset=utf-8', '.woff2': 'font/woff2' };
const csp = (nonce) =>
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; connect-src 'self'; " +
  "frame-ancestors 'none'; base-uri 'none'; form-action 'self'" + (nonce ? `; style-src-elem 'self' 'nonce-${nonce}'` : '');
const terminalPage = /^\/w\/[^/]+\/agents\/[^/]+\/terminal$/;

function proxy(req, res) {
  const headers = { ...req.headers, host: upstream.host };
  if (headers.origin) headers.origin = upstream.origin;
  const up = http.request({ host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers }, (r) => {
    res.writeHead(r.statusCode ?? 502, r.headers);
    r.pipe(res);
  });
  up.on('error', (e) => {
    res.writeHead(502, { 'content-type': 'text/plain' });
    res.end(`agenthold server unreachable at ${upstream.origin}: ${e.message}`);
  });
  req.pipe(up);
}

const server = http.createServer(async (req, res) => {
  const path = new URL(req.url ?? '/', 'http://x').pathname;
  if (proxied.some((p) => path.startsWith(p))) return proxy(req, res);
  const headers = { 'x-content-type-options': 'nosniff', 'referrer-policy': 'no-referrer', 'x-frame-options': 'DENY' };
  if (path.startsWith('/assets/')) {
    const file = normalize(join(dist, path));
    if (!file.startsWith(dist)) return res.writeHead(404).end();
    try {
      const body = await readFile(file);
      res.writeHead(200, { ...headers, 'content-type': types[extname(file)] ?? 'application/octet-stream', 'content-security-policy': csp() });
      return res.end(body);
    } catch {
      return res.writeHead(404, headers).end();
    }
  }
  let html = await readFile(join(dist, 'index.html'), 'utf8');
  let nonce = '';
  if (terminalPage.test(path)) {
    nonce = randomBytes(16).toString('base64');
    html = html.replace('<head>', `<head>\n    <meta name="csp-nonce" content="${nonce}">`);
  }
  res.writeHead(200, { ...headers, 'content-type': types['.html'], 'content-security-policy': csp(nonce), 'cache-control': 'no-store' });
  res.end(html);
});

// WebSocket (the terminal): pass the upgrade through, presenting the server's own origin.
server.on('upgrade', (req, socket, head) => {
  const up = net.connect(Number(upstream.port || 80), upstream.hostname, () => {
    const lines = [`${req.method} ${req.url} HTTP/1.1`];
    for (let i = 0; i < req.rawHeaders.length; i += 2) {
      const [k, v] = [req.rawHeaders[i], req.rawHeaders[i + 1]];
      const lower = k.toLowerCase();
      lines.push(`${k}: ${lower === 'host' ? upstream.host : lower === 'origin' ? upstream.origin : v}`);
    }
    up.write(lines.join('\r\n') + '\r\n\r\n');
    up.write(head);
    up.pipe(socket);
    socket.pipe(up);
  });
  up.on('error', () => socket.destroy());
  socket.on('error', () => up.destroy());
});

server.listen(port, '127.0.0.1', () => console.log(`UI preview on http://127.0.0.1:${port}/ → ${upstream.origin}`));
