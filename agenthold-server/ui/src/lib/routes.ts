// The UI's routes: which page a path shows (pure, so it is unit-tested without a browser).

export type Route =
  | { page: 'login' }
  | { page: 'workspaces' }
  | { page: 'tokens' }
  | { page: 'logins' }
  | { page: 'workspace'; ws: string; tab: 'agents' | 'members' | 'secrets' | 'audit' }
  | { page: 'new-agent'; ws: string }
  | {
      page: 'agent';
      ws: string;
      agent: string;
      tab: AgentTab;
    }
  | { page: 'not-found' };

const agentTabs = [
  'terminal',
  'runs',
  'execs',
  'files',
  'policy',
  'requests',
  'secrets',
  'webhooks',
  'messages',
  'grants',
] as const;

/** An agent page's tab. */
export type AgentTab = 'overview' | (typeof agentTabs)[number];
const wsTabs = ['members', 'secrets', 'audit'] as const;

/** The route of a path. */
export function match(path: string): Route {
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  if (parts.length === 0) return { page: 'workspaces' };
  if (parts[0] === 'login' && parts.length === 1) return { page: 'login' };
  if (parts[0] === 'tokens' && parts.length === 1) return { page: 'tokens' };
  if (parts[0] === 'logins' && parts.length === 1) return { page: 'logins' };
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
