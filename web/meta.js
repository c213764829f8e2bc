// meta.js: reading the runs' hello meta, shared by the runs list and the
// compare view (a module of its own so that the runs list loads no chart
// code): its keys as dotted paths, a value at a path as text, the meta
// filters typed as "key=value, ...". Also the most runs compared at once.

/** The most runs the compare view overlays (and the runs list sends to it). */
export const MAX_RUNS = 10;

/** "reparam=sigma, lr=0.01" (commas or spaces between) as runs-list
 * query parameters {"meta.reparam": "sigma", "meta.lr": "0.01"}; a term
 * without "=" is left out. */
export function metaFilters(text) {
  const out = {};
  for (const t of String(text || '').split(/[,\s]+/)) {
    const i = t.indexOf('=');
    if (i > 0 && i < t.length - 1) out['meta.' + t.slice(0, i).replace(/^meta\./, '')] = t.slice(i + 1);
  }
  return out;
}

/** A hello meta value at a dotted path ("optimizer.lr"), as text; '' when absent. */
export function metaAt(meta, path) {
  const v = path.split('.').reduce((o, k) => (o && typeof o === 'object' ? o[k] : undefined), meta);
  if (v === undefined || v === null) return '';
  return typeof v === 'object' ? JSON.stringify(v) : String(v);
}

/** The dotted paths of a meta object's leaves, two levels deep at most
 * ("lr", "optimizer.lr"): what grouping and the runs list's columns offer. */
export function flatKeys(meta, prefix = '', depth = 0) {
  if (!meta || typeof meta !== 'object' || Array.isArray(meta)) return [];
  const out = [];
  for (const [k, v] of Object.entries(meta)) {
    if (v && typeof v === 'object' && !Array.isArray(v) && depth < 1) out.push(...flatKeys(v, prefix + k + '.', depth + 1));
    else out.push(prefix + k);
  }
  return out;
}
