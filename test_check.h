/*
 * test_check.h — the one check of the C tests: a counter and one line per
 * check, "ok   WHAT  DETAIL" or "FAIL WHAT  DETAIL" (scripts/tests/check.sh prints
 * the same lines for the shell tests). Each test ends with the line
 * "N passed, N failed" and exits non-zero on a failure. Included by
 * test_common.h (test_gpt.c, test_gpt.cu) and dev/tokenizer/test_tokenizer.c;
 * needs only <stdio.h>.
 */
#ifndef TEST_CHECK_H
#define TEST_CHECK_H
#include <stdarg.h>
#include <stdio.h>

static int tests_passed = 0, tests_failed = 0;

static void check(int ok, const char* what, const char* detail) {
    if (ok) tests_passed++;
    else tests_failed++;
    printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, detail[0] ? "  " : "", detail);
}

/* check() with a printf-formatted detail */
static void checkf(int ok, const char* what, const char* fmt, ...) __attribute__((format(printf, 3, 4), unused));
static void checkf(int ok, const char* what, const char* fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    check(ok, what, detail);
}
#endif
