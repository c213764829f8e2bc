#!/usr/bin/env python3
"""make experiments: the stability claims of sigmaReparam (Zhai et al. 2023) at
toy scale, measured on this machine.

A learning-rate sweep of the baseline (--reparam none) against sigmaReparam
(--reparam sigma) for every --norm pre|post|none and for Adam and plain SGD,
on the synthetic corpus, no warmup, no clipping, constant learning rate. Every
run streams its probe metrics to one entropyd; per run the driver reports

  - the final validation loss (sigmatrain's summary line),
  - whether it diverged: NaN/Inf (sigmatrain exit 3) or a final validation
    loss above ln(64), the loss of a uniform guess over the vocabulary,
  - the minimum head entropy_norm over all heads and logged steps, and the
    minimum entropy in nats (from the daemon's stored series, HTTP API),
  - the largest attention logit (max_logit, Wortsman et al. 2023),
  - the step where entropy collapse began: the start_step of the daemon's
    entropy_collapse alert (the built-in rule; README "Alerts"), from
    GET /api/runs/{id}/alerts,
  - for tuning that rule: each run's 10/20/50-step floor (below).

Where the two arms' verdicts differ (one diverged or collapsed, the other
did not), two more seeds are run for both. Results: docs/experiments.md (table),
docs/experiments.png (gnuplot), docs/experiments.json (the rows). Scratch
(the daemon's data, logs, per-step series, plot data) goes to
demo-data/experiments/ (ignored by git).

Runs two trainers at a time, each with --threads 1 (a shared 2-core machine).
  python3 scripts/experiments.py [--quick] [--jobs N] [--out DIR]
Environment: ENTROPYD, SIGMATRAIN (default build/entropyd, build/sigmatrain).
Standard library only.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collapse_risk  # noqa: E402
import plot  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", "build")
ENTROPYD = os.environ.get("ENTROPYD") or os.path.join(ROOT, BUILD, "entropyd")
SIGMATRAIN = os.environ.get("SIGMATRAIN") or os.path.join(ROOT, BUILD, "sigmatrain")

VOCAB_LOSS = math.log(64)  # uniform guess over the synthetic corpus' vocabulary
STEPS = 300
MODEL = ["--layers", "2", "--heads", "4", "--dim", "64", "--seq-len", "64", "--batch", "8"]
COMMON = ["--warmup", "0", "--clip", "0", "--schedule", "constant", "--threads", "1",
          "--print-every", "50", "--eval-every", "0", "--eval-batches", "8", "--log-every", "1"]
NORMS = ["pre", "post", "none"]
# Plain SGD needs a larger step than Adam to move at all; both grids span
# "trains fine" to "well past stable" for the baseline.
LRS = {"adam": [1e-3, 1e-2, 3e-2, 1e-1], "sgd": [0.1, 0.3, 1.0, 3.0]}
QUICK_LRS = {"adam": [1e-3, 3e-2], "sgd": [0.3, 3.0]}
EXTRA_SEEDS = [2, 3]
COLLAPSE_FLOOR = 0.01  # entropy_collapse's default value (daemon/alert.c), drawn on the plot


def run_name(c):
    name = "%s-%s-%s-lr%g-s%d" % (c["opt"], c["norm"], c["reparam"], c["lr"], c["seed"])
    if c.get("warmup"):
        name += "-w%d" % c["warmup"]
    if c.get("tag"):
        name = c["tag"] + "-" + name
    return name


class Daemon:
    """entropyd on DIR with a free HTTP port; stopped with SIGTERM."""

    def __init__(self, data, rules=None):
        self.data = data
        os.makedirs(data, exist_ok=True)
        self.log = open(os.path.join(data, "daemon.log"), "wb")
        self.proc = subprocess.Popen([ENTROPYD, "--data", data, "--http", "127.0.0.1:0", "--quiet-alerts"] +
                                     (["--rules", rules] if rules else []),
                                     stdout=subprocess.PIPE, stderr=self.log)
        self.port = None
        deadline = time.time() + 20
        while time.time() < deadline:
            line = self.proc.stdout.readline().decode()
            if not line:
                break
            m = re.match(r"http port (\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if not self.port:
            self.stop()
            raise RuntimeError("entropyd did not report its HTTP port (see %s/daemon.log)" % data)
        self.sock = os.path.join(data, "entropyd.sock")
        self.db = os.path.join(data, "entropyd.db")

    def get(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path), timeout=30) as r:
            return json.loads(r.read().decode())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start_run(c, d, logdir):
    common = list(COMMON)
    if c.get("warmup"):
        common[common.index("--warmup") + 1] = str(c["warmup"])
    args = [SIGMATRAIN] + c.get("model", MODEL) + common + [
        "--steps", str(c["steps"]), "--norm", c["norm"], "--reparam", c["reparam"],
        "--optimizer", c["opt"], "--lr", repr(c["lr"]), "--seed", str(c["seed"]),
        "--daemon", "unix:" + d.sock, "--run", run_name(c)]
    log = open(os.path.join(logdir, run_name(c) + ".log"), "wb")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), log


def parse_log(path):
    text = open(path, errors="replace").read()
    m = re.findall(r"\bval loss ([-+0-9.eE]+|-?nan|-?inf)", text)
    return float(m[-1]) if m else None


def measure(c, d, rc, logpath):
    """One result row: the trainer's verdict plus what the daemon stored."""
    name = run_name(c)
    row = dict(c, name=name, exit=rc, eval_loss=parse_log(logpath))
    nonfinite = rc == 3 or (row["eval_loss"] is not None and not math.isfinite(row["eval_loss"]))
    row["diverged"] = bool(nonfinite or row["eval_loss"] is None
                           or row["eval_loss"] > VOCAB_LOSS)
    row["nan"] = bool(nonfinite)
    runs = [r for r in d.get("/api/runs") if r["name"] == name]
    row["stored"] = bool(runs)
    row["min_entropy_norm"] = row["min_entropy"] = row["max_logit"] = None
    row["collapse_step"] = None
    row["series"] = []
    row["heads_series"] = []
    for f in FLOOR_WINDOWS:
        row["floor_%d" % f] = None
    if not runs:
        return row
    run = runs[0]
    last = max(1, int(run["last_step"] or 1))
    pts = last + 1  # one point per step: bucket minima are the per-step minima

    def series(metric, agg):
        s = d.get("/api/runs/%d/series?metric=%s&agg=%s&points=%d" % (run["id"], metric, agg, pts))
        return s.get("step", []), s.get("min" if agg == "min" else "max", [])

    steps, mins = series("entropy_norm", "min")
    vals = [v for v in mins if v is not None]
    if vals:
        row["min_entropy_norm"] = min(vals)
    row["series"] = [[s, v] for s, v in zip(steps, mins)]
    _, ent = series("entropy", "min")
    ent = [v for v in ent if v is not None]
    if ent:
        row["min_entropy"] = min(ent)
    _, ml = series("max_logit", "max")
    ml = [v for v in ml if v is not None]
    if ml:
        row["max_logit"] = max(ml)
    # For tuning entropy_collapse ("below V for F steps"): the rule fires on
    # a head iff the maximum of some F consecutive values of that head is
    # below V, so floor_F = the lowest such F-step maximum over all heads
    # is the largest V at which the rule would stay silent on this run.
    heads = []
    for l in range(run["layers"]):
        for h in range(run["heads"]):
            s = d.get("/api/runs/%d/series?metric=entropy_norm&layer=%d&head=%d&points=%d" % (
                run["id"], l, h, pts))
            heads.append(s.get("min", []))
    row["heads_series"] = heads
    for f in FLOOR_WINDOWS:
        row["floor_%d" % f] = floor(heads, f)
    # The daemon's verdict: first entropy_collapse episode of this run.
    starts = [a.get("start_step") for a in run_alerts(d, run["id"]) if a.get("rule") == "entropy_collapse"]
    starts = [x for x in starts if x is not None]
    row["collapse_step"] = min(starts) if starts else None
    return row


