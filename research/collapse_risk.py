"""The collapse-risk study of `make experiments` (research/experiments.py
--part predict): can an alert on the streamed metrics fire before a harmful
entropy collapse begins, on runs of configurations nobody tuned it for?

The runs are the broad sweep of research/sweep.py, split by configuration
into a tune half and a held-out half before anything is tuned. Ground
truth is the daemon's own verdict: a run *collapses* when the built-in
`entropy_collapse` fires (entropy_norm below 0.05 on 20 of 30 steps while
the loss does not train; its start_step is the step the collapse begins);
it is *healthy* (trains fine) when that never fires, the trainer exits 0,
the final validation loss is finite and below ln 64 and the training loss
never diverges (divergence_step); every other run counts for neither.

This module:
  - collect(): the stored series a run's row keeps (per head, per step);
  - simulate(): every candidate rule of the grid (candidate_rules(): rules
    of the daemon's own language, so any one of them can ship) evaluated on
    those series with the engine's semantics (daemon/alert.c), as bitsets;
  - tune(): models (an OR of up to three candidate rules) ranked on the
    tune half only;
  - judge() / summarize(): recall, false alarms and lead quartiles with
    bootstrap intervals (resampling configurations, not runs: seeds of one
    configuration are not independent), for the model and for the
    built-in rules alone (from the daemon's alerts);
  - the report, docs/collapse-risk.md, and its plot.
Not the driver (experiments.py) nor the sweep's definition (sweep.py).
Standard library only (plus gnuplot for the plot)."""
import collections
import json
import math
import os
import random

import plot

SIGNALS = ("entropy_norm", "max_logit", "sigma_qk")
SCALARS = ("loss", "grad_norm")
LATE_AFTER = 200     # a "late" collapse begins after this step
EARLY_BY = 20        # an "early" collapse begins at or before this step
TARGETS = dict(recall=0.90, false_alarms=0.05, median_lead=50)
BOOT = 2000          # bootstrap resamples (of configurations)


def collect(d, run_id, last_step):
    """Per-head series of the signals (one value per step), the scalars."""
    pts = max(1, int(last_step or 1)) + 1
    out = {"signals": {}}
    for metric in SIGNALS:
        try:
            s = d.get("/api/runs/%d/series?metric=%s&split=head&points=%d" % (run_id, metric, pts))
        except Exception:  # a metric the trainer did not send
            continue
        out["step"] = s.get("step", [])
        out["signals"][metric] = [ser.get("max", []) for ser in s.get("series", [])]
    out["scalars"] = {}
    for metric in SCALARS:
        s = d.get("/api/runs/%d/series?metric=%s&points=%d" % (run_id, metric, pts))
        out["scalar_step"], out["scalars"][metric] = s.get("step", []), s.get("max", [])
    out["loss_step"], out["loss"] = out["scalar_step"], out["scalars"]["loss"]
    return out


def divergence_step(steps, loss):
    """First step whose loss is non-finite (null) or 1 nat above its running
    minimum, after step 20; None when neither happens."""
    best = None
    for s, v in zip(steps, loss):
        if v is None or not math.isfinite(v):
            if s > 0:
                return s
            continue
        if best is not None and s > 20 and v > best + 1.0:
            return s
        best = v if best is None else min(best, v)
    return None


def fires(alerts):
    """{rule: first firing step} from a run's stored episodes (the step of
    the episode's FIRING transition, else its start_step)."""
    out = {}
    for a in alerts:
        if a.get("start_step") is None:
            continue
        steps = [t.get("step") for t in a.get("transitions") or []
                 if t.get("transition") == "firing" and t.get("step") is not None]
        step = min(steps) if steps else a["start_step"]
        if a["rule"] not in out or step < out[a["rule"]]:
            out[a["rule"]] = step
    return out


# ---- the engine's semantics on stored series, as bitsets --------------------
# Bit t of a condition is the condition at the run's t-th logged step. A
# rule with `for` K fires on the first step whose condition held on it and
# on the K steps before (bits t-K..t), in some head, while its
# unless_training guard (if any) does not say the loss trains. One Python
# int per head and condition: a grid of ~600 rules over 216 runs simulates in
# about a minute, where lists of booleans took most of an hour.

