// util.js: small helpers shared by the views: units, number formats,
// colours, URL state, redraw throttling and lazy loading.

/** Units of the metrics the trainer reports (shared/science.md). Unknown
 * metrics get "value": every chart still states something. */
const UNITS = {
  loss: 'nats/token', eval_loss: 'nats/token', lr: 'learning rate', grad_norm: 'L2 norm',
  tokens_per_s: 'tokens/s', entropy: 'nats', entropy_bound: 'nats',
  entropy_norm: 'fraction of log Tᵢ (0–1)', sigma_qk: '‖W_Q W_Kᵀ‖₂/√d', max_logit: 'max |logit|',
  logit_scale: 'bound on ‖logit row − mean‖₂',
  eig_mean: 'mean of the d eigenvalues /√d', eig_var: 'mean |λ − mean|² over d', rank_ratio: '‖X−1x̄ᵀ‖_F/‖X‖_F',
  cos_sim: 'mean cosine', step_time: 's', time: 's',
};
export function unitOf(metric) {
  if (UNITS[metric]) return UNITS[metric];
  if (/^sigma/.test(metric)) return 'spectral norm σ(W)';
  if (/^gamma/.test(metric)) return 'γ (learned scale)';
  if (/_ms$/.test(metric)) return 'ms';
  if (/_s$|seconds/.test(metric)) return 's';
  return 'value';
}

const DESCR = {
  entropy: 'mean attention entropy per head',
  entropy_norm: 'attention entropy / its maximum log Tᵢ',
  entropy_bound: 'Theorem 3.1 lower bound on entropy (0 = vacuous: see logit_scale)',
  logit_scale: 'the bound’s argument: certified upper bound on a logit row’s centred norm',
  sigma_qk: 'spectral norm of the head’s QK product',
  max_logit: 'largest |attention logit| of the head',
  eig_mean: 'QK eigenspectrum mean', eig_var: 'QK eigenspectrum variance',
  rank_ratio: 'token-diversity ratio (0 = rank collapse)', cos_sim: 'mean pairwise token cosine',
};
export const describe = (m) => DESCR[m] || '';

/** A number for people: 4 significant digits, SI-free, steps as integers. */
export function fmt(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return '—';
  if (!Number.isFinite(v)) return v > 0 ? '+∞' : '−∞';
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-4)) return v.toExponential(digits - 2);
  return String(Number(v.toPrecision(digits)));
}
export const fmtStep = (s) => (s === null || s === undefined ? '—' : Math.round(s).toLocaleString('en-US'));

export function fmtAgo(unixSeconds) {
  if (!unixSeconds) return '—';
  const d = Date.now() / 1000 - unixSeconds;
  if (d < 2) return 'just now';
  if (d < 60) return `${Math.round(d)} s ago`;
  if (d < 3600) return `${Math.round(d / 60)} min ago`;
  if (d < 86400) return `${Math.round(d / 3600)} h ago`;
  return new Date(unixSeconds * 1000).toISOString().slice(0, 16).replace('T', ' ');
}

/** Distinct line colours (Tableau-like, readable on white); cycles for
 * more lines, shifting hue so 32 heads stay tellable apart. */
const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7',
                 '#9c755f', '#bab0ac', '#1f77b4', '#2ca02c'];
export function color(i, n = PALETTE.length) {
  if (n <= PALETTE.length) return PALETTE[i % PALETTE.length];
  return `hsl(${Math.round((i * 360) / n)}, 62%, 46%)`;
}

/** viridis(t), t in [0, 1] -> [r, g, b] 0..255 (polynomial fit of the
 * matplotlib map: perceptually even, readable in grey and by most colour-blind
 * people). Dark = low entropy = collapse. */
export function viridis(t) {
  t = Math.min(1, Math.max(0, t));
  const c = [
    [0.2777273272234177, 0.005407344544966578, 0.3340998053353061],
    [0.1050930431085774, 1.404613529898575, 1.384590162594685],
    [-0.3308618287255563, 0.214847559468213, 0.09509516302823659],
    [-4.634230498983486, -5.799100973351585, -19.33244095627987],
    [6.228269936347081, 14.17993336680509, 56.69055260068105],
    [4.776384997670288, -13.74514537774601, -65.35303263337234],
    [-5.435455855934631, 4.645852612178535, 26.3124352495832],
  ];
  const out = [0, 0, 0];
  for (let k = 0; k < 3; k++) {
    let v = c[6][k];
    for (let i = 5; i >= 0; i--) v = c[i][k] + t * v;
    out[k] = Math.round(255 * Math.min(1, Math.max(0, v)));
  }
  return out;
}
export const VIRIDIS_LUT = (() => {
  const lut = new Uint8ClampedArray(256 * 3);
  for (let i = 0; i < 256; i++) lut.set(viridis(i / 255), i * 3);
  return lut;
})();