def run_alerts(d, run_id):
    """The run's alert episodes: GET /api/runs/{id}/alerts, or the daemon's
    SQLite file when its HTTP API predates that route."""
    try:
        return d.get("/api/runs/%d/alerts?limit=10000" % run_id)
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
    con = sqlite3.connect("file:%s?mode=ro" % d.db, uri=True, timeout=30)
    try:
        return [{"rule": r, "start_step": st} for r, st in
                con.execute("SELECT rule, start_step FROM alerts WHERE run_id = ?", (run_id,))]
    finally:
        con.close()


FLOOR_WINDOWS = (10, 20, 50)


def floor(heads, f):
    """min over heads and positions of the max of f consecutive values;
    a missing (non-finite) value breaks a window. None when no window fits."""
    best = None
    for vals in heads:
        for i in range(0, len(vals) - f + 1):
            w = vals[i:i + f]
            if any(v is None for v in w):
                continue
            m = max(w)
            if best is None or m < best:
                best = m
    return best


def alert_counts(d):
    """{rule: {"none": runs, "sigma": runs}}: how many runs of each arm fired each
    built-in rule at least once."""
    out = {}
    for run in d.get("/api/runs"):
        arm = "sigma" if (run.get("meta") or {}).get("reparam", "none") != "none" else "none"
        for rule in {a.get("rule") for a in run_alerts(d, run["id"])}:
            out.setdefault(rule, {"none": 0, "sigma": 0})[arm] += 1
    return out


