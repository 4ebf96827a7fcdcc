// Svelte compiler options for the agenthold UI. No transitions or animations anywhere: they inject
// <style> elements, which the UI's CSP (style-src 'self') refuses.
import { vitePreprocess } from '@sveltejs/vite-plugin-svelte';

export default {
  preprocess: vitePreprocess(),
  compilerOptions: {
    // Component styles go to the CSS file, never into <style> elements at run time (CSP).
    css: 'external',
  },
};
