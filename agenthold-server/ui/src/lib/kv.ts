// `KEY=VALUE` lines (environment, labels) and one-entry-per-line lists (allowlists).

/** Non-empty, trimmed lines; `#` starts a comment line. */
export function lines(text: string): string[] {
  return text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'));
}

/** `KEY=VALUE` lines as a map; throws naming the first line without '='. */
export function pairs(text: string, what: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const l of lines(text)) {
    const i = l.indexOf('=');
    if (i <= 0) throw new Error(`${what}: "${l}" is not KEY=VALUE`);
    out[l.slice(0, i).trim()] = l.slice(i + 1);
  }
  return out;
}
