// The typed API client: openapi-fetch over the types `npm run gen` generates from openapi.json (the server's
// own document). Every call is same-origin with the session cookie; an error answer (problem+json) becomes
// an ApiError whose `detail` the page shows in a role="alert" next to what failed. A 401 sends the browser
// to the sign-in page with the current path as `next`.
import createClient from 'openapi-fetch';
import type { components, paths } from './schema';
import { ApiError } from './errors';

export type Schemas = components['schemas'];

export { ApiError, message } from './errors';

/** Send the browser to the sign-in page, coming back here afterwards. */
export function toLogin(): void {
  const here = location.pathname + location.search;
  if (location.pathname !== '/login') location.assign(`/login?next=${encodeURIComponent(here)}`);
}

export const api = createClient<paths>({ baseUrl: '', credentials: 'same-origin' });

api.use({
  onResponse({ response }) {
    if (response.status === 401) toLogin();
    return undefined;
  },
});

type Answer<T> = { data?: T; error?: unknown; response: Response };

/** The data of a successful answer; an ApiError for anything else. */
export async function ok<T>(call: Promise<Answer<T>>): Promise<T> {
  const { data, error, response } = await call;
  if (!response.ok) throw ApiError.from(response, error);
  return data as T;
}

/**
 * A call outside the generated types (raw bodies, routes another branch adds): JSON in, JSON (or nothing)
 * out, errors as ApiError. `body` may be a Blob/ArrayBuffer for raw uploads.
 */
export async function raw(
  method: string,
  path: string,
  body?: unknown,
  init: { headers?: Record<string, string>; expect?: 'json' | 'blob' | 'text' } = {},
): Promise<unknown> {
  const headers: Record<string, string> = { accept: 'application/json', ...init.headers };
  let payload: BodyInit | undefined;
  if (body instanceof Blob || body instanceof ArrayBuffer) {
    payload = body;
    headers['content-type'] ??= 'application/octet-stream';
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers['content-type'] = 'application/json';
  }
  const response = await fetch(path, { method, headers, body: payload, credentials: 'same-origin' });
  if (response.status === 401) toLogin();
  if (!response.ok) {
    const text = await response.text();
    let parsed: unknown = text;
    try {
      parsed = JSON.parse(text);
    } catch {
      // not JSON: keep the text
    }
    throw ApiError.from(response, parsed);
  }
  if (response.status === 204) return undefined;
  if (init.expect === 'blob') return response.blob();
  if (init.expect === 'text') return response.text();
  const text = await response.text();
  return text ? JSON.parse(text) : undefined;
}
