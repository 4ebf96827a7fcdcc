// Unit tests of the UI's pure modules (argv splitting, routes, errors, times) in Node: `npm test`.
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: { include: ['tests/**/*.test.ts'], environment: 'node' },
});
