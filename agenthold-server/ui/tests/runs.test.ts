import { describe, expect, it } from 'vitest';
import { addEvent, originText, usageText, type RunItem } from '../src/lib/runs';

describe('run events', () => {
  it('joins a tool result to its call by id', () => {
    let items: RunItem[] = [];
    items = addEvent(items, { type: 'tool_call', id: 't1', name: 'Bash', input: { command: 'ls' } });
    items = addEvent(items, { type: 'tool_call', id: 't2', name: 'Read', input: { path: '/x' } });
    items = addEvent(items, { type: 'tool_result', id: 't1', output: 'a\nb', is_error: false });
    expect(items).toHaveLength(2);
    expect(items[0]).toMatchObject({ kind: 'tool', name: 'Bash', output: 'a\nb' });
    expect(items[1]).toMatchObject({ kind: 'tool', name: 'Read', output: null });
  });

  it('joins a result without an id to the last open call, else stands alone', () => {
    let items: RunItem[] = addEvent([], { type: 'tool_call', name: 'shell', input: 'echo hi' });
    items = addEvent(items, { type: 'tool_result', output: 'hi', is_error: true });
    expect(items[0]).toMatchObject({ output: 'hi', isError: true });
    items = addEvent(items, { type: 'tool_result', output: 'orphan' });
    expect(items).toHaveLength(2);
    expect(items[1]).toMatchObject({ kind: 'tool', name: 'tool result', output: 'orphan' });
  });

  it('joins raw lines of one stream and keeps streams apart', () => {
    let items: RunItem[] = [];
    for (const [stream, line] of [['stdout', 'a'], ['stdout', 'b'], ['stderr', 'c']])
      items = addEvent(items, { type: 'raw', stream, line });
    expect(items).toEqual([
      { kind: 'raw', stream: 'stdout', text: 'a\nb' },
      { kind: 'raw', stream: 'stderr', text: 'c' },
    ]);
  });

  it('ignores unknown types, shows usage and bounds the list', () => {
    expect(addEvent([], { type: 'mystery' })).toEqual([]);
    expect(usageText({ type: 'usage', input_tokens: 12, output_tokens: 3, cost_usd: 0.00123 })).toBe('12 tokens in · 3 out · $0.0012');
    expect(usageText({ type: 'usage' })).toBe('0 tokens in · 0 out');
    let items: RunItem[] = [];
    for (let i = 0; i < 20; i++) items = addEvent(items, { type: 'message', role: 'assistant', text: String(i) }, 5);
    expect(items).toHaveLength(5);
    expect(items[4]).toMatchObject({ text: '19' });
  });

  it('shows the session a run can be resumed from', () => {
    expect(addEvent([], { type: 'session', session_id: 's-1', model: 'm' })).toEqual([{ kind: 'session', id: 's-1', model: 'm' }]);
  });

  it('names a run origin', () => {
    expect(originText({ kind: 'user' })).toBe('user');
    expect(originText({ kind: 'webhook', webhook: 'wh_1' })).toBe('webhook');
    expect(originText({ kind: 'agent', agent: 'ag_2' })).toBe('agent ag_2');
    expect(originText(undefined)).toBe('user');
  });
});