def launch(configs, d, logdir, jobs):
    """Runs every config's trainer against daemon d, `jobs` at a time, and
    yields (config, exit code, log path, seconds) as each one ends, after
    the daemon had a moment to commit its last steps."""
    queue, active = list(configs), []
    while queue or active:
        while queue and len(active) < jobs:
            c = queue.pop(0)
            p, log = start_run(c, d, logdir)
            active.append((c, p, log, time.time()))
        time.sleep(0.2)
        for item in list(active):
            c, p, log, t0 = item
            if p.poll() is None:
                continue
            active.remove(item)
            log.close()
            time.sleep(0.3)  # let the writer commit the trainer's last steps and end
            yield c, p.returncode, os.path.join(logdir, run_name(c) + ".log"), round(time.time() - t0, 1)


def run_all(configs, d, logdir, jobs):
    rows = []
    for c, rc, logpath, seconds in launch(configs, d, logdir, jobs):
        row = measure(c, d, rc, logpath)
        row["seconds"] = seconds
        rows.append(row)
        print("%-34s exit %d  eval %-8s min entropy_norm %-7s floor20 %-7s collapse %-5s %5.1fs" % (
            row["name"], rc, fmt(row["eval_loss"], 3), fmt(row["min_entropy_norm"], 3),
            fmt(row["floor_20"], 3),
            row["collapse_step"] if row["collapse_step"] is not None else "-", row["seconds"]), flush=True)
    return rows


def fmt(v, nd=3):
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, float) and abs(v) >= 1e4:
        return "%.2g" % v
    return ("%." + str(nd) + "f") % v


def verdicts_differ(a, b):
    """One arm diverged or collapsed and the other did not: worth checking
    that it is not one seed's luck."""
    return a["diverged"] != b["diverged"] or (a["collapse_step"] is None) != (b["collapse_step"] is None)


def verdict(r):
    if r["nan"]:
        return "NaN"
    if r["diverged"]:
        return "diverged"
    return "ok"


