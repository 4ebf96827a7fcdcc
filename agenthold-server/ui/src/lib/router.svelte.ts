// History routing: links to UI paths navigate without a page load; links marked `data-reload` (the terminal,
// which needs its own CSP nonce) and paths the server owns (/api, /auth, /login/local) load a new page.

export type Route =
  | { page: 'login' }
  | { page: 'workspaces' }
  | { page: 'tokens' }
  | { page: 'workspace'; ws: string; tab: 'agents' | 'members' | 'secrets' | 'audit' }
  | { page: 'new-agent'; ws: string }
  | {
      page: 'agent';
      ws: string;
      agent: string;
      tab: 'overview' | 'terminal' | 'execs' | 'files' | 'policy' | 'requests' | 'secrets' | 'grants';
    }
  | { page: 'not-found' };

const agentTabs = ['terminal', 'execs', 'files', 'policy', 'requests', 'secrets', 'grants'] as const;
const wsTabs = ['members', 'secrets', 'audit'] as const;

/** The route of a path. */
export function match(path: string): Route {
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  if (parts.length === 0) return { page: 'workspaces' };
  if (parts[0] === 'login' && parts.length === 1) return { page: 'login' };
  if (parts[0] === 'tokens' && parts.length === 1) return { page: 'tokens' };
  if (parts[0] === 'w' && parts[1]) {
    const ws = parts[1];
    if (parts.length === 2) return { page: 'workspace', ws, tab: 'agents' };
    if (parts.length === 3 && (wsTabs as readonly string[]).includes(parts[2] as string))
      return { page: 'workspace', ws, tab: parts[2] as (typeof wsTabs)[number] };
    if (parts[2] === 'agents' && parts.length === 4 && parts[3] === 'new') return { page: 'new-agent', ws };
    if (parts[2] === 'agents' && parts[3]) {
      const agent = parts[3];
      if (parts.length === 4) return { page: 'agent', ws, agent, tab: 'overview' };
      if (parts.length === 5 && (agentTabs as readonly string[]).includes(parts[4] as string))
        return { page: 'agent', ws, agent, tab: parts[4] as (typeof agentTabs)[number] };
    }
  }
  return { page: 'not-found' };
}

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
