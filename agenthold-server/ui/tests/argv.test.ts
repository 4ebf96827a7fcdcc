// The exec form's word splitter: what a shell would make of the line, never a shell string.
import { describe, expect, it } from 'vitest';
import { shArgv, splitArgv } from '../src/lib/argv';

describe('splitArgv', () => {
  it('splits on blanks', () => {
    expect(splitArgv('  ls   -la\t/tmp ')).toEqual(['ls', '-la', '/tmp']);
  });
  it('keeps single quotes literal', () => {
    expect(splitArgv(`python3 -c 'print("a b"); x = $HOME'`)).toEqual(['python3', '-c', 'print("a b"); x = $HOME']);
  });
  it('reads double quotes with their escapes', () => {
    expect(splitArgv(`echo "a \\"b\\" \\\\ \\$x \\n"`)).toEqual(['echo', 'a "b" \\ $x \\n']);
  });
  it('joins adjacent quoted parts into one word', () => {
    expect(splitArgv(`a'b c'"d e"f`)).toEqual(['ab cd ef']);
  });
  it('keeps empty quoted words', () => {
    expect(splitArgv(`printf '' ""`)).toEqual(['printf', '', '']);
  });
  it('escapes one character with a backslash outside quotes', () => {
    expect(splitArgv('touch a\\ b \\;')).toEqual(['touch', 'a b', ';']);
  });
  it('does not interpret shell operators', () => {
    expect(splitArgv('ls | wc -l > out; rm -rf *')).toEqual(['ls', '|', 'wc', '-l', '>', 'out;', 'rm', '-rf', '*']);
  });
  it('refuses unterminated quotes and a trailing backslash', () => {
    expect(() => splitArgv(`echo 'a`)).toThrow(/single quote/);
    expect(() => splitArgv(`echo "a`)).toThrow(/double quote/);
    expect(() => splitArgv('echo a\\')).toThrow(/backslash/);
  });
  it('gives nothing for a blank line', () => {
    expect(splitArgv('   ')).toEqual([]);
  });
});

describe('shArgv', () => {
  it('passes the line whole to sh -c', () => {
    expect(shArgv('ls | wc -l')).toEqual(['sh', '-c', 'ls | wc -l']);
  });
});
