/* test_net.c: unit tests of common/net.c: HOST:PORT parsing (IPv4, names,
 * bracketed IPv6, every malformed form refused), resolving (numeric
 * addresses of both families, the port kept, a bad spec refused with its
 * message), loopback hosts, and the constant-time comparison's answers. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

#include "net.h"

static void test_split_good(void **state) {
    (void)state;
    char host[64];
    int port = -1;
    assert_int_equal(net_split_hostport("127.0.0.1:8080", host, sizeof host, &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 8080);
    assert_int_equal(net_split_hostport("[::1]:0", host, sizeof host, &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 0);
    assert_int_equal(net_split_hostport("example.org:65535", host, sizeof host, &port), 0);
    assert_string_equal(host, "example.org");
    assert_int_equal(port, 65535);
}

static void test_split_bad(void **state) {
    (void)state;
    const char *bad[] = {"",         "8080",         ":8080", "host:",   "host:65536", "host:-1",
                         "host:80x", "host:0800000", "[]:80", "[::1:80", "::1]:80",    "host: 80"};
    char host[64];
    int port;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (net_split_hostport(bad[i], host, sizeof host, &port) == 0) fail_msg("accepted \"%s\"", bad[i]);
    }
    char small[4];
    assert_int_equal(net_split_hostport("abcd:80", small, sizeof small, &port), -1);
    assert_int_equal(net_split_hostport("abc:80", small, sizeof small, &port), 0);
}

static void test_resolve(void **state) {
    (void)state;
    struct net_addr a;
    char err[200] = "";
    assert_int_equal(net_resolve("127.0.0.1:8080", "--http", &a, err, sizeof err), 0);
    assert_int_equal(a.ss.ss_family, AF_INET);
    assert_int_equal(a.len, sizeof(struct sockaddr_in));
    const struct sockaddr_in *in = (const struct sockaddr_in *)&a.ss;
    assert_int_equal(ntohs(in->sin_port), 8080);
    assert_int_equal(ntohl(in->sin_addr.s_addr), 0x7f000001);
    assert_int_equal(net_resolve("[::1]:0", "--http", &a, err, sizeof err), 0);
    assert_int_equal(a.ss.ss_family, AF_INET6);
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a.ss;
    assert_int_equal(ntohs(in6->sin6_port), 0);
    assert_memory_equal(&in6->sin6_addr, &in6addr_loopback, sizeof in6addr_loopback);
    assert_int_equal(net_resolve("0.0.0.0:65535", "--listen-tcp", &a, err, sizeof err), 0);
    assert_int_equal(ntohs(((const struct sockaddr_in *)&a.ss)->sin_port), 65535);
    assert_int_equal(net_resolve("127.0.0.1", "--listen-tcp", &a, err, sizeof err), -1);
    assert_string_equal(err, "--listen-tcp wants HOST:PORT (port 0..65535), got \"127.0.0.1\"");
}

static void test_loopback(void **state) {
    (void)state;
    assert_true(net_host_is_loopback("localhost"));
    assert_true(net_host_is_loopback("::1"));
    assert_true(net_host_is_loopback("127.0.0.2"));
    assert_false(net_host_is_loopback("0.0.0.0"));
    assert_false(net_host_is_loopback("10.0.0.1"));
}

static void test_equal_ct(void **state) {
    (void)state;
    assert_true(net_equal_ct("secret", "secret"));
    assert_true(net_equal_ct("", ""));
    assert_false(net_equal_ct("secret", "secreT"));
    assert_false(net_equal_ct("secret", "secre"));
    assert_false(net_equal_ct("secre", "secret"));
    assert_false(net_equal_ct("", "x"));
    assert_false(net_equal_ct("x", ""));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_good), cmocka_unit_test(test_split_bad), cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_loopback),   cmocka_unit_test(test_equal_ct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
