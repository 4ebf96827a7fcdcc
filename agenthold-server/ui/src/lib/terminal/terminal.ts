// The interactive terminal (lazy chunk): xterm.js with its DOM renderer over the API's WebSocket
// `…/agents/{agent}/terminal`. Binary frames carry keystrokes in and output out; text frames carry JSON control:
// `{"type":"resize","cols","rows"}` from here, `{"type":"exit","exit_code"}` and `{"type":"error","message"}`
// from the server.
import './nonce';
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';

export type TerminalEvents = {
  status: (s: string) => void;
  error: (message: string) => void;
};

/** Open a terminal on `agent` inside `host`; returns a function that closes it (and the shell). */
export function openTerminal(host: HTMLElement, ws: string, agent: string, on: TerminalEvents): () => void {
  host.replaceChildren();
  const term = new Terminal({
    cursorBlink: true,
    fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, monospace',
    fontSize: 14,
    scrollback: 5000,
    theme: { background: '#0f1419', foreground: '#e6e1cf' },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(host);
  try {
    fit.fit();
  } catch {
    // not laid out yet: the default 80x24 stays
  }
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  const url =
    `${scheme}://${location.host}/api/v1/workspaces/${encodeURIComponent(ws)}/agents/${encodeURIComponent(agent)}` +
    `/terminal?cols=${term.cols}&rows=${term.rows}`;
  const socket = new WebSocket(url);
  socket.binaryType = 'arraybuffer';
  const encoder = new TextEncoder();
  let ended = false;
  on.status('Connecting…');

  socket.onopen = () => {
    on.status('Connected');
    term.focus();
  };
  socket.onmessage = (e) => {
    if (e.data instanceof ArrayBuffer) {
      term.write(new Uint8Array(e.data));
      return;
    }
    try {
      const msg = JSON.parse(String(e.data)) as { type?: string; exit_code?: number; message?: string };
      if (msg.type === 'exit') {
        ended = true;
        on.status(`The shell exited (code ${msg.exit_code ?? '?'}). Reconnect for a new one.`);
      } else if (msg.type === 'error') {
        on.error(msg.message ?? 'terminal error');
      }
    } catch {
      // not control JSON: ignore
    }
  };
  socket.onclose = (e) => {
    if (!ended) on.status(e.code === 1000 ? 'Disconnected.' : `Disconnected (${e.code}${e.reason ? `: ${e.reason}` : ''}).`);
  };
  socket.onerror = () => {
    if (!ended) on.error('The terminal connection failed (is the agent running, and do you have the operator role?).');
  };

  const input = term.onData((d) => {
    if (socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(d));
  });
  const binary = term.onBinary((d) => {
    if (socket.readyState !== WebSocket.OPEN) return;
    const bytes = new Uint8Array(d.length);
    for (let i = 0; i < d.length; i++) bytes[i] = d.charCodeAt(i) & 0xff;
    socket.send(bytes);
  });
  const resized = term.onResize(({ cols, rows }) => {
    if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: 'resize', cols, rows }));
  });
  const refit = () => {
    try {
      fit.fit();
    } catch {
      // hidden: keep the size
    }
  };
  const observer = new ResizeObserver(refit);
  observer.observe(host);

  return () => {
    observer.disconnect();
    input.dispose();
    binary.dispose();
    resized.dispose();
    socket.close(1000);
    term.dispose();
  };
}
