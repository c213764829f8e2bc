"""e2e_http_static: the dashboard's files over real HTTP:
strong ETags, 304 on If-None-Match, the build-time gzip sent only when
Accept-Encoding takes it (and equal, unzipped, to the plain file), Vary and
Cache-Control, and the first screen's files' total transfer."""
import gzip
import http.client
import sys

from daemon_harness import Daemon

FIRST_SCREEN = ["/", "/app.js", "/api.js", "/util.js", "/live.js", "/runs.js", "/style.css",
                "/vendor/uplot/uPlot.min.css", "/vendor/uplot/uPlot.iife.min.js", "/verdict.js", "/charts.js",
                "/heatmap.js", "/run.js", "/compare.js"]
failed = 0


def check(cond, what):
    global failed
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failed += 1


def get(port, path, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path, headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


def main():
    d = Daemon(http=True)
    d.start()
    try:
        port = d.http_port
        plain_total = gz_total = 0
        for path in FIRST_SCREEN:
            st, h, body = get(port, path)
            st2, h2, zbody = get(port, path, {"Accept-Encoding": "gzip, deflate, br"})
            etag, zetag = h.get("etag", ""), h2.get("etag", "")
            ok = st == 200 and st2 == 200 and etag.startswith('"') and etag.endswith('"') and not etag.startswith("W/")
            if h2.get("content-encoding") == "gzip":
                ok = ok and gzip.decompress(zbody) == body and zetag != etag and "accept-encoding" in h2.get("vary", "").lower()
            ok = ok and "content-encoding" not in h and h.get("cache-control") == "no-cache"
            check(ok, "%s: 200, strong ETag %s, gzip %s (%d -> %d bytes)" % (path, etag, h2.get("content-encoding") == "gzip",
                                                                          len(body), len(zbody)))
            plain_total += len(body)
            gz_total += len(zbody)
            # revalidation: the same tag gives 304 and no body; another gives 200
            st3, h3, b3 = get(port, path, {"Accept-Encoding": "gzip", "If-None-Match": zetag})
            st4, _, _ = get(port, path, {"Accept-Encoding": "gzip", "If-None-Match": '"0000000000000000"'})
            check(st3 == 304 and b3 == b"" and h3.get("etag") == zetag and st4 == 200,
                  "%s: If-None-Match with its tag: 304 (empty), another tag: 200" % path)
        st, h, _ = get(port, "/app.js", {"Accept-Encoding": "gzip;q=0"})
        check(st == 200 and "content-encoding" not in h, "gzip;q=0 gets the plain file")
        st, h, _ = get(port, "/app.js", {"If-None-Match": 'W/"x", ' + get(port, "/app.js")[1]["etag"]})
        check(st == 304, "a tag inside a list of tags: 304")
        print("first screen's static files: %d bytes plain, %d bytes gzipped" % (plain_total, gz_total))
        check(gz_total < 250 * 1024, "the first screen's files transfer under 250 KB gzipped (%d bytes)" % gz_total)
    finally:
        d.stop()
        d.cleanup()
    print("e2e_http_static: %s" % ("FAILED" if failed else "passed"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
