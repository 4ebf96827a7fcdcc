// A shell-like splitter for the exec form: words separated by blanks, with '…' (literal), "…" (backslash
// escapes \" \\ \$ \`) and a backslash outside quotes escaping the next character. No expansion, no
// operators: the words are sent as argv, never as a shell string.

/** The words of `line`; throws on an unterminated quote or a trailing backslash. */
export function splitArgv(line: string): string[] {
  const words: string[] = [];
  let word = '';
  let inWord = false;
  let i = 0;
  while (i < line.length) {
    const c = line[i] as string;
    if (c === ' ' || c === '\t' || c === '\n') {
      if (inWord) {
        words.push(word);
        word = '';
        inWord = false;
      }
      i++;
    } else if (c === "'") {
      const end = line.indexOf("'", i + 1);
      if (end < 0) throw new Error('unterminated single quote');
      word += line.slice(i + 1, end);
      inWord = true;
      i = end + 1;
    } else if (c === '"') {
      i++;
      inWord = true;
      for (;;) {
        if (i >= line.length) throw new Error('unterminated double quote');
        const d = line[i] as string;
        if (d === '"') {
          i++;
          break;
        }
        if (d === '\\' && i + 1 < line.length && '"\\$`'.includes(line[i + 1] as string)) {
          word += line[i + 1];
          i += 2;
        } else {
          word += d;
          i++;
        }
      }
    } else if (c === '\\') {
      if (i + 1 >= line.length) throw new Error('trailing backslash');
      word += line[i + 1];
      inWord = true;
      i += 2;
    } else {
      word += c;
      inWord = true;
      i++;
    }
  }
  if (inWord) words.push(word);
  return words;
}

/** The argv for a line the user chose to run through `sh -c`. */
export function shArgv(line: string): string[] {
  return ['sh', '-c', line];
}