def _bits(bools):
    s = "".join("1" if b else "0" for b in reversed(bools))
    return int(s, 2) if s else 0


def _fin(x):
    return x is not None and math.isfinite(x)


def _cond_list(v, c):
    """Booleans per step of condition c (a rule's condition without its
    guard) on the series v, as eval_cell evaluates it: the window is the w
    values before this one (growth: full once w were seen; drop: its max
    over the finite ones seen so far, up to w)."""
    op = c["op"]
    if op == "below":
        return [_fin(x) and x < c["value"] for x in v]
    if op == "above":
        return [_fin(x) and x > c["value"] for x in v]
    if op == "growth":
        w, rate, cap = c["window"], c["rate"], c.get("value", float("inf"))
        out = []
        for t, x in enumerate(v):
            ok = False
            if _fin(x):
                if x > cap:
                    ok = True
                elif t >= w and _fin(v[t - w]) and (x - v[t - w]) / w > rate:
                    ok = True
            out.append(ok)
        return out
    if op == "drop":
        w, f = c["window"], 1 - c["pct"] / 100.0
        out, dq = [], collections.deque()  # indexes of the window's finite values, decreasing
        for t, x in enumerate(v):
            while dq and dq[0] < t - w:
                dq.popleft()
            m = v[dq[0]] if dq else None
            out.append(_fin(x) and m is not None and m > 0 and x < f * m)
            if _fin(x):
                while dq and v[dq[-1]] <= x:
                    dq.pop()
                dq.append(t)
        return out
    raise ValueError(op)


class RunSeries:
    """One run's stored series on the head steps' index, with cached
    condition bitsets per head."""

    def __init__(self, data):
        self.steps = data.get("step") or []
        self.sig = data.get("signals") or {}
        at = {s: i for i, s in enumerate(self.steps)}
        self.scal = {}
        for m, vals in (data.get("scalars") or {}).items():
            v = [None] * len(self.steps)
            for s, x in zip(data.get("scalar_step") or [], vals):
                if s in at:
                    v[at[s]] = x
            self.scal[m] = v
        self.cache = {}

    def ok(self):
        return bool(self.steps) and "entropy_norm" in self.sig

    def heads(self, metric, c):
        """[bitset per head] of condition c on the head metric."""
        key = ("h", metric, json.dumps(c, sort_keys=True))
        if key not in self.cache:
            self.cache[key] = [_bits(_cond_list(v, c)) for v in self.sig[metric]]
        return self.cache[key]

    def scalar(self, metric, c):
        key = ("s", metric, json.dumps(c, sort_keys=True))
        if key not in self.cache:
            self.cache[key] = _bits(_cond_list(self.scal[metric], c))
        return self.cache[key]

    def training(self, metric, below):
        """Bitset of the steps where unless_training says the loss trains:
        its smoothed level (an exponential mean over ~20 steps after the
        10 opening values) below `below` x its opening level (the lowest of
        the first 10 finite values), as daemon/alert.c computes it."""
        key = ("t", metric, below)
        if key not in self.cache:
            out, n, opening, smooth = [], 0, None, None
            for x in self.scal.get(metric, []):
                if _fin(x):
                    if n < 10:
                        opening = x if n == 0 or x < opening else opening
                        smooth, n = x, n + 1
                    else:
                        smooth += (x - smooth) * (2.0 / 21)
                out.append(n >= 10 and smooth < below * opening)
            self.cache[key] = _bits(out)
        return self.cache[key]


def _held(x, need):
    y = x
    for j in range(1, need + 1):
        y &= x << j
    return y