/* ---- contrast and the theme's colour scale ------------------------------
 * WCAG 2 relative luminance and contrast ratio, and viridis re-lit for a
 * card colour: viridis itself runs from a purple that vanishes into a dark
 * card (1.1:1 on #1c2027) to a yellow that vanishes into a white one
 * (1.3:1). The scale keeps viridis' hues and order and moves its OKLab
 * lightness into the band where both ends stand at least SCALE_CONTRAST
 * against the card: on a light card the upper end darkens (yellow becomes
 * a dark gold), on a dark card the lower end lightens (the purple becomes
 * a violet). Lightness stays linear along the scale, as viridis' is. */
export const SCALE_CONTRAST = 3.3;
const srgbLin = (c) => { c /= 255; return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
const linSrgb = (x) => 255 * (x <= 0.0031308 ? 12.92 * x : 1.055 * x ** (1 / 2.4) - 0.055);
/** Relative luminance of [r, g, b] (0..255), WCAG 2. */
export function luminance([r, g, b]) { return 0.2126 * srgbLin(r) + 0.7152 * srgbLin(g) + 0.0722 * srgbLin(b); }
/** Contrast ratio of two colours, 1..21 (WCAG 2). */
export function contrast(a, b) {
  const x = luminance(a), y = luminance(b);
  return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05);
}
/** A CSS colour as [r, g, b] (through the browser's parser). */
export function cssRGB(css) {
  const m = /^#([0-9a-f]{6})$/i.exec(css.trim());
  if (m) return [0, 2, 4].map((k) => parseInt(m[1].slice(k, k + 2), 16));
  const d = document.createElement('div');
  d.style.color = css;
  document.body.append(d);
  const v = getComputedStyle(d).color.match(/[\d.]+/g).map(Number).slice(0, 3);
  d.remove();
  return v;
}
function oklab([r, g, b]) {
  const [R, G, B] = [r, g, b].map(srgbLin);
  const l = Math.cbrt(0.4122214708 * R + 0.5363325363 * G + 0.0514459929 * B);
  const m = Math.cbrt(0.2119034982 * R + 0.6806995451 * G + 0.1073969566 * B);
  const s = Math.cbrt(0.0883024619 * R + 0.2817188376 * G + 0.6299787005 * B);
  return [0.2104542553 * l + 0.793617785 * m - 0.0040720468 * s, 1.9779984951 * l - 2.428592205 * m + 0.4505937099 * s,
          0.0259040371 * l + 0.7827717662 * m - 0.808675766 * s];
}
/** Linear sRGB of an OKLab colour (may be out of gamut). */
function oklabLin([L, a, b]) {
  const l = (L + 0.3963377774 * a + 0.2158037573 * b) ** 3, m = (L - 0.1055613458 * a - 0.0638541728 * b) ** 3,
        s = (L - 0.0894841775 * a - 1.291485548 * b) ** 3;
  return [4.0767416621 * l - 3.3077115913 * m + 0.2309699292 * s, -1.2684380046 * l + 2.6097574011 * m - 0.3413193965 * s,
          -0.0041960863 * l - 0.7034186147 * m + 1.707614701 * s];
}
/** OKLab to [r, g, b], chroma reduced (hue and lightness kept) until in gamut. */
function fromOklab([L, a, b]) {
  const inGamut = (k) => oklabLin([L, a * k, b * k]).every((x) => x >= -1e-4 && x <= 1 + 1e-4);
  let k = 1;
  if (!inGamut(1)) { let lo = 0, hi = 1; for (let i = 0; i < 16; i++) { const m = (lo + hi) / 2; if (inGamut(m)) lo = m; else hi = m; } k = lo; }
  return oklabLin([L, a * k, b * k]).map((x) => Math.round(Math.min(255, Math.max(0, linSrgb(Math.min(1, Math.max(0, x)))))));
}
const VIRIDIS_LAB = Array.from({length: 256}, (_, i) => oklab(viridis(i / 255)));
const scaleCache = new Map();
/** The colour scale (256 x [r, g, b], low to high) for a card colour:
 * viridis with its lightness moved so that both ends are at least
 * SCALE_CONTRAST:1 against the card (see above). Cached per card. */
export function scaleFor(card) {
  const key = card.join(',');
  if (scaleCache.has(key)) return scaleCache.get(key);
  const L0 = VIRIDIS_LAB[0][0], L1 = VIRIDIS_LAB[255][0];
  const at = (lo, hi, i) => { const c = VIRIDIS_LAB[i]; return fromOklab([lo + ((c[0] - L0) * (hi - lo)) / (L1 - L0), c[1], c[2]]); };
  const ok = (rgb) => contrast(rgb, card) >= SCALE_CONTRAST;
  let lo = L0, hi = L1;
  const darkCard = luminance(card) < 0.18;
  // move the one end that fails, as little as it takes (bisection on its lightness)
  if (darkCard && !ok(at(lo, hi, 0))) { let a = L0, b = L1; for (let i = 0; i < 24; i++) { const m = (a + b) / 2; if (ok(at(m, hi, 0))) b = m; else a = m; } lo = b; }
  if (!darkCard && !ok(at(lo, hi, 255))) { let a = L0, b = L1; for (let i = 0; i < 24; i++) { const m = (a + b) / 2; if (ok(at(lo, m, 255))) a = m; else b = m; } hi = a; }
  const lut = new Uint8ClampedArray(256 * 3);
  for (let i = 0; i < 256; i++) lut.set(at(lo, hi, i), i * 3);
  scaleCache.set(key, lut);
  return lut;
}

