// History routing: links to UI paths navigate without a page load; links marked `data-reload` (the terminal,
// which needs its own CSP nonce) and paths the server owns (/api, /auth, /login/local) load a new page.

import { match } from './routes';

export type { Route } from './routes';
export { match };

class Router {
  path = $state(location.pathname);
  search = $state(location.search);
  route = $derived(match(this.path));

  /** Go to `to` (a local path) without a page load. */
  navigate(to: string, replace = false): void {
    const url = new URL(to, location.origin);
    if (replace) history.replaceState(null, '', url);
    else history.pushState(null, '', url);
    this.sync();
    window.scrollTo(0, 0);
  }

  sync(): void {
    this.path = location.pathname;
    this.search = location.search;
  }
}

export const router = new Router();

const serverPaths = ['/api/', '/auth/', '/login/local', '/hooks/', '/healthz', '/readyz', '/metrics'];

/** Install the click and history listeners (once, at start). */
export function startRouter(): void {
  window.addEventListener('popstate', () => router.sync());
  document.addEventListener('click', (e) => {
    if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    const a = (e.target as Element | null)?.closest?.('a');
    if (!a || a.target || a.hasAttribute('download') || a.hasAttribute('data-reload')) return;
    const href = a.getAttribute('href');
    if (!href || !href.startsWith('/') || href.startsWith('//')) return;
    if (serverPaths.some((p) => href.startsWith(p))) return;
    e.preventDefault();
    router.navigate(href);
  });
}

/** Path helpers (ids are URL-safe, but encode anyway). */
export const paths = {
  ws: (ws: string) => `/w/${encodeURIComponent(ws)}`,
  agent: (ws: string, agent: string) => `/w/${encodeURIComponent(ws)}/agents/${encodeURIComponent(agent)}`,
};
