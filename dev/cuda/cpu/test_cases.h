// test_cases.h — the driver the CPU layer's planted-bug tests share
// (test_layer.cu, test_wmma.cu): a table of cases, each a small program run in
// a child process whose exit status and stderr must be what the table says.
//
// Included by: dev/cuda/cpu/test_layer.cu, dev/cuda/cpu/test_wmma.cu (as
// "dev/cuda/cpu/test_cases.h", from the repository root).
// Defines: Case, cases_main(argc, argv, cases, n, on_gpu); and through
// ck.h, CK(call) (each test defines CK_EXIT first: the status its table reads
// as "a call failed").
//
//   PROGRAM          every case, each in a child process; "N passed, N failed" last
//   PROGRAM CASE     one case, in this process (to see its report)
// With on_gpu (an nvcc build on a real GPU), only the cases that must pass
// run, in this process (CUDA, once initialised, does not survive a fork);
// the cases that must give wrong numbers (status 1) run for information.
#pragma once

#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, pipe, dup2
#include <cstdio>      // printf, perror
#include <cstdlib>     // exit, getenv, setenv
#include <cstring>     // strcmp
#include <string>      // a child's stderr

#include "dev/cuda/cpu/ck.h"  // CK(call), exiting with CK_EXIT

struct Case {
    const char* name;
    int (*run)();
    int want_status;        // the child's exit status: 0 pass, 86 the layer's report, others: the case's own verdict
    const char* want_text;  // must appear in its stderr ("" for none)
    const char* what;
    const char* env = nullptr;  // "NAME=value" set in the child before it runs
};

// The case's environment variable, if it has one (before it runs).
static void cases_set_env(const Case& c) {
    if (!c.env) return;
    const std::string kv = c.env;
    const size_t eq = kv.find('=');
    setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
}

// Runs c in a child process; its stderr into *err; returns its exit status (128 + signal when killed).
static int cases_run_child(const Case& c, std::string* err) {
    int pipefd[2];
    if (pipe(pipefd) != 0) { perror("pipe"); exit(1); }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(1); }
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], 2);
        cases_set_env(c);
        int r = c.run();
        fflush(stdout);
        fflush(stderr);
        _exit(r);
    }
    close(pipefd[1]);
    char buf[4096];
    ssize_t k;
    while ((k = read(pipefd[0], buf, sizeof buf)) > 0) err->append(buf, (size_t)k);
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The test program's main: one named case, or all of them. Set TEST_VERBOSE
// to see every child's stderr, not only the failures'.
static int cases_main(int argc, char** argv, const Case* cases, size_t n, bool on_gpu) {
    if (argc == 2) {
        for (size_t i = 0; i < n; i++)
            if (strcmp(argv[1], cases[i].name) == 0) {
                cases_set_env(cases[i]);
                return cases[i].run();
            }
        fprintf(stderr, "no case '%s'\n", argv[1]);
        return 2;
    }
    int passed = 0, failed = 0;
    for (size_t i = 0; i < n; i++) {
        const Case& c = cases[i];
        if (on_gpu && c.want_status == 1) {
            printf("info %s: on this GPU exit %d (0: right numbers; the layer must give wrong ones)\n", c.name, c.run());
            continue;
        }
        if (on_gpu && c.want_status != 0) continue;  // a planted bug: undefined behaviour on a GPU, not a report
        std::string err;
        int status = on_gpu ? c.run() : cases_run_child(c, &err);
        bool ok = status == c.want_status && (c.want_text[0] == 0 || err.find(c.want_text) != std::string::npos);
        printf("%s %s: %s (exit %d)\n", ok ? "ok  " : "FAIL", c.name, c.what, status);
        if (!ok || getenv("TEST_VERBOSE")) {
            printf("     want exit %d%s%s%s; its stderr:\n%s\n", c.want_status, c.want_text[0] ? " and \"" : "",
                   c.want_text, c.want_text[0] ? "\"" : "", err.c_str());
        }
        ok ? passed++ : failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
