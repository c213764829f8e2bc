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
  python3 research/experiments.py [--quick] [--jobs N] [--out DIR]
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
import sweep  # noqa: E402
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
COLLAPSE_FLOOR = 0.05  # entropy_collapse's value (schema/default_rules.json), drawn on the plot


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
    for key, flag in (("warmup", "--warmup"), ("clip", "--clip"), ("schedule", "--schedule")):
        if c.get(key):
            common[common.index(flag) + 1] = str(c[key])
    if c.get("weight_decay"):
        common += ["--weight-decay", repr(c["weight_decay"])]
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
           "Generated by `%s`: the learning-rate sweep took %.1f min on %s%s." % (
               cmd, seconds / 60, machine, "; the collapse-risk study before it %.1f min" % (predict["seconds"] / 60)
               if predict else ""), ""]
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
           "any head's entropy_norm (the earlier rule, below 0.01 for 20 steps, fired iff "
           "0.01 is above this); `max logit`: the largest attention logit." % (
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
    every = sweep.quick_runs() if args.quick else sweep.runs(args.configs)
    done, before = (recorded_rows(scratch), recorded_seconds(scratch)) if args.resume else ({}, 0.0)
    todo = [c for c in every if run_name(c) not in done]
    print("collapse-risk: %d runs (%d configurations x %d seeds; %d tune, %d held-out; %d to run, %d kept); "
          "entropyd at http://127.0.0.1:%d/" % (
              len(every), len({c["config"] for c in every}), len({c["seed"] for c in every}),
              sum(c["split"] == "tune" for c in every), sum(c["split"] == "held" for c in every),
              len(todo), len(every) - len(todo), d.port), flush=True)
    try:
        new = {r["name"]: r for r in predict_run_all(todo, d, logdir, args.jobs, os.path.join(scratch, "rows.jsonl"))}
    finally:
        d.stop()
    done.update(new)
    with open(os.path.join(scratch, "seconds.json"), "w") as f:
        json.dump({"seconds": round(before + time.time() - t0, 1)}, f)
    if args.collect_only:
        return
    rows = split_rows(done, every)
    if args.quick:
        quick_report(rows["quick"], out)
        return
    report(rows, out, scratch, before + time.time() - t0, tune_only=args.tune_only)


def split_rows(done, every):
    """{"tune", "held", "quick"}: the recorded rows of the runs in every, by
    the half of the sweep their configuration is in."""
    out = {"tune": [], "held": [], "quick": []}
    for c in every:
        if run_name(c) in done:
            out[c["split"]].append(done[run_name(c)])
    return out


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


BUILTIN_ALONE = ("entropy_drop", "logit_growth")


def report(rows, out, scratch, seconds, tune_only=False):
    """Tunes on rows["tune"] only, then judges the chosen model and the
    built-in rules alone on rows["held"]: docs/collapse-risk.md, .json,
    .png, and the item-5 table printed."""
    t0 = time.time()
    tune_rows, held = rows["tune"], rows["held"]
    collapse_risk.simulate(tune_rows)
    top = collapse_risk.tune(tune_rows)
    print("collapse-risk: %d tune runs (%d collapse, %d train fine); best models on the tune half:" % (
        len(tune_rows), sum(r["collapsed"] for r in tune_rows), sum(r["healthy"] for r in tune_rows)))
    for names, rules, rec, far, lead in top[:8]:
        print("  recall %.2f  false alarms %.3f  median lead %-5s %s" % (rec, far, fmt(lead, 0),
                                                                         collapse_risk.show(rules)))
    if tune_only or not top:
        return
    names, rules = top[0][0], top[0][1]
    chosen = collapse_risk.ship_names([dict(x) for x in rules])
    collapse_risk.simulate(held, rules)
    ran = json.loads(open(os.path.join(scratch, "rules.json")).read())["rules"]
    shipped = json.loads(default_rules_json())["rules"]
    same = collapse_risk.same_rules(shipped, chosen)
    checks = collapse_risk.check_simulation(held + tune_rows, [x for x in ran if x["name"] in
                                                               BUILTIN_ALONE + ("collapse_risk", "collapse_risk_loss")])
    for rule, agree, n in checks:
        print("collapse-risk: the simulation reproduces the daemon's first %s firing on %d of %d runs" % (
            rule, agree, n))
    before = tuple(x["name"] for x in ran if x["name"].startswith("collapse_risk"))

    def daemon(rule_names):
        return lambda r: min([f for n, f in collapse_risk.fires(r["alerts"]).items() if n in rule_names],
                             default=None)
    detectors = [("the model (tuned on the tune half)", lambda r: collapse_risk.model_fire(r, names))] + [
        ("`%s` alone" % n, daemon((n,))) for n in BUILTIN_ALONE] + [
        ("collapse_risk before this sweep (%s)" % ", ".join("`%s`" % n for n in before), daemon(before))]
    res = {}
    for split, rs in (("held", held), ("tune", tune_rows)):
        res[split] = []
        for label, f in detectors:
            j = collapse_risk.judge(rs, f)
            res[split].append((label, collapse_risk.stats(j), collapse_risk.bootstrap(j), j))
    hm = res["held"][0]
    alone = res["held"][1:1 + len(BUILTIN_ALONE)]
    best = max(alone, key=lambda x: ((x[1]["recall"] or 0), (x[1]["median_lead"] or 0)))
    paired = collapse_risk.paired_lead(hm[3], best[3])
    table = collapse_risk.figure_table([x[:3] for x in res["held"]])
    verdict = collapse_risk.verdict_lines(hm[1], (best[0], best[1]), paired)
    print("\n".join(["", "collapse-risk: held-out half (%d runs of %d configurations), 95%% bootstrap intervals "
                     "over configurations:" % (len(held), len({r["config"]["config"] for r in held}))] + table +
                    [""] + verdict))
    ctx = dict(seconds=seconds, tune_seconds=time.time() - t0, same=same, checks=checks, chosen=chosen, top=top,
               table=table, verdict=verdict, tune_table=collapse_risk.figure_table([x[:3] for x in res["tune"]]),
               machine="%d cores shared with other work, load average %.1f at the end" % (
                   os.cpu_count(), os.getloadavg()[0]))
    write_risk_report(os.path.join(out, "collapse-risk.md"), rows, res, ctx)
    with open(os.path.join(out, "collapse-risk.json"), "w") as f:
        json.dump({"seconds": round(seconds, 1), "chosen": chosen, "shipped_matches": same,
                   "held_out": {lab: dict(st, intervals=iv) for lab, st, iv, _ in res["held"]},
                   "tune": {lab: dict(st, intervals=iv) for lab, st, iv, _ in res["tune"]},
                   "verdict": verdict, "simulation_checks": checks,
                   "held_runs": hm[3], "tune_runs": res["tune"][0][3],
                   "candidates": [dict(rules=r, recall=rc, false_alarms=fa, median_lead=ld)
                                  for _, r, rc, fa, ld in top[:30]]}, f, indent=1)
    ok = collapse_risk.write_plot(hm[3], os.path.join(scratch, "plot"), os.path.join(out, "collapse-risk.png"),
                                  "Held-out runs that collapse: the collapse-risk model against entropy_drop")
    print("collapse-risk: -> %s/collapse-risk.md%s (%s)" % (out, ", collapse-risk.png" if ok else "",
          "the built-in collapse_risk* rules are this model" if same else
          "schema/default_rules.json does NOT ship this model"))


def breakdown(j, rows, key):
    """Lines "value: caught/collapsing" per value of config[key]."""
    cfg = {r["name"]: r["config"] for r in rows}
    by = {}
    for x in j:
        if x["collapsed"]:
            k = cfg[x["name"]][key]
            c = by.setdefault(k, [0, 0])
            c[1] += 1
            c[0] += x["fire"] is not None and x["fire"] < x["collapse_step"]
    return ", ".join("%s %d/%d" % (k, a, b) for k, (a, b) in sorted(by.items(), key=lambda kv: str(kv[0])))


def need_long(n):
    """Collapses that must be led by the target lead for a median at least
    that long at a recall of 90% of n."""
    caught = math.ceil(0.9 * n)
    return caught // 2 + 1 if caught % 2 == 0 else (caught + 1) // 2


def arm_alarms(held, chosen):
    """"rule: n runs" for each rule of the model on the runs that train fine."""
    out = []
    for rule in chosen:
        n = 0
        for r in held:
            if r["healthy"]:
                n += collapse_risk.simulate_rule(collapse_risk.RunSeries(r["data"]), rule) not in (None,
                                                                                                   "unsupported")
        out.append("`%s` on %d" % (rule["name"], n))
    return ", ".join(out) + " of %d" % sum(r["healthy"] for r in held)


def write_risk_report(path, rows, res, ctx):
    held, tune_rows = rows["held"], rows["tune"]
    every = held + tune_rows
    hm = res["held"][0]

    def count(rs):
        return "%d runs of %d configurations: %d collapse, %d train fine, %d neither" % (
            len(rs), len({r["config"]["config"] for r in rs}), sum(r["collapsed"] for r in rs),
            sum(r["healthy"] for r in rs), sum(not r["collapsed"] and not r["healthy"] for r in rs))
    col = [r for r in held if r["collapsed"]]
    early = sorted(r["collapse_step"] for r in col if r["collapse_step"] < collapse_risk.TARGETS["median_lead"])
    out = ["# Collapse risk: an alert before a harmful entropy collapse begins", "",
           "Generated by `make experiments` (research/experiments.py, research/collapse_risk.py, research/sweep.py): "
           "the sweep took %.1f min of wall time, tuning and judging %.1f min, on %s." % (
               ctx["seconds"] / 60, ctx["tune_seconds"] / 60, ctx["machine"]), "",
           "## The sweep", "",
           "%d configurations drawn once by research/sweep.py (seed %d): width C in %s, heads %s (dividing C), "
           "depth %s, LayerNorm pre/post/none, Adam, AdamW (weight decay 0.1) or SGD with momentum, constant or "
           "cosine schedule, warmup %s steps, clipping at 1.0 or none, σReparam on a quarter, %s steps, peak "
           "learning rate log-uniform (Adam/AdamW %g-%g, momentum %g-%g; the last %d configurations from a "
           "3x higher range, %g-%g and %g-%g, so that there are collapses in the first steps); context %d, "
           "batch %d, the synthetic corpus (vocabulary 64), probe on every step. Seeds %s on every "
           "configuration. Split by configuration, never by seed, before any run was seen: the tune half "
           "(%s) is all tuning looked at; the held-out half (%s) judged the model once." % (
               len({r["config"]["config"] for r in every}), sweep.SWEEP_SEED, sweep.WIDTHS, sweep.HEADS,
               sweep.DEPTHS, sorted(set(sweep.WARMUPS)), sweep.STEPS, sweep.LR_RANGE["adam"][0],
               sweep.LR_RANGE["adam"][1], sweep.LR_RANGE["momentum"][0], sweep.LR_RANGE["momentum"][1],
               sweep.N_CONFIGS - sweep.BASE, sweep.UNSTABLE_LR["adam"][0], sweep.UNSTABLE_LR["adam"][1],
               sweep.UNSTABLE_LR["momentum"][0], sweep.UNSTABLE_LR["momentum"][1], sweep.SEQ_LEN, sweep.BATCH,
               ", ".join(map(str, sweep.SEEDS)), count(tune_rows), count(held)), "",
           "A run *collapses* (a harmful collapse) when the daemon's built-in `entropy_collapse` fires: some "
           "head's entropy_norm below 0.05 on 20 of 30 steps while the loss does not train "
           "([science.md](science.md#what-counts-as-an-entropy-collapse-the-verdicts-definition)); the collapse "
           "*begins* at that alert's start_step. A run *trains fine* when that never fires, the trainer exits 0, "
           "the final validation loss is finite and below ln 64 and the training loss never rises 1 nat above "
           "its running minimum. The rest (diverged or stalled without a collapse, e.g. post-LN runs stuck near "
           "3.8 with no head below 0.05) count for neither. *Recall*: collapsing runs where the detector fired "
           "before the collapse began; *lead*: the collapse's start minus the step the detector fired; *false "
           "alarm*: a run that trains fine where it fired at all. Intervals: 95%%, percentile bootstrap over "
           "configurations (%d resamples; a configuration brings its three seeds)." % collapse_risk.BOOT, "",
           "## Held-out figures", "", "![held-out collapses: when the model fires, when entropy_drop fires, when "
           "the collapse begins](collapse-risk.png)", ""] + ctx["table"] + ["", "Against the targets:", ""] + ctx["verdict"] + [
           "", "Of the %d held-out collapses, %d begin before step %d (at steps %s): no detector can lead those "
           "by %d steps, so a median lead of %d needs the rest to be led by more. Recall by LayerNorm "
           "placement: %s; by optimizer: %s; σReparam: %s." % (
               len(col), len(early), collapse_risk.TARGETS["median_lead"], ", ".join(map(str, early)) or "-",
               collapse_risk.TARGETS["median_lead"], collapse_risk.TARGETS["median_lead"],
               breakdown(hm[3], held, "norm"), breakdown(hm[3], held, "opt"), breakdown(hm[3], held, "reparam")),
           "", "Which rule of the model fires on the held-out runs that train fine (its false alarms): %s. "
           "Those are observations of the held-out half, reported, not tuned on: a change made from them "
           "needs a fresh held-out sweep (a new SWEEP_SEED) to be judged." % arm_alarms(held, ctx["chosen"]),
           "", "What would be needed: %d of the %d collapses begin before step %d, and no detector can lead "
           "those by %d steps (the lead is at most the step the collapse begins), so a median lead of %d at "
           "a recall of 90%% needs at least %d of the other %d led by %d steps or more; the model leads %d "
           "collapses by that much. Leads that long on the fast collapses need a signal known before training "
           "moves, such as the configuration itself (the learning rate against the width and the warmup), "
           "which is no streamed metric. The false alarms come from growth of a head's logits on runs that "
           "go on training; a guard on the loss (the `unless_training` of the rule language) on the growth "
           "rules, or a growth relative to the head's own scale, are the next rules to try, on a new sweep." % (
               len(early), len(col), collapse_risk.TARGETS["median_lead"], collapse_risk.TARGETS["median_lead"],
               collapse_risk.TARGETS["median_lead"], need_long(len(col)), len(col) - len(early),
               collapse_risk.TARGETS["median_lead"],
               sum(1 for x in hm[3] if x["lead"] is not None and x["lead"] >= collapse_risk.TARGETS["median_lead"])),
           "", "## The model", "",
           "Chosen on the tune half alone (research/collapse_risk.py tune(): an OR of one to three rules of a grid "
           "of %d rules of the daemon's language; false alarms at most 2.5%% of the tune half's runs that train "
           "fine; every early collapse caught no later than `entropy_drop`; a recall within one run of the best; "
           "then the longest median lead). It fires when any of its rules fires:" % len(
               collapse_risk.candidate_rules()), "",
           "```json", json.dumps(ctx["chosen"], indent=1), "```", "",
           ("The built-in `collapse_risk*` rules (schema/default_rules.json) are these." if ctx["same"] else
            "schema/default_rules.json does NOT ship these rules."), "",
           "Judged by simulating its rules on the stored series with the engine's semantics; the simulation "
           "reproduces the daemon's own first firing of %s." % ", ".join(
               "`%s` on %d of %d runs" % c for c in ctx["checks"]), "",
           "## Tune-half figures (what the model was chosen on)", ""] + ctx["tune_table"] + [
           "", "Best models on the tune half:", "", "| rules | recall | false alarms | median lead |",
           "|---|---|---|---|"]
    for _, rules, rec, far, lead in ctx["top"][:10]:
        out.append("| `%s` | %.2f | %.3f | %s |" % (collapse_risk.show(rules), rec, far, fmt(lead, 0)))
    out += ["", "## Every held-out run", "",
            "| run | verdict | collapse begins | model fires | lead | entropy_drop fires |", "|---|---|---|---|---|---|"]
    for x in hm[3]:
        v = "collapses" if x["collapsed"] else "trains fine" if x["healthy"] else "neither"
        out.append("| %s | %s | %s | %s | %s | %s |" % (x["name"], v, fmt(x["collapse_step"], 0),
                                                     fmt(x["fire"], 0), fmt(x["lead"], 0), fmt(x["drop_fire"], 0)))
    out.append("")
    with open(path, "w") as f:
        f.write("\n".join(out))


def quick_report(rows, out):
    """--quick: the built-in collapse_risk* rules as the daemon ran them on
    the CI subset; quick.json for tests/e2e_experiments.py."""
    res = []
    for r in rows:
        got = collapse_risk.fires(r["alerts"])
        risk = min([f for n, f in got.items() if n.startswith("collapse_risk")], default=None)
        res.append(dict(name=r["name"], collapsed=r["collapsed"], healthy=r["healthy"],
                        collapse_start=r["collapse_step"], collapse_fires=got.get("entropy_collapse"),
                        risk_fires=risk, entropy_drop_fires=got.get("entropy_drop")))
        print("%-48s %-11s collapse begins %-5s fires %-5s collapse_risk* %-5s entropy_drop %s" % (
            r["name"], "collapses" if r["collapsed"] else "trains fine" if r["healthy"] else "neither",
            fmt(r["collapse_step"], 0), fmt(got.get("entropy_collapse"), 0), fmt(risk, 0),
            fmt(got.get("entropy_drop"), 0)))
    with open(os.path.join(out, "quick.json"), "w") as f:
        json.dump(res, f, indent=1)


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
    ap.add_argument("--tune-only", action="store_true", help="predict: print the best candidate rules on "
                    "the tune half, write no report")
    ap.add_argument("--collect-only", action="store_true", help="predict: run and record the sweep, no "
                    "tuning and no report (then --report-only)")
    ap.add_argument("--configs", type=int, default=sweep.N_CONFIGS,
                    help="predict: the first N configurations of the draw (default %d, 3 seeds each)" % sweep.N_CONFIGS)
    ap.add_argument("--scratch", default=None, help="predict: scratch directory (default "
                    "demo-data/experiments-predict, with --quick demo-data/experiments-quick)")
    ap.add_argument("--resume", action="store_true", help="predict: keep the last run's runs (its rows.json "
                    "and daemon data) and run only the configs it lacks")
    ap.add_argument("--report-only", action="store_true", help="predict: rewrite the report from the last "
                    "run's rows (demo-data/experiments-predict/rows.json), e.g. after the rule was shipped")
    args = ap.parse_args()
    t_start = time.time()
    for b in (ENTROPYD, SIGMATRAIN):
        if not os.access(b, os.X_OK):
            sys.exit("experiments: %s not built (make)" % b)
    pscratch = args.scratch or os.path.join(ROOT, "demo-data", "experiments-quick" if args.quick else
                                            "experiments-predict")
    if args.report_only:
        done = recorded_rows(pscratch)
        rows = split_rows(done, sweep.runs(args.configs))
        out = args.out or os.path.join(ROOT, "docs")
        report(rows, out, pscratch, recorded_seconds(pscratch), tune_only=args.tune_only)
        if args.tune_only:
            return
        splice_summary(os.path.join(out, "experiments.md"), json.load(open(os.path.join(out, "collapse-risk.json"))))
        return
    if args.part in ("all", "predict"):
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
    cmd = "make experiments" if not args.quick else "python3 research/experiments.py --quick"
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
