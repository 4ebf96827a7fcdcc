// API errors: a problem+json answer (or any failed call) as an ApiError whose `detail` a page shows.

/** A failed API call, from its problem+json body when it has one. */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly detail: string;

  constructor(status: number, code: string, detail: string) {
    super(detail);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.detail = detail;
  }

  /** From a response and its (parsed or text) body. */
  static from(response: Response, body: unknown): ApiError {
    if (body && typeof body === 'object') {
      const p = body as { detail?: unknown; code?: unknown; title?: unknown };
      const detail = typeof p.detail === 'string' ? p.detail : typeof p.title === 'string' ? p.title : '';
      const code = typeof p.code === 'string' ? p.code : 'error';
      return new ApiError(response.status, code, detail || `${response.status} ${response.statusText}`);
    }
    const text = typeof body === 'string' && body.length < 300 ? body.trim() : '';
    return new ApiError(response.status, 'error', text || `${response.status} ${response.statusText}`);
  }
}

/** The message to show for any thrown value. */
export function message(e: unknown): string {
  if (e instanceof ApiError) return e.detail;
  if (e instanceof Error) return e.message;
  return String(e);
}
