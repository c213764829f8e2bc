/* test_flags.c: unit tests of common/flags.c, the flag table both programs
 * parse with: every kind's value read and bounded, the two value forms,
 * the rows given, --help/--version, and every malformed command line
 * refused (with stderr, not an exit). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"

typedef struct {
    int layers, verbose, mode;
    long conns;
    uint64_t seed;
    float lr;
    double keep_s;
    const char *name;
    flag_list hosts;
} opts;

static const char *const MODES[] = {"pre", "post", "none"};
static const flag FLAGS[] = {
    FLAG_SECTION_ROW("test:"),
    FLAG_INT_ROW("--layers", offsetof(opts, layers), 1, 256, 1, "N", "blocks"),
    FLAG_LONG_ROW("--conns", offsetof(opts, conns), 0, 3000000000L, "N", "connections\nsecond line"),
    {"--seed", FLAG_U64, offsetof(opts, seed), 0, 2147483647, NULL, 0, 0, "N", "seed"},
    FLAG_FLOAT_ROW("--lr", offsetof(opts, lr), 0, "learning rate"),
    FLAG_DURATION_ROW("--keep", offsetof(opts, keep_s), "D", "how long"),
    FLAG_ENUM_ROW("--norm", offsetof(opts, mode), MODES, 0, "MODE", "placement"),
    FLAG_STR_ROW("--name", offsetof(opts, name), "NAME", "a name"),
    FLAG_LIST_ROW("--host", offsetof(opts, hosts), "H", "repeatable"),
    FLAG_BOOL_ROW("--verbose", offsetof(opts, verbose), "say more"),
    FLAG_VERSION_ROW("version"),
    FLAG_HELP_ROW("help"),
};
static const flag_table TABLE = {"test", FLAGS, FLAG_COUNT(FLAGS)};

/* Parses the words (argv[0] added) into o; returns flags_parse's answer. */
static int parse(opts *o, char *given, ...) {
    char *argv[32] = {"prog"};
    int argc = 1;
    va_list ap;
    va_start(ap, given);
    for (char *w; (w = va_arg(ap, char *)) != NULL;) argv[argc++] = w;
    va_end(ap);
    memset(o, 0, sizeof *o);
    o->layers = 4;
    return flags_parse(&TABLE, argc, argv, o, given);
}

static void test_values(void **state) {
    (void)state;
    opts o;
    char given[FLAG_COUNT(FLAGS)];
    assert_int_equal(parse(&o, given, "--layers", "12", "--conns=2500000000", "--seed", "7", "--lr", "3e-4", "--keep",
                           "2h", "--norm", "post", "--name=a=b", "--host", "x", "--host", "y", "--verbose", NULL),
                     FLAGS_RUN);
    assert_int_equal(o.layers, 12);
    assert_true(o.conns == 2500000000L);
    assert_true(o.seed == 7);
    assert_float_equal(o.lr, 3e-4f, 1e-9);
    assert_float_equal(o.keep_s, 7200, 0);
    assert_int_equal(o.mode, 1);
    assert_string_equal(o.name, "a=b");
    assert_int_equal(o.hosts.n, 2);
    assert_string_equal(o.hosts.v[1], "y");
    assert_int_equal(o.verbose, 1);
    for (int i = 0; i < TABLE.n; i++)
        assert_int_equal(given[i],
                         FLAGS[i].kind != FLAG_SECTION && FLAGS[i].kind != FLAG_HELP && FLAGS[i].kind != FLAG_VERSION);
    /* defaults stay when not given */
    assert_int_equal(parse(&o, given, NULL), FLAGS_RUN);
    assert_int_equal(o.layers, 4);
    assert_int_equal(given[flags_find(&TABLE, "--layers") - FLAGS], 0);
    const char *units[][2] = {{"90", "90"}, {"90s", "90"}, {"1.5m", "90"}, {"1d", "86400"}, {"0", "0"}};
    for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
        assert_int_equal(parse(&o, NULL, "--keep", units[i][0], NULL), FLAGS_RUN);
        assert_float_equal(o.keep_s, atof(units[i][1]), 1e-9);
    }
}

static void test_help_version(void **state) {
    (void)state;
    opts o;
    assert_int_equal(parse(&o, NULL, "-h", NULL), FLAGS_HELP);
    assert_int_equal(parse(&o, NULL, "--layers", "2", "--help", "--bogus", NULL), FLAGS_HELP);
    assert_int_equal(parse(&o, NULL, "--version", NULL), FLAGS_VERSION);
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    assert_non_null(f);
    flags_usage(&TABLE, f);
    fclose(f);
    assert_non_null(strstr(buf, "test:\n"));
    assert_non_null(strstr(buf, "  --layers N            blocks\n"));
    assert_non_null(strstr(buf, "connections\n                        second line\n"));
    assert_non_null(strstr(buf, "  --verbose             say more\n"));
}

static void test_refused(void **state) {
    (void)state;
    const char *bad[][3] = {
        {"--layers", "0", NULL},   {"--layers", "257", NULL},    {"--layers", "4x", NULL},
        {"--layers", "", NULL},    {"--layers", NULL, NULL},     {"--seed", "-1", NULL},
        {"--lr", "nan", NULL},     {"--lr", "-1", NULL},         {"--lr", "1e39", NULL},
        {"--keep", "5x", NULL},    {"--keep", "1hh", NULL},      {"--keep", "-1", NULL},
        {"--keep", "1e10d", NULL}, {"--norm", "sideways", NULL}, {"--verbose=1", NULL, NULL},
        {"--bogus", NULL, NULL},   {"--lay", "4", NULL},         {"layers", NULL, NULL},
        {"-x", NULL, NULL},        {"--host", "", NULL},         {"--conns", "99999999999999999999", NULL},
    };
    opts o;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (parse(&o, NULL, bad[i][0], bad[i][1], NULL) != FLAGS_BAD)
            fail_msg("accepted %s %s", bad[i][0], bad[i][1] ? bad[i][1] : "");
    }
    /* a repeatable flag's bound */
    char *argv[2 * FLAG_LIST_MAX + 4] = {"prog"};
    int argc = 1;
    for (int i = 0; i <= FLAG_LIST_MAX; i++) {
        argv[argc++] = "--host";
        argv[argc++] = "h";
    }
    memset(&o, 0, sizeof o);
    assert_int_equal(flags_parse(&TABLE, argc, argv, &o, NULL), FLAGS_BAD);
    assert_int_equal(o.hosts.n, FLAG_LIST_MAX);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_help_version),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