def simulate_rule(rs, rule):
    """The step at which rule first fires on run series rs; None if never;
    "unsupported" for what the simulation does not evaluate."""
    c = {k: v for k, v in rule["condition"].items() if k not in ("and", "clear_value")}
    need = rule.get("for", 0)
    if not isinstance(need, int) or c.get("op") not in ("below", "above", "growth", "drop"):
        return "unsupported"
    scope, metric = rule.get("scope", "head"), rule["metric"]
    if scope == "head":
        if metric not in rs.sig:
            return None
        bits = rs.heads(metric, c)
        g = rule["condition"].get("and")
        if g:
            if g["metric"] not in rs.sig:
                return None
            gb = rs.heads(g["metric"], {"op": g["op"], "value": g["value"]})
            bits = [b & x for b, x in zip(bits, gb)]
        any_head = 0
        for b in bits:
            any_head |= _held(b, need)
    elif scope == "scalar":
        if metric not in rs.scal:
            return None
        any_head = _held(rs.scalar(metric, c), need)
    else:
        return "unsupported"
    u = rule.get("unless_training")
    if u:
        any_head &= ~rs.training(u["metric"], u["below"])
    if not any_head:
        return None
    return rs.steps[(any_head & -any_head).bit_length() - 1]


# ---- the grid ---------------------------------------------------------------

UNLESS = {"metric": "loss", "below": 0.8}


def candidate_rules():
    """[rule] of the grid searched on the tune half, each a rule of the
    daemon's language named cand-NNN:
      growth of max_logit or sigma_qk (a rate per step over a window), alone or
        with a level guard of a second metric;
      a level of max_logit or sigma_qk (above V): no history needed;
      a drop of entropy_norm (below a fraction of its recent maximum): it needs
        one step of history, so it can answer the collapses of the first steps;
      entropy_norm below V;
      growth of the loss or of grad_norm (scalars);
    the level, drop and below ones also with unless_training (the loss trains:
    a head that sharpens then is not a risk)."""
    out = []
    rates = {"max_logit": (0.5, 1, 2, 5, 10), "sigma_qk": (0.02, 0.05, 0.1, 0.2, 0.5)}
    guards = {"max_logit": [None, ("sigma_qk", "above", 2), ("entropy_norm", "below", 0.5)],
              "sigma_qk": [None, ("max_logit", "above", 10), ("entropy_norm", "below", 0.5)]}
    for metric in rates:
        for w in (5, 10, 20):
            for rate in rates[metric]:
                for f in (0, 3, 5, 10):
                    for g in guards[metric]:
                        c = {"op": "growth", "rate": rate, "window": w}
                        if g:
                            c["and"] = {"metric": g[0], "op": g[1], "value": g[2]}
                        out.append({"metric": metric, "scope": "head", "condition": c, "for": f})
    levels = {"max_logit": (20, 50, 100, 200, 500, 1000), "sigma_qk": (2, 3, 5, 10, 20)}
    extra = []
    for metric in levels:
        for v in levels[metric]:
            for f in (0, 3, 5):
                extra.append({"metric": metric, "scope": "head", "condition": {"op": "above", "value": v}, "for": f})
    for pct in (80, 90, 95):
        for w in (20, 50):
            for f in (1, 2, 3, 5):
                extra.append({"metric": "entropy_norm", "scope": "head",
                              "condition": {"op": "drop", "pct": pct, "window": w}, "for": f})
    for v in (0.02, 0.05, 0.1, 0.2):
        for f in (2, 5, 10):
            extra.append({"metric": "entropy_norm", "scope": "head", "condition": {"op": "below", "value": v},
                          "for": f})
    for r in extra:
        out.append(r)
        out.append(dict(r, unless_training=dict(UNLESS)))
    srates = {"loss": (0.005, 0.01, 0.02, 0.05), "grad_norm": (0.01, 0.05, 0.2, 1)}
    for metric in srates:
        for w in (10, 20, 50):
            for rate in srates[metric]:
                for f in (0, 5):
                    out.append({"metric": metric, "scope": "scalar",
                                "condition": {"op": "growth", "rate": rate, "window": w}, "for": f})
    for i, r in enumerate(out):
        r["name"] = "cand-%03d" % i
    return out


def simulate(rows, rules=None):
    """r["fires"][name] = the simulated first firing step of every rule
    (default: the grid) on every row."""
    rules = rules if rules is not None else candidate_rules()
    for r in rows:
        rs = RunSeries(r.get("data") or {})
        r.setdefault("fires", {})
        if not rs.ok():
            continue
        for rule in rules:
            f = simulate_rule(rs, rule)
            if f != "unsupported":
                r["fires"][rule["name"]] = f


