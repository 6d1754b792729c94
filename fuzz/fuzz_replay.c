/* fuzz/fuzz_replay.c - runs a libFuzzer target's LLVMFuzzerTestOneInput over files,
   without libFuzzer: any compiler (gcc, tcc, a cross compiler), any sanitizer.

   Usage: fuzz_NAME [--name NAME] PATH...
   Each PATH is an input file or a directory whose regular files are all inputs. Inputs
   run in sorted order, so a replay is deterministic. The last line is
       RESULT fuzz-NAME <inputs run> 0
   (tests/run.sh sums it). A target reports a wrong result by aborting; this driver then
   prints the input that did it and the command that replays it alone, and the process
   dies with that signal (so the step fails). Link it with one fuzz/fuzz_*.c, or with a
   file that includes several of them, each LLVMFuzzerTestOneInput renamed, and defines an
   LLVMFuzzerTestOneInput that runs the target named kvc_fuzz_replay_name (the --name):
   tests/run.sh generates one, so that a configuration compiles kvcache.h once for every
   target instead of once per target. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
/* 32-bit hosts: without it stat and readdir fail (EOVERFLOW) on 64-bit inode numbers */
#ifndef _FILE_OFFSET_BITS
#define _FILE_OFFSET_BITS 64
#endif
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *g_argv0;
static char g_current[4096]; /* the input running now, for the crash message */
/* the --name: a program with several targets runs the one of that name */
extern const char *kvc_fuzz_replay_name;
const char *kvc_fuzz_replay_name = "replay";

static void on_crash(int sig) {
    /* only a message and the default action: the process is going down anyway */
    fprintf(stderr, "\nfuzz_replay: signal %d while running input %s\nreplay: %s --name %s %s\n", sig, g_current,
            g_argv0, kvc_fuzz_replay_name, g_current);
    fflush(stderr);
    signal(sig, SIG_DFL);
    raise(sig);
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    long n;
    if (f == NULL) { fprintf(stderr, "fuzz_replay: cannot open %s\n", path); return -1; }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        fprintf(stderr, "fuzz_replay: cannot size %s\n", path);
        return -1;
    }
    buf = (unsigned char *)malloc((size_t)n + 1); /* +1: a malloc(0) may be NULL */
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        fprintf(stderr, "fuzz_replay: cannot read %s\n", path);
        return -1;
    }
    fclose(f);
    snprintf(g_current, sizeof(g_current), "%s", path);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

/* every regular file of a directory, in name order; returns inputs run or -1 */
static long run_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL;
    size_t n = 0, cap = 0, i;
    long ran = 0;
    if (d == NULL) { fprintf(stderr, "fuzz_replay: cannot open directory %s\n", dir); return -1; }
    while ((e = readdir(d)) != NULL) {
        char path[4096];
        struct stat st;
        if (e->d_name[0] == '.') continue; /* ., .., hidden files */
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (n == cap) {
            char **grown = (char **)realloc(names, sizeof(char *) * (cap = cap ? 2 * cap : 64));
            if (grown == NULL) { closedir(d); return -1; }
            names = grown;
        }
        names[n] = (char *)malloc(strlen(path) + 1);
        if (names[n] == NULL) { closedir(d); return -1; }
        strcpy(names[n++], path);
    }
    closedir(d);
    if (n > 0) qsort(names, n, sizeof(char *), cmp_names);
    for (i = 0; i < n; ++i) {
        if (ran >= 0 && run_file(names[i]) == 0) ran++;
        else ran = -1;
        free(names[i]);
    }
    free(names);
    return ran;
}

int main(int argc, char **argv) {
    long total = 0;
    int i, bad = 0;
    struct stat st;
    g_argv0 = argv[0];
    signal(SIGABRT, on_crash);
    signal(SIGSEGV, on_crash);
    signal(SIGFPE, on_crash);
    signal(SIGILL, on_crash);
#ifdef SIGBUS
    signal(SIGBUS, on_crash);
#endif
    for (i = 1; i < argc; ++i) {
        long ran;
        if (strcmp(argv[i], "--name") == 0 && i + 1 < argc) { kvc_fuzz_replay_name = argv[++i]; continue; }
        if (stat(argv[i], &st) != 0) { fprintf(stderr, "fuzz_replay: no such input %s\n", argv[i]); bad = 1; continue; }
        ran = S_ISDIR(st.st_mode) ? run_dir(argv[i]) : (run_file(argv[i]) == 0 ? 1 : -1);
        if (ran < 0) bad = 1;
        else total += ran;
    }
    if (total == 0 && !bad) { fprintf(stderr, "fuzz_replay: no inputs\n"); bad = 1; }
    printf("RESULT fuzz-%s %ld %d\n", kvc_fuzz_replay_name, total, bad);
    return bad;
}
