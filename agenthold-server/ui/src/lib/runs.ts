// A harness run's events (SSE `…/runs/{run}/events`) as items a page shows: the server has already normalised
// Claude Code's and Codex's output into message / tool_call / tool_result / usage / result / raw events, so
// this only folds them for display (pure, so it is unit-tested without a browser).

/** One normalised run event, as the server sends it (`data:` of the SSE event). */
export type RunEvent = { type: string; [key: string]: unknown };

/** What the page shows for one event. */
export type RunItem =
  | { kind: 'message'; role: string; text: string }
  | { kind: 'tool'; id: string | null; name: string; input: string; output: string | null; isError: boolean }
  | { kind: 'usage'; text: string }
  | { kind: 'result'; text: string; isError: boolean }
  | { kind: 'raw'; stream: string; text: string }
  | { kind: 'state'; state: string }
  | { kind: 'session'; id: string; model: string | null };

const str = (v: unknown): string => (typeof v === 'string' ? v : v === undefined || v === null ? '' : JSON.stringify(v, null, 2));

/** The usage line: tokens in and out, and the cost when the harness reported one. */
export function usageText(e: RunEvent): string {
  const parts = [`${Number(e.input_tokens ?? 0)} tokens in`, `${Number(e.output_tokens ?? 0)} out`];
  if (typeof e.cost_usd === 'number') parts.push(`$${e.cost_usd.toFixed(4)}`);
  return parts.join(' · ');
}

/**
 * Fold `event` into `items` (a new array): a tool result joins the tool call with its id (or the last call
 * without a result when the harness gave no id); consecutive raw lines of one stream join into one block.
 */
export function addEvent(items: RunItem[], event: RunEvent, max = 5000): RunItem[] {
  const next = items.slice();
  switch (event.type) {
    case 'message':
      next.push({ kind: 'message', role: str(event.role) || 'assistant', text: str(event.text) });
      break;
    case 'tool_call':
      next.push({
        kind: 'tool',
        id: typeof event.id === 'string' ? event.id : null,
        name: str(event.name) || 'tool',
        input: str(event.input),
        output: null,
        isError: false,
      });
      break;
    case 'tool_result': {
      const id = typeof event.id === 'string' ? event.id : null;
      let at = -1;
      for (let i = next.length - 1; i >= 0; i--) {
        const it = next[i];
        if (it?.kind === 'tool' && it.output === null && (id === null || it.id === id)) {
          at = i;
          break;
        }
      }
      const output = str(event.output);
      const isError = event.is_error === true;
      const found = at >= 0 ? next[at] : undefined;
      if (found && found.kind === 'tool') next[at] = { ...found, output, isError };
      else next.push({ kind: 'tool', id, name: 'tool result', input: '', output, isError });
      break;
    }
    case 'usage':
      next.push({ kind: 'usage', text: usageText(event) });
      break;
    case 'result':
      next.push({ kind: 'result', text: str(event.text), isError: event.is_error === true });
      break;
    case 'state':
      next.push({ kind: 'state', state: str(event.state) });
      break;
    case 'session':
      next.push({ kind: 'session', id: str(event.session_id), model: typeof event.model === 'string' ? event.model : null });
      break;
    case 'raw': {
      const stream = str(event.stream) || 'stdout';
      const line = str(event.line);
      const last = next[next.length - 1];
      if (last && last.kind === 'raw' && last.stream === stream) next[next.length - 1] = { ...last, text: `${last.text}\n${line}` };
      else next.push({ kind: 'raw', stream, text: line });
      break;
    }
    default:
      break;
  }
  return next.length > max ? next.slice(next.length - max) : next;
}

/** Every event type the server sends besides `end`. */
export const RUN_EVENT_TYPES = ['session', 'message', 'tool_call', 'tool_result', 'usage', 'result', 'raw', 'state'] as const;

/** Who started a run, for a list row. */
export function originText(origin: { kind?: string; agent?: string | null; webhook?: string | null } | undefined): string {
  switch (origin?.kind) {
    case 'webhook':
      return 'webhook';
    case 'agent':
      return `agent ${origin.agent ?? ''}`.trim();
    default:
      return 'user';
  }
}
