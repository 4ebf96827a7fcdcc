// Relative times ("3 min ago") with the exact time for a title attribute.

const units: [Intl.RelativeTimeFormatUnit, number][] = [
  ['year', 365 * 24 * 3600],
  ['month', 30 * 24 * 3600],
  ['week', 7 * 24 * 3600],
  ['day', 24 * 3600],
  ['hour', 3600],
  ['minute', 60],
  ['second', 1],
];
const rtf = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto', style: 'short' });

/** A Date from RFC 3339 text or Unix seconds; null when absent or unreadable. */
export function toDate(t: string | number | null | undefined): Date | null {
  if (t === null || t === undefined || t === '') return null;
  const d = typeof t === 'number' ? new Date(t * 1000) : new Date(t);
  return Number.isNaN(d.getTime()) ? null : d;
}

/** "5 min ago", "in 3 days". */
export function relative(t: string | number | null | undefined, now = Date.now()): string {
  const d = toDate(t);
  if (!d) return '—';
  const secs = Math.round((d.getTime() - now) / 1000);
  const abs = Math.abs(secs);
  if (abs < 10) return 'just now';
  for (const [unit, size] of units) {
    if (abs >= size) return rtf.format(Math.round(secs / size), unit);
  }
  return 'just now';
}

/** The exact local time, for a title. */
export function exact(t: string | number | null | undefined): string {
  const d = toDate(t);
  return d ? d.toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'medium' }) + ` (${d.toISOString()})` : '';
}
