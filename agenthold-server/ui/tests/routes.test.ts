// Which page each UI path shows (the paths the browser tests and docs/ui.md name).
import { describe, expect, it } from 'vitest';
import { match } from '../src/lib/routes';

describe('match', () => {
  it('knows the top-level pages', () => {
    expect(match('/')).toEqual({ page: 'workspaces' });
    expect(match('/login')).toEqual({ page: 'login' });
    expect(match('/tokens')).toEqual({ page: 'tokens' });
    expect(match('/logins')).toEqual({ page: 'logins' });
  });
  it('knows the workspace pages', () => {
    expect(match('/w/ws1')).toEqual({ page: 'workspace', ws: 'ws1', tab: 'agents' });
    for (const tab of ['members', 'secrets', 'audit'] as const)
      expect(match(`/w/ws1/${tab}`)).toEqual({ page: 'workspace', ws: 'ws1', tab });
    expect(match('/w/ws1/agents/new')).toEqual({ page: 'new-agent', ws: 'ws1' });
  });
  it('knows the agent tabs', () => {
    expect(match('/w/ws1/agents/a1')).toEqual({ page: 'agent', ws: 'ws1', agent: 'a1', tab: 'overview' });
    for (const tab of [
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
    ] as const)
      expect(match(`/w/ws1/agents/a1/${tab}`)).toEqual({ page: 'agent', ws: 'ws1', agent: 'a1', tab });
  });
  it('answers not-found for anything else', () => {
    for (const p of ['/w', '/w/ws1/nope', '/w/ws1/agents/a1/nope', '/tokens/x', '/logins/x', '/login/local', '/w/ws1/agents/a1/execs/x'])
      expect(match(p)).toEqual({ page: 'not-found' });
  });
});