def check_simulation(rows, ran):
    """[(rule, runs where the simulated first firing step is the daemon's,
    runs)] for every rule the daemon ran that the simulation evaluates."""
    out = []
    for rule in ran:
        agree = n = 0
        for r in rows:
            rs = RunSeries(r.get("data") or {})
            if not rs.ok():
                continue
            sim = simulate_rule(rs, rule)
            if sim == "unsupported":
                break
            n += 1
            agree += sim == fires(r["alerts"]).get(rule["name"])
        else:
            out.append((rule["name"], agree, n))
    return out


# ---- scoring, tuning ----------------------------------------------------------

def median(xs):
    xs = sorted(xs)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def quantile(xs, q):
    """Linear-interpolation quantile (q in [0, 1]); None when empty."""
    xs = sorted(xs)
    if not xs:
        return None
    p = q * (len(xs) - 1)
    i = int(math.floor(p))
    return xs[i] if i + 1 >= len(xs) else xs[i] + (xs[i + 1] - xs[i]) * (p - i)


def model_fire(r, names):
    fs = [r["fires"].get(n) for n in names]
    fs = [f for f in fs if f is not None]
    return min(fs) if fs else None


def early_ok(r, f):
    """An early collapse (beginning by step EARLY_BY) is caught no later than
    entropy_drop catches it; True where it does not apply."""
    if not r["collapsed"] or r["collapse_step"] > EARLY_BY:
        return True
    d = fires(r["alerts"]).get("entropy_drop")
    return d is None or (f is not None and f <= d)


def score(rows, names):
    """(recall before the collapse begins, false-alarm rate, median lead,
    early collapses caught no later than entropy_drop / early collapses)."""
    hits, leads, fa, nh, nc, eok, ne = 0, [], 0, 0, 0, 0, 0
    for r in rows:
        f = model_fire(r, names)
        if r["collapsed"]:
            nc += 1
            if f is not None and f < r["collapse_step"]:
                hits += 1
                leads.append(r["collapse_step"] - f)
            if r["collapse_step"] <= EARLY_BY:
                ne += 1
                eok += early_ok(r, f)
        elif r["healthy"]:
            nh += 1
            fa += f is not None
    return (hits / nc if nc else 0.0, fa / nh if nh else 0.0, median(leads), eok, ne, fa)


def tune(rows, max_fa=0.025):
    """Models on the tune rows, best first: an OR of one to three rules of
    the grid, with a false-alarm rate at most max_fa (half the target: the
    held-out half will find a few more), catching every early collapse no
    later than entropy_drop where some model does, and a recall at most one
    collapsing run below the best such; among those the longest median
    lead, then the higher recall, then the simplest. Entries: (names,
    rules, recall, false alarms, median lead)."""
    grid = {r["name"]: r for r in candidate_rules()}
    healthy = [r for r in rows if r["healthy"]]
    nc = sum(r["collapsed"] for r in rows) or 1
    allowed = int(max_fa * len(healthy) + 1e-9)
    # a rule that alone raises more false alarms than allowed cannot be part
    # of a model that does not: the pool
    pool = [n for n in grid if sum(r["fires"].get(n) is not None for r in healthy) <= allowed]
    singles = [(n,) for n in pool]
    scored = {m: score(rows, m) for m in singles}
    by_recall = sorted(singles, key=lambda m: (-scored[m][0], -(scored[m][2] or 0)))[:60]
    by_lead = sorted(singles, key=lambda m: (-(scored[m][2] or 0), -scored[m][0]))[:60]
    early = sorted(singles, key=lambda m: (-scored[m][3], -scored[m][0]))[:30]
    seeds = list(dict.fromkeys(by_recall + by_lead + early))
    for i, a in enumerate(seeds):
        for b in seeds[i + 1:]:
            m = tuple(sorted(a + b))
            if m not in scored:
                scored[m] = score(rows, m)
    pairs = sorted([m for m in scored if len(m) == 2 and scored[m][5] <= allowed],
                   key=lambda m: (-scored[m][0], -(scored[m][2] or 0)))[:80]
    for p in pairs:
        for s in early + by_lead[:30]:
            m = tuple(sorted(set(p + s)))
            if len(m) == 3 and m not in scored:
                scored[m] = score(rows, m)
    ok = [m for m, s in scored.items() if s[5] <= allowed]
    full_early = [m for m in ok if scored[m][3] == scored[m][4]]
    if full_early:
        ok = full_early
    best = max((scored[m][0] for m in ok), default=0.0)
    ok = [m for m in ok if scored[m][0] >= best - 1.0 / nc - 1e-9]
    ok.sort(key=lambda m: (-(scored[m][2] or 0), -scored[m][0], len(m)))
    return [(m, [grid[n] for n in m], scored[m][0], scored[m][1], scored[m][2]) for m in ok]


