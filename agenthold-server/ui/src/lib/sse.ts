// Server-sent event streams of the API (same origin, so the session cookie goes along). The server numbers
// events and ends a stream with an `end` event; EventSource resumes with Last-Event-ID after a network error.

export type StreamHandlers = {
  /** Event types to listen for (besides `end`), with their handler; data is parsed JSON. */
  on: Record<string, (data: Record<string, unknown>) => void>;
  /** The stream ended (`end` event), with its reason. */
  onEnd?: (reason: string) => void;
  /** The stream failed for good (refused, or the server is gone). */
  onError?: (message: string) => void;
  /** Connected (or reconnected). */
  onOpen?: () => void;
};

/** Open `url` as an event stream; returns a function that closes it. */
export function openStream(url: string, h: StreamHandlers): () => void {
  const es = new EventSource(url, { withCredentials: true });
  let closed = false;
  const parse = (e: MessageEvent): Record<string, unknown> => {
    try {
      return JSON.parse(String(e.data)) as Record<string, unknown>;
    } catch {
      return {};
    }
  };
  for (const [type, fn] of Object.entries(h.on)) {
    es.addEventListener(type, (e) => fn(parse(e as MessageEvent)));
  }
  es.addEventListener('end', (e) => {
    closed = true;
    es.close();
    h.onEnd?.(String(parse(e as MessageEvent).reason ?? 'ended'));
  });
  es.onopen = () => h.onOpen?.();
  es.onerror = () => {
    if (closed) return;
    if (es.readyState === EventSource.CLOSED) {
      closed = true;
      h.onError?.('The live stream was refused or lost; reload to try again.');
    }
  };
  return () => {
    closed = true;
    es.close();
  };
}