def write_markdown(rows, path, cmd, seconds, machine, counts=None, predict=None):
    by_cell = {}
    for r in rows:
        by_cell.setdefault((r["opt"], r["norm"], r["lr"]), []).append(r)
    out = ["# Experiments: predicting entropy collapse, and sigmaReparam against the baseline at toy scale", "",
           "Generated by `%s` in %.1f min on %s (both parts: the collapse-risk study, then the "
           "learning-rate sweep)." % (cmd, seconds / 60, machine), ""]
    if predict:
        out += collapse_risk.summary_markdown(predict)
    out += ["## The learning-rate sweep", "",
           "Model: %s, %d steps, synthetic corpus (vocab 64), constant learning rate, "
           "no warmup, no gradient clipping, `--threads 1`, probe on every step "
           "(4 examples). `diverged`: NaN/Inf (exit 3) or final validation loss above "
           "ln 64 = %.2f (worse than a uniform guess). `collapse at`: the step where the "
           "daemon's `entropy_collapse` alert began (its pending start; `-` = never fired). "
           "`min ent_norm` / `min ent`: the lowest head entropy_norm / entropy (nats) "
           "of any head at any step; `20-step floor`: the lowest 20-step running maximum of "
           "any head's entropy_norm (the rule `entropy_collapse` with `for` 20 fires iff its "
           "value is above this); `max logit`: the largest attention logit." % (
               " ".join(MODEL), STEPS, VOCAB_LOSS), "",
           "### Summary", "",
           "Per optimizer and norm, for each arm: the largest learning rate of the grid at which "
           "every seed ended without divergence and without an entropy_collapse alert (and so did "
           "every smaller one), and the "
           "best final eval loss (mean over seeds) with its learning rate.", "",
           "| optimizer | norm | baseline: stable up to | baseline: best eval loss | σReparam: stable up to | σReparam: best eval loss |",
           "|---|---|---|---|---|---|"]
    for opt in LRS:
        for norm in NORMS:
            cells = []
            for rp in ("none", "sigma"):
                arm = [r for r in rows if r["opt"] == opt and r["norm"] == norm and r["reparam"] == rp]
                lrs = sorted({r["lr"] for r in arm})
                ok = []  # the grid's learning rates up to the first failing one
                for lr in lrs:
                    if not all(not r["diverged"] and r["collapse_step"] is None for r in arm if r["lr"] == lr):
                        break
                    ok.append(lr)
                best = None
                for lr in lrs:
                    m = mean([r["eval_loss"] if not r["diverged"] else None for r in arm if r["lr"] == lr])
                    if m is not None and all(not r["diverged"] for r in arm if r["lr"] == lr) and \
                            (best is None or m < best[0]):
                        best = (m, lr)
                cells.append("%g" % max(ok) if ok else "none")
                cells.append("%.3f (lr %g)" % best if best else "-")
            if not any(r["opt"] == opt and r["norm"] == norm for r in rows):
                continue
            out.append("| %s | %s | %s |" % (opt, norm, " | ".join(cells)))
    if counts:
        nb = sum(r["reparam"] == "none" for r in rows)
        ns = len(rows) - nb
        out += ["", "### Built-in alert rules that fired", "",
                "Runs (of %d baseline, %d σReparam) in which each default rule of entropyd fired "
                "at least once." % (nb, ns), "",
                "| rule | baseline runs | σReparam runs |", "|---|---|---|"]
        for rule in sorted(counts):
            out.append("| %s | %d | %d |" % (rule, counts[rule]["none"], counts[rule]["sigma"]))
    out += ["", "### Every run", "",
           "| optimizer | norm | lr | reparam | seed | eval loss | verdict | min ent_norm | min ent (nats) | 20-step floor | max logit | collapse at |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(by_cell, key=lambda k: (k[0], NORMS.index(k[1]), k[2])):
        for r in sorted(by_cell[key], key=lambda r: (r["reparam"] != "none", r["seed"])):
            out.append("| %s | %s | %g | %s | %d | %s | %s | %s | %s | %s | %s | %s |" % (
                r["opt"], r["norm"], r["lr"], "σReparam" if r["reparam"] == "sigma" else "baseline",
                r["seed"], fmt(r["eval_loss"]), verdict(r), fmt(r["min_entropy_norm"]),
                fmt(r["min_entropy"]), fmt(r["floor_20"]), fmt(r["max_logit"], 1),
                r["collapse_step"] if r["collapse_step"] is not None else "-"))
    out.append("")
    with open(path, "w") as f:
        f.write("\n".join(out))


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def write_plot(rows, scratch, png):
    """4 x 3 panels: (Adam, SGD) x (eval loss, min entropy_norm) over the
    learning rate, one column per --norm; baseline against sigmaReparam,
    means over seeds, diverged runs drawn at the 5.0 cap with an open mark;
    entropy on a log axis, so collapse (0.000x) and the alert floor show."""
    if not plot.available("experiments"):
        return False
    os.makedirs(scratch, exist_ok=True)
    cap = 5.0
    for opt in LRS:
        for norm in NORMS:
            for rp in ("none", "sigma"):
                cell = [r for r in rows if r["opt"] == opt and r["norm"] == norm and r["reparam"] == rp]
                lrs = sorted({r["lr"] for r in cell})
                with open(os.path.join(scratch, "%s-%s-%s.dat" % (opt, norm, rp)), "w") as f:
                    for lr in lrs:
                        rs = [r for r in cell if r["lr"] == lr]
                        loss = mean([min(cap, r["eval_loss"]) if (r["eval_loss"] is not None and
                                     math.isfinite(r["eval_loss"])) else cap for r in rs])
                        ent = mean([r["min_entropy_norm"] for r in rs])
                        if ent is not None:
                            ent = max(ent, 1e-4)  # log axis
                        div = sum(r["diverged"] for r in rs)
                        f.write("%g %g %s %d %d\n" % (lr, loss, "NaN" if ent is None else "%g" % ent,
                                                      div, len(rs)))
    gp = [plot.terminal(1500, 1500), "set output '%s'" % png,
          "set multiplot layout 4,3 title 'σReparam vs baseline, %d steps, 2x4 heads, C=64, T=64 (mean over seeds; open marks: diverged)'" % STEPS,
          "set termoption noenhanced",
          "set logscale x", "set grid", "set key top left", "set datafile missing 'NaN'"]
    for opt, oname in (("adam", "Adam"), ("sgd", "SGD")):
        for what, col, ylab, yr in (("loss", 2, "final eval loss (capped at 5)", "[1.5:5.2]"),
                                    ("ent", 3, "min head entropy_norm (log; 0 drawn at 1e-4)", "[8e-5:1.5]")):
            lo, hi = min(LRS[opt]), max(LRS[opt])
            gp.append("set xrange [%g:%g]" % (lo / 1.5, hi * 1.5))
            for norm in NORMS:
                b = os.path.join(scratch, "%s-%s-none.dat" % (opt, norm))
                s = os.path.join(scratch, "%s-%s-sigma.dat" % (opt, norm))
                gp += ["set title '%s, --norm %s'" % (oname, norm), "set xlabel 'learning rate'",
                       "set ylabel '%s'" % ylab, "set yrange %s" % yr,
                       "set key %s left Left reverse" % ("top" if what == "loss" else "bottom"),
                       "set logscale y" if what == "ent" else "unset logscale y",
                       "set format y '%g'"]
                floor_line = (", %g w l dt 2 lc rgb '#555555' t 'entropy_collapse floor %g'" % (
                    COLLAPSE_FLOOR, COLLAPSE_FLOOR)) if what == "ent" else ""
                gp.append("plot '%s' u 1:%d w lp lw 2 pt 7 lc rgb '#d62728' t 'baseline', "
                          "'%s' u 1:($4>0?$%d:1/0) w p pt 6 ps 2.5 lc rgb '#d62728' notitle, "
                          "'%s' u 1:%d w lp lw 2 pt 5 lc rgb '#1f77b4' t 'σReparam', "
                          "'%s' u 1:($4>0?$%d:1/0) w p pt 4 ps 2.5 lc rgb '#1f77b4' notitle"
                          % (b, col, b, col, s, col, s, col) + floor_line)
    gp.append("unset multiplot")
    return plot.render(gp, scratch, "experiments")


def predict_run_all(configs, d, logdir, jobs, sink):
    """Runs the collapse-risk sweeps' configs; per run the verdicts and the
    stored series collapse_risk needs, each also appended to the JSON-lines
    file sink as it ends (what --resume keeps after an interruption)."""
    rows = []
    for c, rc, logpath, seconds in launch(configs, d, logdir, jobs):
        name = run_name(c)
        ev = parse_log(logpath)
        runs = [r for r in d.get("/api/runs") if r["name"] == name]
        row = dict(name=name, exit=rc, eval_loss=ev, collapse_step=None, diverge_step=None,
                   alerts=[], data={}, seconds=seconds,
                   config={k: v for k, v in c.items() if k != "model"}, model=c["model"])
        if runs:
            run = runs[0]
            row["alerts"] = [{k: a.get(k) for k in ("rule", "start_step", "last_step", "transitions")}
                             for a in run_alerts(d, run["id"])]
            row["data"] = collapse_risk.collect(d, run["id"], run["last_step"])
            starts = [a["start_step"] for a in row["alerts"]
                      if a["rule"] == "entropy_collapse" and a["start_step"] is not None]
            row["collapse_step"] = min(starts) if starts else None
            row["diverge_step"] = collapse_risk.divergence_step(row["data"]["loss_step"], row["data"]["loss"])
        row["collapsed"] = row["collapse_step"] is not None
        finite = ev is not None and math.isfinite(ev)
        row["healthy"] = (not row["collapsed"] and rc == 0 and finite and ev <= VOCAB_LOSS
                          and row["diverge_step"] is None)
        rows.append(row)
        with open(sink, "a") as f:
            f.write(json.dumps(row) + "\n")
        print("%-42s exit %d  eval %-8s collapse %-5s diverge %-5s risk %-5s %5.1fs" % (
            name, rc, fmt(ev, 3), fmt(row["collapse_step"], 0) if row["collapsed"] else "-",
            row["diverge_step"] if row["diverge_step"] is not None else "-",
            ",".join(str(a["start_step"]) for a in row["alerts"] if a["rule"] == "collapse_risk") or "-",
            row["seconds"]), flush=True)
    return rows


def predict(args, scratch, out):
    t0 = time.time()
    # one daemon with the built-in rules (collapse_risk among them); what it
    # ran is kept beside the rows, to check the simulation against it
    d = Daemon(os.path.join(scratch, "daemon"))
    if not (args.resume and os.path.exists(os.path.join(scratch, "rules.json"))):
        with open(os.path.join(scratch, "rules.json"), "w") as f:
            f.write(default_rules_json())
    logdir = os.path.join(scratch, "logs")
    os.makedirs(logdir, exist_ok=True)
    cfg = {"tune": collapse_risk.configs("tune", args.steps_predict),
           "held": [] if args.tune_only else collapse_risk.configs("held", args.steps_predict),
           "ref": [] if args.tune_only or args.no_reference else collapse_risk.configs("ref", args.steps_predict)}
    done, before = (recorded_rows(scratch), recorded_seconds(scratch)) if args.resume else ({}, 0.0)
    every = cfg["tune"] + cfg["held"] + cfg["ref"]
    todo = [c for c in every if run_name(c) not in done]
    print("collapse-risk: %d tune runs, then %d held-out runs and %d reference runs (%d to run, %d kept); "
          "entropyd at http://127.0.0.1:%d/" % (len(cfg["tune"]), len(cfg["held"]), len(cfg["ref"]), len(todo),
                                                len(every) - len(todo), d.port), flush=True)
    try:
        new = {r["name"]: r for r in predict_run_all(todo, d, logdir, args.jobs, os.path.join(scratch, "rows.jsonl"))}
    finally:
        d.stop()
    done.update(new)
    rows = {k: [done[run_name(c)] for c in v if run_name(c) in done] for k, v in cfg.items()}
    with open(os.path.join(scratch, "rows.json"), "w") as f:
        json.dump(rows["tune"] + rows["held"] + rows["ref"], f)
    with open(os.path.join(scratch, "seconds.json"), "w") as f:
        json.dump({"seconds": round(before + time.time() - t0, 1)}, f)
    collapse_risk.simulate(rows["tune"])
    top, _ = collapse_risk.tune(rows["tune"])
    print("collapse-risk: best models on the tune sweep (false alarms <= 5%):")
    for name, rules, rec, far, lead, late in top[:10]:
        print("  %s recall %.2f  false alarms %.2f  median lead %-6s late %-6s %s" % (
            name, rec, far, fmt(lead, 0), fmt(late, 0), collapse_risk.show(rules)))
    if args.tune_only or not top:
        return
    report(rows, top, out, scratch, before + time.time() - t0)


def split_rows(done, steps=collapse_risk.STEPS):
    """{"tune", "held", "ref"}: the recorded rows of each sweep."""
    return {k: [done[run_name(c)] for c in collapse_risk.configs(k, steps) if run_name(c) in done]
            for k in ("tune", "held", "ref")}


def recorded_rows(scratch):
    """{name: row} of the runs the last sweeps recorded (rows.json, and the
    rows.jsonl each run appends to as it ends)."""
    done = {}
    if os.path.exists(os.path.join(scratch, "rows.json")):
        done = {r["name"]: r for r in json.load(open(os.path.join(scratch, "rows.json")))}
    if os.path.exists(os.path.join(scratch, "rows.jsonl")):
        for line in open(os.path.join(scratch, "rows.jsonl")):
            if line.strip():
                r = json.loads(line)
                done[r["name"]] = r
    return done


def recorded_seconds(scratch):
    path = os.path.join(scratch, "seconds.json")
    return json.load(open(path))["seconds"] if os.path.exists(path) else 0.0


def report(rows, top, out, scratch, seconds):
    """collapse-risk.md/.json/.png from the sweeps' rows ({"tune", "held",
    "ref"}: tune, fresh held-out, the earlier held-out seeds): the model
    chosen on the tune sweep (top[0]) judged on each."""
    every = rows["tune"] + rows["held"] + rows["ref"]
    collapse_risk.simulate(every)
    name, chosen = top[0][0], collapse_risk.ship_names([dict(x) for x in top[0][1]])
    shipped = [r for r in json.loads(default_rules_json())["rules"] if r["name"].startswith("collapse_risk")]
    path = os.path.join(scratch, "rules.json")
    ran = json.loads(open(path).read() if os.path.exists(path) else default_rules_json())["rules"]
    same = collapse_risk.same_rules(shipped, chosen)
    # verdicts from the daemon's own alerts when it ran the chosen model,
    # else from the simulation (checked against the rules the daemon ran)
    for r in every:
        got = collapse_risk.fires(r["alerts"])
        r["fires"]["daemon"] = min([got[x["name"]] for x in chosen if x["name"] in got], default=None)
    judged = ("daemon",) if collapse_risk.same_rules(ran, chosen) else tuple(name.split("+"))
    checks = collapse_risk.check_simulation(every, ran)
    for rule, agree, n in checks:
        print("collapse-risk: the simulation reproduces the daemon's first %s firing on %d of %d runs" % (
            rule, agree, n))
    j = {k: collapse_risk.judge(v, judged) for k, v in rows.items()}
    summ = {k: collapse_risk.summarize(v) for k, v in j.items()}
    machine = "%d cores (shared), load average %.1f at the end" % (os.cpu_count(), os.getloadavg()[0])
    collapse_risk.write_report(os.path.join(out, "collapse-risk.md"), rows, j, summ, top, chosen, dict(
        seconds=seconds, machine=machine, shipped=same, checks=checks,
        judged_by="the daemon's alerts" if judged == ("daemon",) else "the simulation of the chosen model on "
        "the stored series (the daemon ran the rules of the sweep's start, rules.json)"))
    with open(os.path.join(out, "collapse-risk.json"), "w") as f:
        json.dump({"seconds": round(seconds, 1), "chosen": chosen, "shipped_matches": same,
                   "held_out": summ["held"], "tune": summ["tune"], "reference": summ["ref"],
                   "held_runs": j["held"], "tune_runs": j["tune"], "reference_runs": j["ref"],
                   "simulation_checks": checks,
                   "candidates": [dict(name=n, rules=r, recall=rc, false_alarms=fa, median_lead=ld,
                                       late_median_lead=lt) for n, r, rc, fa, ld, lt in top[:50]]}, f, indent=1)
    ok = collapse_risk.write_plot(j["held"], os.path.join(scratch, "plot"), os.path.join(out, "collapse-risk.png"))
    print("collapse-risk: %s; held-out recall %s, false alarms %s, median lead %s (collapse after 200: %s) -> "
          "%s/collapse-risk.md%s" % (
              "the built-in collapse_risk" if same else "chosen " + name + " (not the built-in rules)",
              fmt(summ["held"]["recall"]), fmt(summ["held"]["false_alarms"]), fmt(summ["held"]["median_lead"], 0),
              fmt(summ["held"]["late_median_lead"], 0), out, ", collapse-risk.png" if ok else ""))


def splice_summary(path, risk):
    """Rewrites the collapse-risk section of an experiments.md in place
    (--report-only: the learning-rate sweep below it is not re-run)."""
    if not os.path.exists(path):
        return
    text = open(path).read()
    a, b = text.find("## Collapse risk:"), text.find("## The learning-rate sweep")
    if a < 0 or b < a:
        return
    with open(path, "w") as f:
        f.write(text[:a] + "\n".join(collapse_risk.summary_markdown(risk)) + "\n" + text[b:])


def default_rules_json():
    """The daemon's built-in rules (schema/default_rules.json, embedded at build)."""
    with open(os.path.join(ROOT, "schema", "default_rules.json")) as f:
        return f.read()


def main():
    global STEPS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 learning rates per optimizer, no extra seeds")
    ap.add_argument("--jobs", type=int, default=2, help="trainers at a time (default 2)")
    ap.add_argument("--out", default=None,
                    help="where the results go (default docs/; with --quick demo-data/experiments/out/, "
                         "so a quick run never overwrites the committed results)")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--part", choices=("all", "sweep", "predict"), default="all",
                    help="sweep: the learning-rate sweep (experiments.md); predict: the collapse-risk "
                         "study (collapse-risk.md); all: both (default)")
    ap.add_argument("--tune-only", action="store_true", help="predict: run the tune sweep and print the "
                    "best candidate rules, nothing else")
    ap.add_argument("--steps-predict", type=int, default=collapse_risk.STEPS)
    ap.add_argument("--resume", action="store_true", help="predict: keep the last run's runs (its rows.json "
                    "and daemon data) and run only the configs it lacks")
    ap.add_argument("--no-reference", action="store_true", help="predict: skip the reference sweep (the "
                    "held-out seeds of the third session)")
    ap.add_argument("--report-only", action="store_true", help="predict: rewrite the report from the last "
                    "run's rows (demo-data/experiments-predict/rows.json), e.g. after the rule was shipped")
    args = ap.parse_args()
    t_start = time.time()
    for b in (ENTROPYD, SIGMATRAIN):
        if not os.access(b, os.X_OK):
            sys.exit("experiments: %s not built (make)" % b)
    if args.report_only:
        pscratch = os.path.join(ROOT, "demo-data", "experiments-predict")
        done = recorded_rows(pscratch)
        for r in done.values():  # the current definition of healthy (predict_run_all)
            r["healthy"] = r["healthy"] and r["diverge_step"] is None
        rows = split_rows(done, args.steps_predict)
        collapse_risk.simulate(rows["tune"])
        top, _ = collapse_risk.tune(rows["tune"])
        out = args.out or os.path.join(ROOT, "docs")
        report(rows, top, out, pscratch, recorded_seconds(pscratch))
        splice_summary(os.path.join(out, "experiments.md"), json.load(open(os.path.join(out, "collapse-risk.json"))))
        return
    if args.part in ("all", "predict"):
        pscratch = os.path.join(ROOT, "demo-data", "experiments-predict")
        if not args.resume:
            shutil.rmtree(pscratch, ignore_errors=True)
        os.makedirs(pscratch, exist_ok=True)
        pout = args.out or (os.path.join(pscratch, "out") if args.quick or args.tune_only else os.path.join(ROOT, "docs"))
        os.makedirs(pout, exist_ok=True)
        try:
            predict(args, pscratch, pout)
        except KeyboardInterrupt:
            sys.exit("experiments: interrupted")
        if args.part == "predict":
            return
    scratch = os.path.join(ROOT, "demo-data", "experiments")
    shutil.rmtree(scratch, ignore_errors=True)
    logdir = os.path.join(scratch, "logs")
    os.makedirs(logdir)
    if args.out is None:
        args.out = os.path.join(scratch, "out") if args.quick else os.path.join(ROOT, "docs")
    os.makedirs(args.out, exist_ok=True)
    lrs = QUICK_LRS if args.quick else LRS
    configs = [dict(opt=o, norm=n, lr=lr, reparam=rp, seed=1, steps=args.steps)
               for o in lrs for n in NORMS for lr in lrs[o] for rp in ("none", "sigma")]
    t0 = time.time()
    d = Daemon(os.path.join(scratch, "daemon"))
    print("experiments: %d runs, %d at a time; entropyd at http://127.0.0.1:%d/ (data %s)" % (
        len(configs), args.jobs, d.port, d.data), flush=True)
    interrupted = False
    counts = {}
    try:
        rows = run_all(configs, d, logdir, args.jobs)
        if not args.quick:
            more = []
            for c in configs:
                if c["reparam"] != "none":
                    continue
                a = [r for r in rows if r["name"] == run_name(c)][0]
                b = [r for r in rows if r["name"] == run_name(dict(c, reparam="sigma"))][0]
                if verdicts_differ(a, b):
                    more += [dict(c, reparam=rp, seed=s) for s in EXTRA_SEEDS for rp in ("none", "sigma")]
            if more:
                print("experiments: %d more runs (extra seeds where the arms' verdicts differ)" % len(more),
                      flush=True)
                rows += run_all(more, d, logdir, args.jobs)
        counts = alert_counts(d)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        d.stop()
    if interrupted:
        sys.exit("experiments: interrupted")
    seconds = time.time() - t0
    cmd = "make experiments" if not args.quick else "python3 scripts/experiments.py --quick"
    machine = "%d cores (shared), load average %.1f at the end" % (os.cpu_count(), os.getloadavg()[0])
    series = {r["name"]: {"min": r.pop("series"), "heads": r.pop("heads_series")} for r in rows}
    with open(os.path.join(scratch, "series.json"), "w") as f:
        json.dump(series, f)
    with open(os.path.join(args.out, "experiments.json"), "w") as f:
        json.dump({"command": cmd, "seconds": round(seconds, 1), "steps": args.steps,
                   "model": MODEL, "common": COMMON, "rows": rows}, f, indent=1)
    pjson = os.path.join(args.out, "collapse-risk.json")
    risk = json.load(open(pjson)) if os.path.exists(pjson) else None
    write_markdown(rows, os.path.join(args.out, "experiments.md"), cmd, time.time() - t_start, machine, counts,
                   risk)
    ok = write_plot(rows, os.path.join(scratch, "plot"), os.path.join(args.out, "experiments.png"))
    print("experiments: %d runs in %.1f min -> %s/experiments.md%s" % (
        len(rows), seconds / 60, args.out, ", experiments.png" if ok else ""))


if __name__ == "__main__":
    main()
