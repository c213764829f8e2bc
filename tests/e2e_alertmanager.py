"""entropyd --alertmanager URL against a fake Alertmanager: a
collapse fires; Alertmanager's API receives `POST /api/v2/alerts` with an
array of {labels, annotations, startsAt, endsAt, generatorURL}, endsAt in
the future (now + 4 re-send periods) while firing; the firing alert is
re-sent every --alertmanager-resend-s; the resolved one arrives once with
its real endsAt (after a 503 and a retry) and the re-sending stops; the
webhook still gets its own payload.  Against a real Alertmanager (issue
16; skipped where prometheus-alertmanager is not installed): the shipped
docs/distributed/alertmanager.yml routes the daemon's health to infra and a
critical collapse to the pager (amtool); a trainer whose clock is an hour
ahead still gets its alert taken (startsAt is the daemon's), and a daemon
restart during the episode keeps Alertmanager's startsAt.  python3 stdlib
only."""
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Client, Daemon, Receiver, free_port, wait_for  # noqa: E402


def metric(d, name):
    """The value of the /metrics sample named name (with its labels, if
    any) of daemon d."""
    for line in d.get("/metrics")[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError("no %s on /metrics" % name)


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def resolved(body):
    """A POST body that carries a resolved alert (its endsAt has come: a
    resolved POST can arrive within the millisecond of its endsAt)."""
    alerts = json.loads(body)
    return any(a.get("endsAt", "") <= now_iso() for a in alerts) if isinstance(alerts, list) else False


RULES = {"rules": [
    {"name": "entropy_collapse", "metric": "entropy_norm", "scope": "head",
     "condition": {"op": "below", "value": 0.1}, "for": 2, "severity": "critical",
     "annotations": {"summary": "collapse in {run}"}},
]}


def step(seq, s, low):
    vals = [[0.8, 0.8], [0.8, 0.8]]
    if low:
        vals[1][0] = 0.01
    return {"type": "step", "seq": seq, "step": s, "time": 1764500000 + s,
            "scalars": {"loss": 2.0}, "heads": {"entropy_norm": vals}}


class AlertmanagerE2E(unittest.TestCase):
    def test_firing_resent_then_resolved(self):
        am = Receiver(refuse=1, refuse_status=503, refuse_if=resolved)  # 503 to the first resolved POST
        tmp = tempfile.TemporaryDirectory()
        rules = os.path.join(tmp.name, "rules.json")
        with open(rules, "w") as f:
            json.dump(RULES, f)
        d = Daemon(args=["--rules", rules, "--alertmanager", am.url("/"), "--alertmanager-resend-s", "1",
                         "--quiet-alerts"], http=True).start()
        try:
            c = Client(d.sock)
            c.hello("am-run", layers=2, heads=2)
            seq = 0
            for s in range(10):
                seq += 1
                c.send(step(seq, s, low=s >= 5))
                c.recv_until(lambda m: m["type"] == "ack" and m["seq"] >= seq)
            # fires at step 6; wait for the first POST and two re-sends
            deadline = time.time() + 15
            while time.time() < deadline and len(am.delivered()) < 3:
                time.sleep(0.05)
            posts = am.delivered()
            self.assertGreaterEqual(len(posts), 3, "firing alert sent and re-sent: %s" % posts)
            self.assertEqual(metric(d, "entropyd_alertmanager_firing"), 1)
            t0, path, body, ctype = posts[0].time, posts[0].path, posts[0].json(), posts[0].content_type
            self.assertEqual(path, "/api/v2/alerts")
            self.assertEqual(ctype, "application/json")
            self.assertIsInstance(body, list)
            self.assertEqual(len(body), 1)
            a = body[0]
            self.assertEqual(sorted(a), ["annotations", "endsAt", "generatorURL", "labels", "startsAt"])
            self.assertRegex(a["generatorURL"], r"^http://127\.0\.0\.1:%d/\?run=\d+$" % d.http_port)
            self.assertEqual(a["labels"], {"alertname": "entropy_collapse", "run": "am-run",
                                           "severity": "critical", "metric": "entropy_norm"})
            self.assertEqual(a["annotations"], {"summary": "collapse in am-run"})
            self.assertRegex(a["startsAt"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
            self.assertGreater(a["endsAt"], now_iso(), "a firing alert's endsAt lies ahead")
            gaps = [posts[i + 1].time - posts[i].time for i in range(2)]
            self.assertTrue(all(0.7 < g < 3.0 for g in gaps), "re-sent about every second: %s" % gaps)
            self.assertTrue(all(p.json()[0]["labels"] == a["labels"] and p.json()[0]["startsAt"] == a["startsAt"]
                                for p in am.delivered()), "re-sends carry the same alert")
            # recover: resolved once (after a 503 and a retry), then silence
            for s in range(10, 16):
                seq += 1
                c.send(step(seq, s, low=False))
                c.recv_until(lambda m: m["type"] == "ack" and m["seq"] >= seq)
            deadline = time.time() + 15
            done = []
            while time.time() < deadline and not done:
                done = [p for p in am.delivered() if resolved(p.body)]
                time.sleep(0.05)
            self.assertEqual(len(done), 1, "one resolved POST")
            self.assertEqual(am.refuse_left, 0, "the 503 was answered, then retried")
            r = done[0].json()[0]
            self.assertEqual(r["labels"], a["labels"])
            self.assertEqual(r["startsAt"], a["startsAt"])
            n = len(am.delivered())
            # the resolved alert left the firing set: with the set empty the
            # notifier's re-send timer is off, so nothing more is sent
            self.assertEqual(metric(d, "entropyd_alertmanager_firing"), 0, "no re-send after the alert resolved")
            self.assertEqual(len(am.delivered()), n)
        finally:
            d.stop()
            d.cleanup()
            am.close()
            tmp.cleanup()

    def test_hung_webhook_delays_only_itself(self):
        """A webhook that accepts and never answers (each
        note costs it 6 attempts of 5 s) beside a healthy Alertmanager.
        1,600 flapping transitions (8 runs, loss NaN at every other step)
        overflow the webhook's queue; Alertmanager still ends with every
        group's last state, and a new collapse reaches it within 5 s."""
        hung = socket.socket()
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        held = []
        stop = threading.Event()

        def accept_and_hold():  # reads nothing, answers nothing
            hung.settimeout(0.2)
            while not stop.is_set():
                try:
                    held.append(hung.accept()[0])
                except OSError:
                    pass
        th = threading.Thread(target=accept_and_hold, daemon=True)
        th.start()
        am = Receiver()
        d = Daemon(args=["--webhook", "http://127.0.0.1:%d/hook" % hung.getsockname()[1],
                         "--alertmanager", am.url("/"), "--quiet-alerts"], http=True).start()
        try:
            flaps, per_run = 8, 200
            for r in range(flaps):
                c = Client(d.sock)
                c.hello("flap-%d" % r, layers=2, heads=2)
                for s in range(per_run):  # NaN, 2.0, NaN, ...: fires and resolves at every step
                    c.send({"type": "step", "seq": s + 1, "step": s, "time": 1764500000 + s,
                            "scalars": {"loss": None if s % 2 == 0 else 2.0},
                            "heads": {"entropy_norm": [[0.8, 0.8], [0.8, 0.8]]}})
                c.recv_until(lambda m: m["type"] == "ack" and m["seq"] >= per_run)
                c.close()
            wait_for(lambda: metric(d, "entropyd_notifications_queued_total") == flaps * per_run, timeout=30,
                     what="1,600 transitions notified")
            self.assertGreater(metric(d, 'entropyd_notifications_dropped_total{sink="webhook"}'), 0,
                               "the hung webhook's own queue overflowed")

            def last_state(run):
                """(resolved?, startsAt) of run's loss_nonfinite in the last POST that carried it."""
                for p in reversed(am.delivered()):
                    for a in p.json():
                        if a["labels"].get("run") == run and a["labels"]["alertname"] == "loss_nonfinite":
                            return a["endsAt"] <= now_iso(), a["startsAt"]
                return None
            wait_for(lambda: metric(d, 'entropyd_notifications_pending{sink="alertmanager"}') == 0, timeout=10,
                     what="Alertmanager's set delivered")
            for r in range(flaps):
                ep = d.get("/api/runs/by-name/flap-%d" % r)[1]
                eps = d.get("/api/runs/%d/alerts?limit=1" % ep["id"])[1]
                self.assertEqual(eps[0]["state"], "resolved")
                got = last_state("flap-%d" % r)
                self.assertTrue(got and got[0], "flap-%d resolved in Alertmanager: %s" % (r, got))
                self.assertEqual(got[1], eps[0]["alert"]["startsAt"], "the last episode's alert, not an older one")
            # a new collapse, behind a webhook queue still full of hung notes
            c = Client(d.sock)
            w = c.hello("collapse", layers=2, heads=2)
            one_hot = {"entropy_norm": [[0.001, 0.8], [0.8, 0.8]]}
            for s in range(40):
                c.send({"type": "step", "seq": s + 1, "step": s, "time": 1764500000 + s,
                        "scalars": {"loss": 3.0}, "heads": one_hot})
            c.recv_until(lambda m: m["type"] == "ack" and m["seq"] >= 40)
            fired = wait_for(lambda: [e for e in d.get("/api/runs/%d/alerts" % w["run_id"])[1]
                                      if e["rule"] == "entropy_collapse"], what="entropy_collapse fired")
            t_fired = time.time()

            def in_am():
                return [p for p in am.delivered() for a in p.json()
                        if a["labels"].get("run") == "collapse" and a["labels"]["alertname"] == "entropy_collapse"]
            got = wait_for(in_am, timeout=10, what="the collapse in Alertmanager")
            self.assertLess(got[0].time - fired[0]["starts_at"], 5.0, "Alertmanager got it within 5 s of firing")
            self.assertLess(got[0].time - t_fired, 5.0)
            self.assertEqual(metric(d, 'entropyd_notifications_dropped_total{sink="alertmanager"}'), 0)
            self.assertEqual(metric(d, 'entropyd_notifications_failed_total{sink="alertmanager"}'), 0)
            self.assertGreater(metric(d, 'entropyd_notifications_pending{sink="webhook"}'), 0)
            c.close()
            # shutdown is not held by the hung webhook beyond its grace (3 s) and one request
            t0 = time.time()
            self.assertEqual(d.stop(), 0)
            self.assertLess(time.time() - t0, 10)
        finally:
            stop.set()
            th.join()
            for s in held:
                s.close()
            hung.close()
            d.cleanup()
            am.close()

    def test_bad_url_refused(self):
        d = Daemon(args=["--alertmanager", "ftp://x"])
        with self.assertRaises(RuntimeError):
            d.start()
        self.assertIn("--alertmanager wants an http", d.log())
        d.cleanup()

AM = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "distributed")


class RealAlertmanager(unittest.TestCase):
    @unittest.skipUnless(shutil.which("amtool"), "amtool not installed")
    def test_shipped_routing(self):
        def receiver(*labels):
            return subprocess.run(["amtool", "config", "routes", "test", "--config.file",
                                   os.path.join(DOCS, "alertmanager.yml")] + list(labels),
                                  capture_output=True, text=True, check=True).stdout.strip()
        self.assertEqual(receiver("alertname=EntropydDatabaseFailing", "severity=critical"), "infra")
        self.assertEqual(receiver("alertname=entropy_collapse", "severity=critical", "run=r"), "ml-oncall-page")
        self.assertEqual(receiver("alertname=entropy_drop", "severity=warning", "run=r"), "ml-oncall")

    @unittest.skipUnless(AM, "prometheus-alertmanager not installed")
    def test_skewed_clock_taken_and_restart_keeps_start(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        hook = Receiver()
        self.addCleanup(hook.close)
        with open(os.path.join(tmp.name, "am.yml"), "w") as f:
            f.write("route:\n  receiver: r\n  group_wait: 0s\n  group_interval: 1s\n"
                    "receivers:\n  - name: r\n    webhook_configs:\n      - url: %s\n" % hook.url("/am"))
        port = free_port()
        am = subprocess.Popen([AM, "--config.file", os.path.join(tmp.name, "am.yml"), "--storage.path",
                               os.path.join(tmp.name, "am-data"), "--web.listen-address", "127.0.0.1:%d" % port,
                               "--cluster.listen-address=", "--log.level=warn"],
                              stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp.name, "am.log"), "wb"))
        self.addCleanup(am.wait)
        self.addCleanup(am.kill)
        base = "http://127.0.0.1:%d" % port

        def am_alerts():
            try:
                with urllib.request.urlopen(base + "/api/v2/alerts", timeout=5) as r:
                    return json.loads(r.read())
            except OSError:
                return None
        wait_for(lambda: am_alerts() is not None, what="Alertmanager up")
        rules = os.path.join(tmp.name, "rules.json")
        with open(rules, "w") as f:
            json.dump(RULES, f)
        data = os.path.join(tmp.name, "entropyd")
        os.mkdir(data)
        d = Daemon(data=data, args=["--rules", rules, "--alertmanager", base, "--alertmanager-resend-s", "1"],
                   http=True).start()
        try:
            c = Client(d.sock)
            w = c.hello("ahead", layers=2, heads=2)
            seq = 0
            for s in range(6):  # a trainer clock one hour ahead: Alertmanager refused its startsAt
                seq += 1
                m = step(seq, s, low=s >= 2)
                m["time"] = time.time() + 3600
                c.send(m)
                c.recv_until(lambda m: m["type"] == "ack" and m["seq"] >= seq)
            got = wait_for(lambda: [a for a in am_alerts() or [] if a["labels"].get("run") == "ahead"], what="alert in Alertmanager")
            self.assertEqual(got[0]["status"]["state"], "active")
            self.assertEqual(got[0]["generatorURL"], "http://127.0.0.1:%d/?run=%d" % (d.http_port, w["run_id"]))
            starts = got[0]["startsAt"]
            self.assertLess(starts, now_iso())
            # restart during the episode: Alertmanager keeps the first startsAt
            c.close()
            self.assertEqual(d.stop(), 0)
            d.start()
            c = Client(d.sock)
            seq = c.hello("ahead", layers=2, heads=2)["last_seq"]
            for s in range(6, 10):
                seq += 1
                c.send(step(seq, s, low=True))
                c.recv_until(lambda m: m["type"] == "ack" and m["seq"] >= seq)
            wait_for(lambda: "entropyd_alert_resumed_total 1" in d.get("/metrics")[1], what="the episode resumed")
            sent = 'entropyd_notifications_sent_total{sink="alertmanager"}'
            n0 = metric(d, sent)
            wait_for(lambda: metric(d, sent) > n0, what="a re-send has reached Alertmanager")
            got = [a for a in am_alerts() if a["labels"].get("run") == "ahead"]
            self.assertEqual([a["startsAt"] for a in got], [starts])
            st, text = d.get("/metrics")
            self.assertIn('entropyd_notifications_failed_total{sink="alertmanager"} 0', text)
            c.close()
        finally:
            d.cleanup()


if __name__ == "__main__":
    unittest.main()
