"""End-to-end alert tests against the real daemon: a run whose entropy
collapses fires entropy_collapse once; the webhook receives the exact
Alertmanager payload (retried after a 500); the exec hook runs with the JSON
on stdin; the trainer's own connection receives the alert line; the alert
resolves once the heads recover; transitions are stored in SQLite."""
import json
import os
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Client, Daemon, Receiver, wait_for  # noqa: E402


RULES = {"rules": [
    {"name": "entropy_collapse", "metric": "entropy_norm", "scope": "head",
     "condition": {"op": "below", "value": 0.1}, "for": 3, "keep_firing_for": 2, "severity": "critical",
     "labels": {"team": "ml"},
     "annotations": {"summary": "collapse in {run}", "description": "heads {cells}"}},
    {"name": "loss_nonfinite", "metric": "loss", "scope": "scalar", "condition": {"op": "nonfinite"}},
]}


def step(seq, s, low_heads=(), loss=2.0):
    vals = [[0.1 * 0 + 0.8 for _ in range(3)] for _ in range(2)]
    for (l, h) in low_heads:
        vals[l][h] = 0.01
    return {"type": "step", "seq": seq, "step": s, "time": 1764500000 + s,
            "scalars": {"loss": loss}, "heads": {"entropy_norm": vals}}


