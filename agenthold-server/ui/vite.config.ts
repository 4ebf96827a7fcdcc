// Vite configuration of the agenthold UI. `npm run build` writes dist/ (embedded by the server);
// `npm run dev` serves the UI with the API proxied to a running `agenthold serve` (AGENTHOLD_URL,
// default http://127.0.0.1:8080).
import { defineConfig } from 'vite';
import { svelte } from '@sveltejs/vite-plugin-svelte';

const target = process.env.AGENTHOLD_URL ?? 'http://127.0.0.1:8080';

// The server checks the WebSocket's Origin against its public URL: present the proxied requests as its own.
const proxy = {
  target,
  changeOrigin: true,
  ws: true,
  headers: { origin: target },
};

export default defineConfig({
  plugins: [svelte()],
  build: {
    outDir: 'dist',
    assetsDir: 'assets',
    // The server sends CSP `script-src 'self'`: no inline module preload polyfill.
    modulePreload: { polyfill: false },
    sourcemap: false,
    chunkSizeWarningLimit: 600,
  },
  server: {
    proxy: {
      '/api': proxy,
      '/auth': proxy,
      '/login/local': proxy,
    },
  },
});
