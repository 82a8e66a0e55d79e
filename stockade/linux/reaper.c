/* The sandbox's pid 1 once its command has run a while (see reaper.py).
 *
 *     reaper COMMAND_PID LIFELINE_FD STATUS_FD
 *     reaper hold
 *
 * pid 1 (init.py, a Python process) execs this program from a sealed memfd when the command
 * outlives a short grace period, so that an idle sandbox is kept alive by a few hundred KiB
 * instead of a Python interpreter. It does what init.py's _supervise and _drain do: reap
 * every child as it exits (orphans are re-parented to pid 1), exit at once when the owner's
 * lifeline closes (which makes the kernel kill the whole pid namespace), and when the command
 * exits, kill and reap everything else, then write the "run" stage and the "exit" event to
 * the owner's status pipe. `reaper hold` only waits to be killed: it keeps the process slot of
 * pid 1's starter thread, which the exec ends, so the command's process limit stays exact
 * (limits.INIT_THREADS). It is linked statically, so it loads nothing from the sandbox's
 * view of the filesystem. Any failure ends it with status 70: the owner sees the status pipe
 * close without an exit event and reports a typed failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { FAILED = 70 };

static long parse(const char *text, long max) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || end == text || *end || value < 0 || value > max)
        _exit(FAILED);
    return value;
}

/* Reap every child that has exited; 1 once the command is among them. */
static int reap(pid_t command, int *status) {
    int found = 0, any;
    pid_t pid;
    while ((pid = waitpid(-1, &any, WNOHANG)) > 0) {
        if (pid == command) {
            *status = any;
            found = 1;
        }
    }
    if (pid < 0 && errno != ECHILD)
        _exit(FAILED);
    return found;
}

static void write_all(int fd, const char *text, int size) {
    while (size > 0) {
        ssize_t done = write(fd, text, (size_t)size);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            _exit(FAILED);
        text += done;
        size -= (int)done;
    }
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "hold") == 0) {
        prctl(PR_SET_DUMPABLE, 0);
        for (;;)
            pause();
    }
    if (argc != 4)
        return FAILED;
    pid_t command = (pid_t)parse(argv[1], INT_MAX);
    int lifeline = (int)parse(argv[2], INT_MAX), status_fd = (int)parse(argv[3], INT_MAX);
    /* exec made this process dumpable again; nothing in the sandbox may inspect it */
    if (prctl(PR_SET_DUMPABLE, 0) != 0)
        return FAILED;

    sigset_t child_exits;
    sigemptyset(&child_exits);
    sigaddset(&child_exits, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &child_exits, NULL) != 0)
        return FAILED;
    int signals = signalfd(-1, &child_exits, SFD_CLOEXEC);
    if (signals < 0)
        return FAILED;

    int status = 0;
    struct pollfd watched[2] = {{signals, POLLIN, 0}, {lifeline, POLLIN, 0}};
    while (!reap(command, &status)) {  /* (the command may have exited before the exec) */
        if (poll(watched, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return FAILED;
        }
        if (watched[1].revents)
            _exit(1);  /* the owner is gone: pid 1 exiting kills the whole namespace */
        struct signalfd_siginfo info;
        if (watched[0].revents && read(signals, &info, sizeof info) < 0 && errno != EAGAIN)
            return FAILED;
    }

    char line[128];
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int size = snprintf(line, sizeof line, "{\"event\": \"stage\", \"name\": \"run\", "
                        "\"t\": %lld.%09ld}\n", (long long)now.tv_sec, now.tv_nsec);
    write_all(status_fd, line, size);

    kill(-1, SIGKILL);  /* from a pid namespace's init: every other process in it */
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {
    }
    if (WIFSIGNALED(status))
        size = snprintf(line, sizeof line, "{\"event\": \"exit\", \"exit_code\": null, "
                        "\"signal\": %d}\n", WTERMSIG(status));
    else
        size = snprintf(line, sizeof line, "{\"event\": \"exit\", \"exit_code\": %d, "
                        "\"signal\": null}\n", WEXITSTATUS(status));
    write_all(status_fd, line, size);
    _exit(0);
}