def ship_names(rules):
    """The model's rules under the names they ship as: collapse_risk, then
    collapse_risk_<metric>, collapse_risk_early for a drop or level arm."""
    out, used = [], set()
    for i, x in enumerate(rules):
        x = {k: v for k, v in x.items() if k != "name"}
        if i == 0:
            name = "collapse_risk"
        elif x.get("scope") == "scalar":
            name = "collapse_risk_" + x["metric"]
        else:
            name = "collapse_risk_early" if x["condition"]["op"] in ("drop", "above", "below") else \
                "collapse_risk_" + x["metric"]
        while name in used:
            name += "_2"
        used.add(name)
        out.append(dict(x, name=name))
    return out


def same_rules(have, model):
    """True when the collapse_risk* rules of have are the model's, rule for
    rule (name, metric, scope, condition, for, unless_training)."""
    mine = {x["name"]: x for x in have if x["name"].startswith("collapse_risk")}
    keys = ("metric", "condition", "for", "unless_training")
    return len(mine) == len(model) and all(
        x["name"] in mine and all(mine[x["name"]].get(k) == x.get(k) for k in keys)
        and mine[x["name"]].get("scope", "head") == x.get("scope", "head") for x in model)


def show(rules):
    return " OR ".join(json.dumps({k: x[k] for k in ("metric", "scope", "condition", "for", "unless_training")
                                   if k in x}) for x in rules)


# ---- judging, with bootstrap intervals ---------------------------------------

def judge(rows, fire_of):
    """Per run: verdicts and the lead of the detector fire_of(row) -> step."""
    out = []
    for r in rows:
        f = fire_of(r)
        out.append(dict(name=r["name"], config=r["config"]["config"], collapsed=r["collapsed"],
                        healthy=r["healthy"], collapse_step=r["collapse_step"], diverge_step=r["diverge_step"],
                        fire=f, lead=(r["collapse_step"] - f) if (r["collapsed"] and f is not None) else None,
                        early_ok=early_ok(r, f), drop_fire=fires(r["alerts"]).get("entropy_drop")))
    return out


def stats(j):
    """The figures of item 5 on judged runs j."""
    col = [x for x in j if x["collapsed"]]
    hea = [x for x in j if x["healthy"]]
    hit = [x for x in col if x["fire"] is not None and x["fire"] < x["collapse_step"]]
    leads = [x["lead"] for x in hit]
    late = [x for x in col if x["collapse_step"] > LATE_AFTER]
    late_hit = [x["lead"] for x in late if x["fire"] is not None and x["fire"] < x["collapse_step"]]
    early = [x for x in col if x["collapse_step"] <= EARLY_BY]
    return dict(collapsed=len(col), healthy=len(hea), other=len(j) - len(col) - len(hea), hits=len(hit),
                recall=len(hit) / len(col) if col else None,
                false_alarms=sum(x["fire"] is not None for x in hea) / len(hea) if hea else None,
                fa_runs=sum(x["fire"] is not None for x in hea),
                lead_q1=quantile(leads, 0.25), median_lead=quantile(leads, 0.5), lead_q3=quantile(leads, 0.75),
                late=len(late), late_hits=len(late_hit), late_median_lead=quantile(late_hit, 0.5),
                early=len(early), early_ok=sum(x["early_ok"] for x in early))


