"""The data directory belongs to one daemon and to its owner:
- a second entropyd on the same database refuses to start, naming the first
  one's pid, and changes nothing: the first one's live run stays live and
  keeps streaming;
- the database, its -wal and -shm are 0600 whatever the umask, also when
  they already existed with wider modes or the directory was made by hand;
- an HTTP address that is taken is an error (exit 1), not a daemon that
  runs on without HTTP; port 0 still picks any free port.
python3 stdlib only."""
import os
import socket
import stat
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import ENTROPYD, Client, Daemon, step_msg  # noqa: E402


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


class DataDir(unittest.TestCase):
    def test_second_daemon_on_the_same_data_refuses_and_changes_nothing(self):
        d = Daemon(http=True).start()
        try:
            c = Client(d.sock)
            c.hello("owner-run")
            c.send(step_msg(1, 1))
            c.wait_ack(1)
            r = subprocess.run([ENTROPYD, "--data", d.data, "--http", "127.0.0.1:0"],
                               capture_output=True, text=True, timeout=20)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("in use by another entropyd (pid %d)" % d.proc.pid, r.stderr)
            # the first daemon's run was not marked stale, and it still ingests
            self.assertEqual(d.get("/api/runs")[1][0]["status"], "live")
            c.send(step_msg(2, 2))
            c.wait_ack(2)
            self.assertEqual(d.get("/api/runs")[1][0]["last_step"], 2)
            c.close()
            d.stop()
            # once the first one is gone the lock is free again
            d2 = Daemon(data=d.data).start()
            self.assertTrue(d2.alive())
            d2.stop()
        finally:
            d.stop()
            d.cleanup()

    def test_database_files_are_private_whatever_the_umask(self):
        tmp = tempfile.TemporaryDirectory()
        os.chmod(tmp.name, 0o755)                       # made by hand, not by the daemon
        old = os.umask(0)
        try:
            d = Daemon(data=tmp.name).start()
            c = Client(d.sock)
            c.hello("private")
            c.send(step_msg(1, 1))
            c.wait_ack(1)
            for suffix in ("", "-wal", "-shm"):
                self.assertEqual(mode(d.db + suffix), 0o600, d.db + suffix)
            c.close()
            d.stop()
            os.chmod(d.db, 0o644)                       # as sqlite3 by hand under umask 022 leaves it
            d = Daemon(data=tmp.name).start()
            self.assertEqual(mode(d.db), 0o600)
            d.stop()
        finally:
            os.umask(old)
            tmp.cleanup()

    def test_a_taken_http_port_is_an_error(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        tmp = tempfile.TemporaryDirectory()
        try:
            r = subprocess.run([ENTROPYD, "--data", tmp.name, "--http", "127.0.0.1:%d" % port],
                               capture_output=True, text=True, timeout=20)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn(str(port), r.stderr)
            self.assertNotIn("http port", r.stdout)
        finally:
            s.close()
            tmp.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
