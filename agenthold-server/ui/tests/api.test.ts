// Problem+json answers become ApiErrors whose detail the pages show.
import { describe, expect, it } from 'vitest';
import { ApiError } from '../src/lib/api/errors';

const response = (status: number, statusText = '') => new Response(null, { status, statusText });

describe('ApiError.from', () => {
  it('takes detail and code from a problem body', () => {
    const e = ApiError.from(response(403), { type: 'about:blank#forbidden', title: 'Forbidden', status: 403, detail: 'this needs the admin role', code: 'forbidden' });
    expect(e).toMatchObject({ status: 403, code: 'forbidden', detail: 'this needs the admin role' });
  });
  it('falls back to the title, then to the status', () => {
    expect(ApiError.from(response(409), { title: 'Conflict' }).detail).toBe('Conflict');
    expect(ApiError.from(response(502, 'Bad Gateway'), undefined).detail).toBe('502 Bad Gateway');
  });
  it('shows a short text body as it is', () => {
    expect(ApiError.from(response(500), 'engine down\n').detail).toBe('engine down');
  });
});