INTERVAL_KEYS = ("recall", "false_alarms", "lead_q1", "median_lead", "lead_q3", "late_median_lead")


def bootstrap(j, n=BOOT, seed=34):
    """{key: (lo, hi)}: 95% percentile intervals of stats() over resamples
    of the configurations (with replacement; a configuration brings all its
    seeds)."""
    by = {}
    for x in j:
        by.setdefault(x["config"], []).append(x)
    cfgs = sorted(by)
    rng = random.Random(seed)
    samples = {k: [] for k in INTERVAL_KEYS}
    for _ in range(n):
        pick = [x for _ in cfgs for x in by[rng.choice(cfgs)]]
        s = stats(pick)
        for k in INTERVAL_KEYS:
            if s[k] is not None:
                samples[k].append(s[k])
    return {k: (quantile(v, 0.025), quantile(v, 0.975)) if v else (None, None) for k, v in samples.items()}


def paired_lead(j_model, j_rule, n=BOOT, seed=35):
    """On the collapses both catch before they begin: the median of the
    model's lead minus the rule's, with a bootstrap interval (over
    configurations), and how many such collapses."""
    rule = {x["name"]: x for x in j_rule}
    pairs = [(x["config"], x["lead"] - rule[x["name"]]["lead"]) for x in j_model
             if x["collapsed"] and x["lead"] is not None and x["lead"] > 0
             and rule[x["name"]]["lead"] is not None and rule[x["name"]]["lead"] > 0]
    if not pairs:
        return None, (None, None), 0
    by = {}
    for c, d in pairs:
        by.setdefault(c, []).append(d)
    cfgs = sorted(by)
    rng = random.Random(seed)
    meds = []
    for _ in range(n):
        meds.append(median([d for _ in cfgs for d in by[rng.choice(cfgs)]]))
    return median([d for _, d in pairs]), (quantile(meds, 0.025), quantile(meds, 0.975)), len(pairs)


# ---- the report -----------------------------------------------------------------

def fmt(v, nd=2):
    if v is None:
        return "-"
    if isinstance(v, float):
        return ("%." + str(nd) + "f") % v
    return str(v)


def pct(v):
    return "-" if v is None else "%.0f%%" % (100 * v)


def ci(iv, f=pct):
    lo, hi = iv
    return "[%s, %s]" % (f(lo), f(hi)) if lo is not None else ""


def steps_fmt(v):
    return "-" if v is None else "%.0f" % v


def figure_table(res):
    """The item-5 table: one line per detector, figures with 95% intervals.
    res: [(label, stats, intervals)]."""
    out = ["| detector | recall before collapse begins | false alarms (runs that train fine) | lead Q1 / median / Q3 "
           "(steps) | median lead, collapses after step %d | early collapses (by step %d) caught no later than "
           "entropy_drop |" % (LATE_AFTER, EARLY_BY), "|---|---|---|---|---|---|"]
    for label, s, iv in res:
        out.append("| %s | %s (%d/%d) %s | %s (%d/%d) %s | %s / %s / %s %s | %s (%d of %d) %s | %d/%d |" % (
            label, pct(s["recall"]), s["hits"], s["collapsed"], ci(iv["recall"]),
            pct(s["false_alarms"]), s["fa_runs"], s["healthy"], ci(iv["false_alarms"]),
            steps_fmt(s["lead_q1"]), steps_fmt(s["median_lead"]), steps_fmt(s["lead_q3"]),
            ci(iv["median_lead"], steps_fmt), steps_fmt(s["late_median_lead"]), s["late_hits"], s["late"],
            ci(iv["late_median_lead"], steps_fmt), s["early_ok"], s["early"]))
    return out


