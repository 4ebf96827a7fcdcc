// The terminal page's CSP allows <style> elements only with the per-response nonce the server puts in
// <meta name="csp-nonce">. xterm.js creates such elements itself, so every <style> created from now on gets
// the nonce before it reaches the document. Imported before xterm.js (module order is import order).
const nonce = document.querySelector<HTMLMetaElement>('meta[name="csp-nonce"]')?.content ?? '';

type Patched = typeof document.createElement & { agentholdNonce?: true };

if (nonce && !(document.createElement as Patched).agentholdNonce) {
  const original = document.createElement.bind(document);
  const patched = function (tagName: string, options?: ElementCreationOptions): HTMLElement {
    const el = original(tagName, options);
    if (tagName.toLowerCase() === 'style') el.setAttribute('nonce', nonce);
    return el;
  } as Patched;
  patched.agentholdNonce = true;
  document.createElement = patched;
}

export const cspNonce = nonce;
