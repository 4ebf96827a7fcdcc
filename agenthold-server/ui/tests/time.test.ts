// Relative times and their exact form.
import { describe, expect, it } from 'vitest';
import { exact, relative, toDate } from '../src/lib/time';

describe('time', () => {
  const now = Date.parse('2026-12-01T12:00:00Z');
  it('reads RFC 3339 and Unix seconds', () => {
    expect(toDate('2026-12-01T11:00:00Z')?.getTime()).toBe(now - 3600_000);
    expect(toDate(now / 1000)?.getTime()).toBe(now);
    expect(toDate('nonsense')).toBeNull();
    expect(toDate(null)).toBeNull();
  });
  it('says how long ago', () => {
    expect(relative('2026-12-01T11:59:58Z', now)).toBe('just now');
    expect(relative('2026-12-01T11:55:00Z', now)).toMatch(/5 min/);
    expect(relative('2026-11-28T12:00:00Z', now)).toMatch(/3 days ago/);
    expect(relative('2026-12-02T12:00:00Z', now)).toMatch(/tomorrow|in 1 day/);
    expect(relative(undefined, now)).toBe('—');
  });
  it('gives the exact time with the ISO form', () => {
    expect(exact('2026-12-01T11:00:00Z')).toContain('2026-12-01T11:00:00.000Z');
    expect(exact(null)).toBe('');
  });
});