def verdict_lines(s, best_rule, paired):
    """Item 5's targets, met or not, with the figures."""
    out = []
    t = TARGETS
    out.append("- recall >= %.0f%%: %s (%s)" % (100 * t["recall"], "met" if (s["recall"] or 0) >= t["recall"]
                                                 else "NOT met", pct(s["recall"])))
    out.append("- false alarms <= %.0f%%: %s (%s)" % (100 * t["false_alarms"],
                                                     "met" if s["false_alarms"] is not None and
                                                     s["false_alarms"] <= t["false_alarms"] else "NOT met",
                                                     pct(s["false_alarms"])))
    out.append("- median lead >= %d steps: %s (%s)" % (t["median_lead"], "met" if (s["median_lead"] or 0) >=
                                                      t["median_lead"] else "NOT met", steps_fmt(s["median_lead"])))
    label, bs = best_rule
    d, iv, n = paired
    # "at equal recall": on the collapses both catch before they begin (the
    # recall they share); with fewer than 10 of those, nothing is shown
    better = (s["recall"] or 0) >= (bs["recall"] or 0) and d is not None and iv[0] is not None and iv[0] > 0
    state = "met" if better and n >= 10 else "NOT shown" if n < 10 else "NOT met"
    out.append("- strictly better than the best single built-in rule (%s: recall %s, median lead %s) on lead at "
               "equal recall: %s (recall %s vs %s; on the %d collapses both catch before they begin, the "
               "model's lead minus the rule's: median %s steps, 95%% interval %s%s)" % (
                   label, pct(bs["recall"]), steps_fmt(bs["median_lead"]), state,
                   pct(s["recall"]), pct(bs["recall"]), n, steps_fmt(d), ci(iv, steps_fmt),
                   "; too few to compare" if n < 10 else ""))
    return out


def write_plot(j, scratch, png, title):
    """collapse-risk.png: on each held-out run that collapses, when the model
    fires, when entropy_drop fires and when the collapse begins, ordered by
    the collapse's start."""
    if not plot.available("collapse-risk"):
        return False
    os.makedirs(scratch, exist_ok=True)
    dat = os.path.join(scratch, "held.dat")
    col = sorted([x for x in j if x["collapsed"]], key=lambda x: x["collapse_step"])
    with open(dat, "w") as f:
        for i, x in enumerate(col):
            f.write("%d %s %s %s\n" % (i, x["collapse_step"], x["fire"] if x["fire"] is not None else "NaN",
                                        x["drop_fire"] if x["drop_fire"] is not None else "NaN"))
    gp = [plot.terminal(1100, 600), "set output '%s'" % png, "set termoption noenhanced",
          "set datafile missing 'NaN'", "set title '%s'" % title, "set ylabel 'step (log)'", "set logscale y",
          "set xlabel 'held-out runs that collapse, by the step the collapse begins'", "set grid",
          "set key top left", "set offsets 0.5, 0.5, 0, 0",
          "plot '%s' u 1:2 w p pt 7 ps 1.3 lc rgb '#d62728' t 'entropy_collapse begins', "
          "'' u 1:3 w p pt 5 ps 1.0 lc rgb '#1f77b4' t 'the model fires', "
          "'' u 1:4 w p pt 2 ps 1.0 lc rgb '#2ca02c' t 'entropy_drop fires'" % dat]
    return plot.render(gp, scratch, "collapse-risk")


def summary_markdown(p):
    """The collapse-risk section of docs/experiments.md, from collapse-risk.json."""
    held = p["held_out"]
    res = [(label, s, {k: tuple(v) for k, v in s["intervals"].items()}) for label, s in held.items()]
    return (["## Collapse risk: an alert before a harmful entropy collapse begins", "",
             "The broad sweep of research/sweep.py (%s; split by configuration into a tune and a held-out half "
             "before tuning), the model chosen on the tune half (%s), judged on the held-out half. Details, the "
             "plot and every run: [collapse-risk.md](collapse-risk.md). The sweep took %.1f min." % (
                 "%d held-out runs" % (res[0][1]["collapsed"] + res[0][1]["healthy"] + res[0][1]["other"]),
                 " OR ".join("`%s`" % x["name"] for x in p["chosen"]), p["seconds"] / 60), ""] +
            figure_table(res) + ["", "Against the targets:", ""] + p["verdict"] + [""])