/** Calls fn at most once per animation frame with the latest arguments. */
export function rafThrottle(fn) {
  let queued = false, last;
  return (...args) => {
    last = args;
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; fn(...last); });
  };
}

/** The URL's query parameters as the page state. set() replaces the
 * history entry (no new entry per scrub), go() pushes one. */
export const urlState = {
  get() { return Object.fromEntries(new URLSearchParams(location.search)); },
  _write(obj, push) {
    const u = new URLSearchParams();
    for (const [k, v] of Object.entries(obj)) if (v !== undefined && v !== null && v !== '') u.set(k, v);
    const s = u.toString();
    const url = location.pathname + (s ? '?' + s : '');
    if (url === location.pathname + location.search) return;
    if (push) history.pushState(null, '', url); else history.replaceState(null, '', url);
  },
  set(patch) { this._write({...this.get(), ...patch}, false); },
  /** set() as a new history entry: Back undoes it (a view change). */
  push(patch) { this._write({...this.get(), ...patch}, true); },
  go(obj) { const t = this.get().token; this._write({...obj, token: t}, true); },
};

/** Runs load() the first time el comes near the viewport (or at once when
 * lazy loading is off: ?lazy=0, used by the benchmark to load everything). */
const lazyOff = new URLSearchParams(location.search).get('lazy') === '0';
const io = 'IntersectionObserver' in window && !lazyOff
  ? new IntersectionObserver((entries) => {
      for (const e of entries) {
        if (!e.isIntersecting) continue;
        io.unobserve(e.target);
        const f = e.target.__lazy;
        e.target.__lazy = null;
        if (f) f();
      }
    }, {rootMargin: '150px 0px'})
  : null;
export function whenVisible(el, load) {
  if (!io) { load(); return; }
  el.__lazy = load;
  io.observe(el);
}
export function forgetVisible(el) { if (io) io.unobserve(el); el.__lazy = null; }

/** document.createElement with attributes and children. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false)
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

/** Exponential moving average of a column, TensorBoard's way: weight a on
 * the past, debiased at the start; null and undefined entries (gaps, steps
 * without the metric) stay as they are and do not reset the average. */
export function ema(col, a) {
  const out = new Array(col.length);
  let last = 0, n = 0;
  for (let i = 0; i < col.length; i++) {
    const v = col[i];
    if (v === null || v === undefined || !Number.isFinite(v)) { out[i] = v; continue; }
    last = last * a + (1 - a) * v;
    n++;
    out[i] = last / (1 - a ** n);
  }
  return out;
}

/** Saves blob as a file named name (the browser's download). */
export function downloadBlob(name, blob) {
  const url = URL.createObjectURL(blob);
  const a = h('a', {href: url, download: name, hidden: true});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

/* ---- theme ---------------------------------------------------------------
 * Light or dark: the system's (prefers-color-scheme) unless the header's
 * toggle chose one, kept in localStorage. <html data-theme> holds the theme
 * in force; canvases read their colours from the CSS variables through
 * themeColors() and redraw on the 'themechange' window event. */
const THEME_KEY = 'entropyd.theme';
const darkQuery = window.matchMedia ? window.matchMedia('(prefers-color-scheme: dark)') : null;
export function themeChoice() {
  try { return localStorage.getItem(THEME_KEY) || 'auto'; } catch { return 'auto'; }
}
export function applyTheme(choice = themeChoice()) {
  const dark = choice === 'dark' || (choice === 'auto' && darkQuery && darkQuery.matches);
  const t = dark ? 'dark' : 'light';
  const changed = document.documentElement.dataset.theme !== t;
  document.documentElement.dataset.theme = t;
  document.documentElement.dataset.themeChoice = choice;
  if (changed) window.dispatchEvent(new Event('themechange'));
  return t;
}
export function setTheme(choice) {
  try { if (choice === 'auto') localStorage.removeItem(THEME_KEY); else localStorage.setItem(THEME_KEY, choice); } catch { /* private mode */ }
  return applyTheme(choice);
}
if (darkQuery) darkQuery.addEventListener('change', () => applyTheme());
export function themeColors() {
  const cs = getComputedStyle(document.documentElement);
  const v = (k, d) => (cs.getPropertyValue(k) || '').trim() || d;
  return {bg: v('--card', '#fff'), ink: v('--ink', '#1f2430'), axis: v('--axis', '#3a4150'),
          grid: v('--grid', '#eceef1'), tick: v('--tick', '#d6d9de'), muted: v('--muted', '#6b7280')};
}
