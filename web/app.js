// app.js: the dashboard's entry point — picks the view from the URL
// (?run=ID: a run; ?view=compare&runs=A,B: compare; else the runs list),
// and swaps views on link clicks and history navigation without reloading.
import {RunsView} from './runs.js';
import {RunView} from './run.js';
import {CompareView} from './compare.js';
import {setSmoothing} from './charts.js';
import {applyTheme, setTheme, themeChoice, urlState} from './util.js';

let current = null;

function route() {
  const s = urlState.get();
  if (current) current.destroy();
  setSmoothing(0);   // the run page sets its own from the URL
  const root = document.getElementById('app');
  root.textContent = '';
  window.__render = {start: performance.now(), complete: false, completeAt: null, view: null};
  let view = 'runs';
  if (s.run) { current = new RunView(root, s); view = 'run'; }
  else if (s.view === 'compare') { current = new CompareView(root, s); view = 'compare'; }
  else current = new RunsView(root, s);
  window.__render.view = view;
  for (const a of document.querySelectorAll('header nav a'))
    a.classList.toggle('active', a.dataset.nav === view);
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
