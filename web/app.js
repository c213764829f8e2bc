// app.js: the dashboard's entry point — picks the view from the URL
// (?run=ID: a run; ?view=compare&runs=A,B: compare; else the runs list),
// and swaps views on link clicks and history navigation without reloading.
// The run and compare views (charts, heatmap, uPlot) load when first shown:
// the runs list, the page most visits open on, does not wait for them.
import {RunsView} from './runs.js';
import {want} from './live.js';
import {applyTheme, setTheme, themeChoice, urlState} from './util.js';

let current = null;
let routes = 0;      // routes begun; a view that loaded after a newer one began is dropped
let uplot = null;

/** uPlot's classic script (index.html adds it when the page opens on a
 * chart view), loaded once; resolves when window.uPlot is there. */
function loadUPlot() {
  if (window.uPlot) return Promise.resolve();
  if (!uplot) uplot = new Promise((resolve, reject) => {
    let s = document.querySelector('script[data-uplot]');
    if (!s) {
      s = document.createElement('script');
      s.src = 'vendor/uplot/uPlot.iife.min.js';
      s.dataset.uplot = '';
      document.head.append(s);
    }
    s.addEventListener('load', () => resolve());
    s.addEventListener('error', () => { uplot = null; reject(new Error('cannot load uPlot')); });
  });
  return uplot;
}

/** The view class of a chart view, with its modules and uPlot loaded
 * (uPlot first: charts.js takes window.uPlot when it is evaluated). */
async function chartView(view) {
  await loadUPlot();
  const [mod, charts] = await Promise.all([view === 'run' ? import('./run.js') : import('./compare.js'),
    import('./charts.js')]);
  charts.setSmoothing(0);   // the run page sets its own from the URL
  return view === 'run' ? mod.RunView : mod.CompareView;
}

async function route() {
  const s = urlState.get();
  const seq = ++routes;
  if (current) current.destroy();
  current = null;
  want({});   // every run's step events, unless the new view asks for less
  const root = document.getElementById('app');
  root.textContent = '';
  const view = s.run ? 'run' : s.view === 'compare' ? 'compare' : 'runs';
  window.__render = {start: performance.now(), complete: false, completeAt: null, view};
  for (const a of document.querySelectorAll('header nav a'))
    a.classList.toggle('active', a.dataset.nav === view);
  if (view === 'runs') { current = new RunsView(root, s); return; }
  let View;
  try { View = await chartView(view); } catch (e) {
    if (seq === routes) root.textContent = `Cannot load the dashboard's ${view} view: ${e.message}. Reload the page.`;
    return;
  }
  if (seq === routes) current = new View(root, s);
}

/** In-page navigation: links with data-go="{json state}" or plain ./?...
 * links push a history entry and re-route instead of reloading. */
document.addEventListener('click', (e) => {
  const a = e.target.closest('a');
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey) return;
  const href = a.getAttribute('href');
  if (!href || !(href.startsWith('./') || href.startsWith('?'))) return;
  e.preventDefault();
  const u = new URL(href, location.href);
  const obj = Object.fromEntries(u.searchParams);
  urlState.go(obj);
  route();
});
window.addEventListener('popstate', route);

/** The header's theme toggle: system -> light -> dark -> system. */
const NEXT_THEME = {auto: 'light', light: 'dark', dark: 'auto'};
function showTheme() {
  const b = document.getElementById('theme-toggle');
  if (!b) return;
  const c = themeChoice();
  b.textContent = {auto: '◐ auto', light: '☀ light', dark: '☾ dark'}[c];
  b.title = `theme: ${c === 'auto' ? 'follows the system' : c} (click: ${NEXT_THEME[c] === 'auto' ? 'follow the system' : NEXT_THEME[c]})`;
  b.dataset.choice = c;
}
document.getElementById('theme-toggle')?.addEventListener('click', () => { setTheme(NEXT_THEME[themeChoice()]); showTheme(); });
applyTheme();
showTheme();
route();
