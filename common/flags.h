/* flags.h: the command-line flag table both programs (entropyd, sigmatrain)
 * parse with.  A program describes its flags once, as an array of `flag`
 * rows; that one table drives parsing, --help and, in sigmatrain, the
 * --resume check (flags_parse's given array tells which rows the user gave).
 *
 *   static const flag FLAGS[] = {
 *       FLAG_SECTION_ROW("model:"),
 *       FLAG_INT_ROW("--layers", offsetof(options, layers), 1, 256, 0, "N", "blocks (default 4)"),
 *       ...
 *   };
 *   static const flag_table TABLE = {"sigmatrain", FLAGS, FLAG_COUNT(FLAGS)};
 *   char given[FLAG_COUNT(FLAGS)];
 *   switch (flags_parse(&TABLE, argc, argv, &opts, given)) ...
 *
 * Accepted forms: --name VALUE, --name=VALUE, and -h for --help.  Flags are
 * never abbreviated, and a word that is not a flag is an error (neither
 * program takes positional arguments).  Messages go to stderr, prefixed by
 * the program's name.  The table and the strings it points to belong to the
 * caller; values of string flags point into argv. */
#ifndef FLAGS_H
#define FLAGS_H

#include <stddef.h>
#include <stdio.h>

typedef enum {
    FLAG_SECTION,  /* a heading in --help; name is its title */
    FLAG_INT,      /* int in [lo, hi] */
    FLAG_LONG,     /* long in [lo, hi] */
    FLAG_U64,      /* uint64_t in [lo, hi] */
    FLAG_FLOAT,    /* finite float >= lo */
    FLAG_DURATION, /* "90", "90s", "30m", "1h", "2d" -> double seconds in [0, hi] */
    FLAG_ENUM,     /* int: the index of the value in names */
    FLAG_STR,      /* const char *, pointing into argv */
    FLAG_LIST,     /* flag_list: a repeatable string flag */
    FLAG_BOOL,     /* int set to 1; takes no value */
    FLAG_HELP,     /* -h, --help: flags_parse returns FLAGS_HELP */
    FLAG_VERSION,  /* --version: flags_parse returns FLAGS_VERSION */
} flag_kind;

enum { FLAG_LIST_MAX = 64 };

/* The values of a repeatable flag, in the order given. */
typedef struct {
    const char *v[FLAG_LIST_MAX];
    int n;
} flag_list;

typedef struct {
    const char *name; /* "--layers"; FLAG_SECTION: the section's title */
    flag_kind kind;
    size_t off;               /* offsetof(the options struct, field) */
    long lo, hi;              /* bounds (see flag_kind) */
    const char *const *names; /* FLAG_ENUM: the values' names, indexed by value */
    int nnames;
    int marks;              /* the program's own bits (sigmatrain: DEFINES) */
    const char *arg, *help; /* for --help: "N", and the text ("\n" continues it) */
} flag;

typedef struct {
    const char *prog; /* "entropyd": the prefix of every message */
    const flag *flags;
    int n;
} flag_table;

#define FLAG_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Rows, so a table reads one flag a line. */
#define FLAG_SECTION_ROW(title) \
    { title, FLAG_SECTION, 0, 0, 0, NULL, 0, 0, NULL, NULL }
#define FLAG_INT_ROW(n, off, lo, hi, marks, arg, help) \
    { n, FLAG_INT, off, lo, hi, NULL, 0, marks, arg, help }
#define FLAG_LONG_ROW(n, off, lo, hi, arg, help) \
    { n, FLAG_LONG, off, lo, hi, NULL, 0, 0, arg, help }
#define FLAG_FLOAT_ROW(n, off, marks, help) \
    { n, FLAG_FLOAT, off, 0, 0, NULL, 0, marks, "X", help }
#define FLAG_DURATION_ROW(n, off, arg, help) \
    { n, FLAG_DURATION, off, 0, 320000000L, NULL, 0, 0, arg, help }
#define FLAG_ENUM_ROW(n, off, names, marks, arg, help) \
    { n, FLAG_ENUM, off, 0, 0, names, (int)(sizeof names / sizeof names[0]), marks, arg, help }
#define FLAG_STR_ROW(n, off, arg, help) \
    { n, FLAG_STR, off, 0, 0, NULL, 0, 0, arg, help }
#define FLAG_LIST_ROW(n, off, arg, help) \
    { n, FLAG_LIST, off, 0, 0, NULL, 0, 0, arg, help }
#define FLAG_BOOL_ROW(n, off, help) \
    { n, FLAG_BOOL, off, 0, 0, NULL, 0, 0, NULL, help }
#define FLAG_HELP_ROW(help) \
    { "--help", FLAG_HELP, 0, 0, 0, NULL, 0, 0, NULL, help }
#define FLAG_VERSION_ROW(help) \
    { "--version", FLAG_VERSION, 0, 0, 0, NULL, 0, 0, NULL, help }

/* What flags_parse found. */
enum { FLAGS_BAD = -1, FLAGS_RUN = 0, FLAGS_HELP = 1, FLAGS_VERSION = 2 };

/* Fills the options struct at o from argv[1..argc-1] through the table.
 * Fields of flags not given keep what o held (set the defaults first).
 * given, when not NULL, has t->n bytes: given[i] becomes 1 when row i was
 * given.  Returns FLAGS_RUN, FLAGS_HELP or FLAGS_VERSION (at the first
 * --help or --version: the caller prints), or FLAGS_BAD after printing
 * what was wrong. */
int flags_parse(const flag_table *t, int argc, char **argv, void *o, char *given);

/* Writes one line a flag (sections as headings, continuation lines of a
 * help text indented under it) to f. */
void flags_usage(const flag_table *t, FILE *f);

/* The row named name ("--steps"), or NULL. */
const flag *flags_find(const flag_table *t, const char *name);

#endif