class AlertE2E(unittest.TestCase):
    def test_collapse_fires_once_notifies_and_resolves(self):
        hook = Receiver(refuse=1, refuse_status=500)  # 500 to the first POST, then 200
        tmp = tempfile.TemporaryDirectory()
        rules = os.path.join(tmp.name, "rules.json")
        with open(rules, "w") as f:
            json.dump(RULES, f, indent=2)
        hook_out = os.path.join(tmp.name, "hook.out")
        d = Daemon(args=["--rules", rules, "--webhook", hook.url("/hook"),
                         "--on-alert", "cat >> %s; echo \" $ENTROPYD_ALERT_STATUS $ENTROPYD_ALERT_NAME\" >> %s"
                         % (hook_out, hook_out)], http=True).start()
        try:
            c = Client(d.sock)
            w = c.hello("collapsing", layers=2, heads=3)
            seq = 0
            lines = []
            # healthy, then heads (0,1) and (1,2) collapse at step 10, recover at step 30
            for s in range(40):
                seq += 1
                low = [(0, 1), (1, 2)] if 10 <= s < 30 else []
                c.send(step(seq, s, low))
                _, seen = c.recv_until(lambda m: m["type"] == "ack" and m["seq"] >= seq)
                lines += [m for m in seen if m["type"] == "alert"]
            # the trainer got the alert on its own connection: firing at 13, resolved at 32
            kinds = [(m["transition"], m["rule"], m["step"]) for m in lines]
            self.assertIn(("firing", "entropy_collapse", 13), kinds)
            self.assertIn(("resolved", "entropy_collapse", 32), kinds)
            fire = [m for m in lines if m["transition"] == "firing"][0]
            self.assertEqual(fire["start_step"], 10)
            # echoes the time of the step message it was evaluated on (the trainer's clock)
            self.assertEqual(fire["step_time"], 1764500000 + 13)
            self.assertEqual(sorted((x["layer"], x["head"]) for x in fire["alert"]["cells"]), [(0, 1), (1, 2)])
            # webhook: a 500, then the retry delivered; then the resolved one
            deadline = time.time() + 20
            while time.time() < deadline and len(hook.delivered()) < 2:
                time.sleep(0.1)
            ok = [p.json() for p in hook.delivered()]
            self.assertEqual(hook.posts[0].status, 500)
            self.assertEqual(hook.posts[0].json(), ok[0], "the retry resends the same payload")
            self.assertEqual(hook.posts[0].content_type, "application/json")
            self.assertEqual([p["status"] for p in ok], ["firing", "resolved"], "one firing, one resolved, no duplicate")
            p = ok[0]
            self.assertEqual(p["version"], "4")
            self.assertEqual(p["receiver"], "entropyd")
            self.assertEqual(p["groupLabels"], {"alertname": "entropy_collapse", "run": "collapsing"})
            self.assertEqual(p["groupKey"], '{}:{alertname="entropy_collapse", run="collapsing"}')
            self.assertEqual(len(p["alerts"]), 1)
            a = p["alerts"][0]
            self.assertEqual(a["status"], "firing")
            self.assertEqual(a["labels"], {"alertname": "entropy_collapse", "run": "collapsing", "severity": "critical",
                                           "metric": "entropy_norm", "team": "ml"})
            self.assertEqual(a["annotations"]["summary"], "collapse in collapsing")
            self.assertEqual(a["annotations"]["description"], "heads layer 0 head 1, layer 1 head 2")
            self.assertRegex(a["startsAt"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
            self.assertEqual(a["endsAt"], "0001-01-01T00:00:00Z")
            self.assertRegex(a["fingerprint"], r"^[0-9a-f]{16}$")
            r = ok[1]["alerts"][0]
            self.assertEqual(r["status"], "resolved")
            self.assertEqual(r["fingerprint"], a["fingerprint"])
            self.assertNotEqual(r["endsAt"], "0001-01-01T00:00:00Z")
            # exec hook: both notifications, JSON on stdin
            deadline = time.time() + 10
            while time.time() < deadline and (not os.path.exists(hook_out) or open(hook_out).read().count("entropy_collapse\n") < 2):
                time.sleep(0.1)
            text = open(hook_out).read()
            self.assertIn(" firing entropy_collapse\n", text)
            self.assertIn(" resolved entropy_collapse\n", text)
            self.assertIn('"version":"4"', text)
            # stored: one episode with its transitions
            rows = d.query("SELECT rule, state, start_step, last_step FROM alerts WHERE run_id=?", (w["run_id"],))
            self.assertEqual(rows, [("entropy_collapse", "resolved", 10, 32)])
            tr = d.query("SELECT t.transition, t.step FROM alert_transitions t JOIN alerts a ON a.id=t.alert_id "
                         "WHERE a.run_id=? ORDER BY t.id", (w["run_id"],))
            self.assertEqual(tr, [("firing", 13), ("resolved", 32)])
            # the HTTP API: the episode with its transitions, filters, and errors
            st, al = d.get("/api/runs/%d/alerts" % w["run_id"])
            self.assertEqual(st, 200)
            self.assertEqual([(a["rule"], a["state"], a["start_step"], a["last_step"]) for a in al],
                             [("entropy_collapse", "resolved", 10, 32)])
            self.assertEqual([(t["transition"], t["step"]) for t in al[0]["transitions"]], [("firing", 13), ("resolved", 32)])
            self.assertEqual(al[0]["alert"]["labels"]["alertname"], "entropy_collapse")
            self.assertEqual(sorted((x["layer"], x["head"]) for x in al[0]["cells"]), [(0, 1), (1, 2)])
            self.assertEqual(d.get("/api/alerts?state=resolved&run=%d" % w["run_id"])[1], al)
            self.assertEqual(d.get("/api/alerts?state=firing")[1], [])
            self.assertEqual(d.get("/api/alerts?state=sideways")[0], 400)
            self.assertEqual(d.get("/api/runs/999/alerts")[0], 404)
            # a NaN loss fires loss_nonfinite at once
            seq += 1
            c.send(step(seq, 40, loss=None))
            m, _ = c.recv_until(lambda m: m["type"] == "alert" and m["rule"] == "loss_nonfinite")
            self.assertEqual(m["transition"], "firing")
            # ... and is listed as firing, and exported as an entropyd_alerts_firing series
            # (not ALERTS: that is Prometheus' own series for its rules)
            st, al = d.get("/api/alerts?state=firing")
            self.assertEqual([(a["rule"], a["run"]) for a in al], [("loss_nonfinite", "collapsing")])
            st, text = d.get("/metrics")
            self.assertEqual(st, 200)
            self.assertIn('entropyd_alerts_firing{alertname="loss_nonfinite",run="collapsing",severity="warning"} 1',
                          text)
            self.assertNotIn('entropyd_alerts_firing{alertname="entropy_collapse"', text)
            self.assertNotIn('\nALERTS', text)
            c.close()
        finally:
            d.cleanup()
            hook.close()
            tmp.cleanup()

    def test_bad_rules_file_is_refused_with_its_line(self):
        tmp = tempfile.TemporaryDirectory()
        rules = os.path.join(tmp.name, "rules.json")
        with open(rules, "w") as f:
            f.write('{"rules": [\n  {"name": "x", "scope": "head", "metric": "e",\n   "condition": {"op": "below"}}\n]}\n')
        d = Daemon(args=["--rules", rules])
        try:
            with self.assertRaises(RuntimeError) as cm:
                d.start()
            self.assertIn("line 2", str(cm.exception))
            self.assertIn('condition needs "value"', str(cm.exception))
        finally:
            d.cleanup()
            tmp.cleanup()


CLOCK_RULES = {"rules": [
    {"name": "entropy_collapse", "metric": "entropy_norm", "scope": "head",
     "condition": {"op": "below", "value": 0.1}, "for": 3, "keep_firing_for": 0, "severity": "critical"},
    {"name": "run_stalled", "scope": "run", "condition": {"op": "stalled", "seconds": 2}},
]}


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError("no %s in /metrics" % name)


class AlertClocksAndDelivery(unittest.TestCase):
    """Alert times on the daemon's clock, whatever the trainer's
    says; the real port in generatorURL/externalURL with --http HOST:0; a
    restart during an episode goes on with it (no second page, the old
    startsAt); transitions[].time is the transition's; delivery counters."""

    def start(self, hook):
        """A daemon with CLOCK_RULES and the webhook, on a data directory of its own."""
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        rules = os.path.join(tmp.name, "rules.json")
        with open(rules, "w") as f:
            json.dump(CLOCK_RULES, f)
        return Daemon(data=tmp.name, args=["--rules", rules, "--webhook", hook.url("/hook")], http=True).start()

    def test_skewed_trainer_clock_restart_and_urls(self):
        hook = Receiver()
        d = self.start(hook)
        try:
            c = Client(d.sock)
            rid = c.hello("skewed", layers=2, heads=3)["run_id"]
            lines, seq = [], 0

            def send(s, low, skew):
                nonlocal seq
                seq += 1
                m = step(seq, s, low)
                m["time"] = time.time() + skew
                c.send(m)
                _, seen = c.recv_until(lambda m: m["type"] == "ack" and m["seq"] >= seq)
                lines.extend(x for x in seen if x["type"] == "alert")

            # a trainer 5 minutes behind, streaming 20 steps/s for 3 s (past
            # the 2 s stall rule): on the trainer's clock every tick saw a
            # 300 s silence and every step ended it
            t0 = time.time()
            for s in range(60):
                send(s, [], -300)
                time.sleep(0.05)  # not a wait: paces the trainer at 20 steps/s
            self.assertEqual([m for m in lines if m["rule"] == "run_stalled"], [], "stalled flapped")
            # a collapse: its startsAt is the daemon's now, not the trainer's (-300 s) or 1 h ahead
            for s in range(60, 64):
                send(s, [(0, 1)], 3600)
            fire = wait_for(lambda: [p.json() for p in hook.delivered() if p.json()["status"] == "firing"],
                            what="the firing webhook")[0]
            t1 = time.time()
            st, al = d.get("/api/runs/%d/alerts" % rid)
            self.assertEqual(len(al), 1)
            ep = al[0]
            self.assertGreaterEqual(ep["starts_at"], t0 - 1)
            self.assertLessEqual(ep["starts_at"], t1 + 1)
            self.assertEqual([t["transition"] for t in ep["transitions"]], ["firing"])
            # with --http 127.0.0.1:0: the real port, and a link to the run's page
            base = "http://127.0.0.1:%d" % d.http_port
            self.assertEqual(fire["externalURL"], base)
            self.assertEqual(fire["alerts"][0]["generatorURL"], "%s/?run=%d" % (base, rid))
            starts = fire["alerts"][0]["startsAt"]

            # the daemon restarts while the collapse goes on
            c.close()
            self.assertEqual(d.stop(), 0)
            # not a wait: lets the clock pass a second, so that an episode the
            # restarted daemon opened anew would have a later start than this one
            time.sleep(1.1)
            d.start()
            c = Client(d.sock)
            w = c.hello("skewed", layers=2, heads=3)
            self.assertEqual(w["run_id"], rid)
            seq = w["last_seq"]
            lines.clear()
            for s in range(64, 68):
                send(s, [(0, 1)], 0)
            self.assertIn("firing", [m["transition"] for m in lines], "the trainer hears the alert again")
            wait_for(lambda: metric(d.get("/metrics")[1], "entropyd_alert_resumed_total") == 1, what="resumed")
            t_rec = time.time()
            send(68, [], 0)  # recovers: resolved
            wait_for(lambda: [p for p in hook.delivered() if p.json()["status"] == "resolved"], what="resolved")
            posts = [p.json() for p in hook.delivered()]
            self.assertEqual([p["status"] for p in posts], ["firing", "resolved"], "no second page after the restart")
            self.assertEqual(posts[1]["alerts"][0]["startsAt"], starts, "the episode keeps its start")
            st, al = d.get("/api/runs/%d/alerts" % rid)
            self.assertEqual([(a["state"], a["starts_at"]) for a in al], [("resolved", ep["starts_at"])])
            tr = al[0]["transitions"]
            self.assertEqual([t["transition"] for t in tr], ["firing", "firing", "resolved"])
            # each transition at its own time: the resumed firing after the
            # restart, the resolution at the recovery, not the episode's start
            self.assertGreater(tr[1]["time"], ep["starts_at"] + 1)
            self.assertGreaterEqual(tr[2]["time"], t_rec - 1)
            # the receiver holds the POST before the notifier has its answer
            # and counts it sent: wait for the count, then check it is one
            wait_for(lambda: metric(d.get("/metrics")[1], 'entropyd_notifications_sent_total{sink="webhook"}') >= 1,
                     what="the resolved note counted sent")
            text = d.get("/metrics")[1]
            self.assertEqual(metric(text, 'entropyd_notifications_sent_total{sink="webhook"}'), 1)  # since the restart
            self.assertEqual(metric(text, 'entropyd_notifications_failed_total{sink="webhook"}'), 0)
            self.assertGreaterEqual(metric(text, "entropyd_alert_transitions_total"), 2)
            c.close()
        finally:
            d.cleanup()
            hook.close()

    def test_flapping_loss_does_not_flood_the_log(self):
        d = Daemon(http=True).start()  # the default rules: loss_nonfinite fires and resolves at once
        try:
            c = Client(d.sock)
            rid = c.hello("flap", layers=2, heads=3)["run_id"]
            for s in range(100):
                c.send(step(s + 1, s, loss=None if s % 2 == 0 else 2.0))
            c.recv_until(lambda m: m["type"] == "ack" and m["seq"] >= 100)
            wait_for(lambda: len(d.get("/api/runs/%d/alerts" % rid)[1]) == 50, what="50 episodes stored")
            wait_for(lambda: metric(d.get("/metrics")[1], "entropyd_notifications_queued_total") == 100,
                     what="100 notifications")
            # a scalar rule's cells have no layer or head (they said -1: "L-1 h-1" on the page)
            al = d.get("/api/runs/%d/alerts" % rid)[1]
            self.assertEqual(al[0]["cells"], [{"value": None}])
            self.assertEqual(al[0]["alert"]["cells"], [{"value": None}])
            # notify_post logs each transition (unbuffered stderr) under the
            # lock it counts it with: with 100 counted every line is written,
            # the first window's 20 at least
            def twenty_logged():
                lines = [l for l in d.log().splitlines()
                         if "alert firing: loss_nonfinite" in l or "alert resolved: loss_nonfinite" in l]
                return len(lines) >= 20 and lines
            lines = wait_for(twenty_logged, what="the log sink's first 20 lines")
            self.assertLessEqual(len(lines), 20, "100 transitions in a second: at most 20 lines per 10 s")
            c.close()
        finally:
            d.cleanup()

    def test_refused_webhook_is_logged_and_counted(self):
        hook = Receiver(refuse=1000, refuse_status=400)  # a 4xx is not retried
        d = self.start(hook)
        try:
            c = Client(d.sock)
            c.hello("refused", layers=2, heads=3)
            for s in range(4):
                c.send(step(s + 1, s, [(1, 1)]))
            c.recv_until(lambda m: m["type"] == "ack" and m["seq"] >= 4)
            wait_for(lambda: metric(d.get("/metrics")[1], 'entropyd_notifications_failed_total{sink="webhook"}') == 1,
                     what="the failure counted")
            self.assertIn("gave up on entropy_collapse firing", d.log())
            c.close()
        finally:
            d.cleanup()
            hook.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
