/* The sandbox's pid 1 from the moment its command starts (see supervisor.py).
 *
 *     supervisor PLAN LISTENER HANDOFF
 *     supervisor PLAN LISTENER - STDIN STDOUT STDERR REQUEST STATUS CONTROL
 *     supervisor template SPEC PLAN HANDOFF HOST_PROC
 *
 * In the first two forms pid 1 was a Python process (init.py) that built its view, confined
 * itself (Landlock, capabilities, seccomp) and execed this static program from a sealed
 * memfd. The first form is a spare made ahead of its launch: it waits on the zygote's HANDOFF
 * socket for the launch's six descriptors and reads the launch (argv, environment, working
 * directory, umask) from the request pipe, after checking that the launch is for the view it
 * was made for. The second form has them already, and PLAN holds the launch too. PLAN is a
 * memfd (supervisor.plan). The third form is a view template (template.c), whose spares make
 * and confine themselves in C and then go on here as the first form does.
 *
 * It passes the proxy's LISTENER (-1: none) to the owner over CONTROL, forks the command
 * (session, default signals, stdio, directory, umask, rlimits, a Landlock domain of its own
 * inside pid 1's, and under a memory limit the filter that shows pid 1 its address-space
 * requests, memwatch.c; the rest of its confinement it inherits),
 * then answers those requests, reaps every child as it exits (orphans come to pid 1: as zombies they would count
 * against the process limit), exits at once when the owner's lifeline (REQUEST) closes, which
 * makes the kernel kill the whole pid namespace, and when the command exits, kills and reaps
 * the rest and writes the exit event. Its events are JSON lines on STATUS. Exit status: 70 a
 * setup failure, 71 a command that could not start; the owner reports either as typed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "supervisor.h"

enum { LAUNCH_FDS = 6, DIGEST = 32 };
/* plan flags; UNBOUND and KEEP_FDS only for tests that weaken those layers */
enum { PLAN_RLIMITS = 1, PLAN_WATCH_MEMORY = 2, PLAN_UNBOUND = 4, PLAN_KEEP_FDS = 8,
       PLAN_WATCH_EXEC = 16, PLAN_SEAL_MEMFD = 32, PLAN_WATCH_NAMES = 64,
       PLAN_PROC_UNGUARDED = 128 };
static const uint32_t MAX_PART = 256u << 20;  /* bytes: far above any launch the owner makes */

static int status_fd = -1;

/* ---- writing events ---- */

static void write_all(int fd, const char *text, size_t size) {
    while (size > 0) {
        ssize_t done = write(fd, text, size);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            _exit(SETUP_FAILED);
        text += done;
        size -= (size_t)done;
    }
}

void put(struct text *t, const char *bytes, size_t size) {
    if (t->size + size + 1 > t->room) {
        t->room = (t->size + size + 1) * 2;
        t->data = realloc(t->data, t->room);
        if (!t->data)
            _exit(SETUP_FAILED);
    }
    memcpy(t->data + t->size, bytes, size);
    t->size += size;
    t->data[t->size] = 0;
}

static void puts_(struct text *t, const char *s) { put(t, s, strlen(s)); }

/* Length of the valid UTF-8 sequence at `s` (0 if there is none): JSON text must be UTF-8. */
static size_t utf8_length(const unsigned char *s, size_t left) {
    size_t n = s[0] < 0xC2 ? 0 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : s[0] < 0xF5 ? 4 : 0;
    if (n == 0 || n > left)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    if ((n == 3 && s[0] == 0xE0 && s[1] < 0xA0) || (n == 3 && s[0] == 0xED && s[1] >= 0xA0)
        || (n == 4 && s[0] == 0xF0 && s[1] < 0x90) || (n == 4 && s[0] == 0xF4 && s[1] >= 0x90))
        return 0;
    return n;
}

/* A JSON string of `s`; a byte that is not UTF-8 becomes U+DC80..U+DCFF, as Python's
 * surrogateescape decodes it, so the owner reads back the very bytes of a path or argv[0]. */
void put_string(struct text *t, const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    char escape[8];
    put(t, "\"", 1);
    for (size_t i = 0, left = strlen(s); i < left;) {
        size_t n;
        if (u[i] == '"' || u[i] == '\\') {
            escape[0] = '\\', escape[1] = (char)u[i];
            put(t, escape, 2), i++;
        } else if (u[i] < 0x20 || u[i] == 0x7F) {
            put(t, escape, (size_t)snprintf(escape, sizeof escape, "\\u%04x", u[i])), i++;
        } else if (u[i] < 0x80) {
            put(t, s + i, 1), i++;
        } else if ((n = utf8_length(u + i, left - i))) {
            put(t, s + i, n), i += n;
        } else {
            put(t, escape, (size_t)snprintf(escape, sizeof escape, "\\udc%02x", u[i])), i++;
        }
    }
    put(t, "\"", 1);
}

void emit_event(struct text *event) {
    put(event, "\n", 1);
    write_all(status_fd, event->data, event->size);
    free(event->data);
}

/* One line of at most PIPE_BUF bytes, which a pipe takes whole or not at all, written only if
 * the pipe has room for it now: while the command runs, pid 1 never waits for its owner to
 * read (it would answer no call and watch no lifeline meanwhile). 0 if written, -1 if not. */
static int write_unwaiting(const char *line, size_t size) {
    int flags = fcntl(status_fd, F_GETFL);
    if (size > PIPE_BUF || flags < 0 || fcntl(status_fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return -1;
    ssize_t done;
    while ((done = write(status_fd, line, size)) < 0 && errno == EINTR) {
    }
    int error = errno;
    fcntl(status_fd, F_SETFL, flags);
    if (done < 0 && error != EAGAIN)
        _exit(SETUP_FAILED);  /* (the owner is gone, as write_all) */
    return done == (ssize_t)size ? 0 : -1;
}

int emit_event_unwaiting(struct text *event) {
    put(event, "\n", 1);
    int written = write_unwaiting(event->data, event->size);
    free(event->data);
    return written;
}

unsigned budget_next(struct budget *b) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (b->used == 0 || now.tv_sec - b->since >= EVENT_WINDOW)
        b->since = now.tv_sec, b->used = 0;
    unsigned before = b->used;
    if (b->used <= EVENTS_RECORDED)
        b->used++;
    return before;
}

/* (Lost, not waited for, were the pipe full: a stage is timing, and "run" comes while the
 * command's tree may still run.) */
static void stage(const char *name) {
    char line[128];
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int size = snprintf(line, sizeof line, "{\"event\": \"stage\", \"name\": \"%s\", "
                        "\"t\": %lld.%09ld}\n", name, (long long)now.tv_sec, now.tv_nsec);
    write_unwaiting(line, (size_t)size);
}

/* Report a failure as init.py's _fail does, and exit. `subject` (or NULL) prefixes the
 * message: the command a start failure is about. */
static void fail(int start, const char *code, const char *subject, const char *message,
                 const char *where) {
    struct text event = {0};
    puts_(&event, start ? "{\"event\": \"error\", \"kind\": \"start\", \"code\": "
                        : "{\"event\": \"error\", \"kind\": \"setup\", \"code\": ");
    put_string(&event, code);
    puts_(&event, ", \"message\": ");
    struct text full = {0};
    if (subject) {
        puts_(&full, subject);
        puts_(&full, ": ");
    }
    puts_(&full, message);
    put_string(&event, full.data);
    puts_(&event, ", \"stage\": ");
    put_string(&event, where);
    puts_(&event, "}");
    emit_event(&event);
    _exit(start ? START_FAILED : SETUP_FAILED);
}

/* ---- reading the plan and the launch ---- */

struct launch {
    unsigned char digest[DIGEST];
    mode_t umask;
    char *cwd, **argv, **env;
};

/* digest[32], umask, argc, envc (u32 each), then cwd, argv and env as NUL-ended strings. */
static int parse_launch(const char *data, size_t size, struct launch *out) {
    struct reader r = {data, data + size};
    int bad = take(&r, out->digest, DIGEST);
    out->umask = (mode_t)(u32(&r, &bad) & 0777);
    uint32_t argc = u32(&r, &bad), envc = u32(&r, &bad);
    if (bad || argc == 0 || argc > MAX_PART / 2 || envc > MAX_PART / 2)
        return -1;
    char **strings = calloc((size_t)argc + envc + 3, sizeof *strings);
    if (!strings)
        return -1;
    size_t count = 0, wanted = 1 + (size_t)argc + envc;
    for (const char *s = r.at; s < r.end && count < wanted; count++) {
        const char *nul = memchr(s, 0, (size_t)(r.end - s));
        if (!nul)
            return -1;
        strings[count + (count > argc ? 1 : 0)] = (char *)s;  /* a NULL after argv */
        s = nul + 1;
        if (count + 1 == wanted && s != r.end)
            return -1;
    }
    if (count != wanted)
        return -1;
    out->cwd = strings[0];
    out->argv = strings + 1;
    out->env = strings + argc + 2;
    return 0;
}

static int read_exactly(int fd, char *into, size_t size) {
    while (size > 0) {
        ssize_t got = read(fd, into, size);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        into += got;
        size -= (size_t)got;
    }
    return 0;
}

/* The launch part of the owner's frame (frame.py): a header of four lengths, the request,
 * the seccomp program and the weakenings (used by a pid 1 that builds its view at launch, not
 * by a spare, which was made for them), then the launch. */
static char *read_launch(int fd, size_t *size) {
    uint32_t lengths[4];
    if (read_exactly(fd, (char *)lengths, sizeof lengths) != 0)
        return NULL;
    uint64_t skip = (uint64_t)lengths[0] + lengths[1] + lengths[2];
    if (skip > 3ull * MAX_PART || lengths[3] > MAX_PART)
        return NULL;
    char scratch[65536];
    while (skip > 0) {
        size_t chunk = skip < sizeof scratch ? (size_t)skip : sizeof scratch;
        if (read_exactly(fd, scratch, chunk) != 0)
            return NULL;
        skip -= chunk;
    }
    char *launch = malloc(lengths[3] + 1u);
    if (!launch || read_exactly(fd, launch, lengths[3]) != 0)
        return NULL;
    *size = lengths[3];
    return launch;
}

/* ---- descriptors ---- */

static int parse_fd(const char *text) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || end == text || *end || value < -1 || value > INT_MAX)
        _exit(SETUP_FAILED);
    return (int)value;
}

/* The launch's descriptors from the zygote (a "G" message); 0 if the zygote is gone. */
static int receive_launch(int handoff, int fds[LAUNCH_FDS]) {
    char byte;
    struct iovec io = {&byte, 1};
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(sizeof(int) * LAUNCH_FDS)];
    } control;
    struct msghdr msg = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = control.space,
                         .msg_controllen = sizeof control.space};
    ssize_t got;
    while ((got = recvmsg(handoff, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
    }
    struct cmsghdr *c = got > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
    if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS
        || c->cmsg_len != CMSG_LEN(sizeof(int) * LAUNCH_FDS) || (msg.msg_flags & MSG_CTRUNC))
        return 0;  /* (a truncated or partial message closed what it carried) */
    memcpy(fds, CMSG_DATA(c), sizeof(int) * LAUNCH_FDS);
    return 1;
}

/* Send `byte` with `count` descriptors (at most two) over `sock`; 0 when sent. */
int send_fds(int sock, char byte, const int *fds, int count) {
    struct iovec io = {&byte, 1};
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(sizeof(int) * 2)];
    } buffer;
    if (count < 1 || count > 2)
        return -1;
    struct msghdr msg = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = buffer.space,
                         .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)count)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)count);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)count);
    ssize_t sent;
    while ((sent = sendmsg(sock, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
    }
    return sent == 1 ? 0 : -1;
}

/* ---- starting the command ---- */

struct limits {
    int apply, watch_memory, watch_exec, seal_memfd, keep_fds, watch_names;
    int64_t memory, processes, file_size;  /* -1: none */
};

/* The protected names the command may not make, and where it may (namewatch.c). */
struct names {
    const char *names, *free;
    uint32_t names_size, free_size;
};

/* The command's own Landlock domain, nested in pid 1's (0, 0: none). It handles rights pid 1's
 * ruleset already denies everywhere, so it takes nothing more from the command's filesystem,
 * but Landlock then keeps the command from tracing pid 1, and with `scoped`, from signalling
 * it. (The kernel takes this struct at any size, its unknown trailing fields zero.) */
struct nested {
    uint64_t handled_fs, handled_net, scoped;
};

enum { STEP_PRIVILEGE = 1, STEP_LANDLOCK = 2, STEP_EXEC = 3 };

struct report {
    int32_t step, error;
};

static void report_and_exit(int fd, int step) {
    struct report r = {step, errno};
    ssize_t ignored = write(fd, &r, sizeof r);
    (void)ignored;
    _exit(127);
}

static int set_limit(int resource, int64_t value) {
    struct rlimit limit = {(rlim_t)value, (rlim_t)value};
    return value < 0 ? 0 : setrlimit(resource, &limit);
}

/* execvpe without its fallback of running a file it cannot execute through /bin/sh: search
 * PATH of the command's own environment (or the system default), as posix_spawnp does. It
 * allocates nothing: once the memory watch is on, an mmap here would wait for pid 1, which
 * waits for this exec. */
static void exec_search(char **argv, char **env) {
    if (strchr(argv[0], '/')) {
        execve(argv[0], argv, env);
        return;
    }
    const char *path = "/bin:/usr/bin";
    for (char **e = env; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0)
            path = *e + 5;
    int denied = 0;
    size_t name = strlen(argv[0]);
    char full[PATH_MAX];
    for (const char *dir = path;; dir++) {
        const char *end = strchrnul(dir, ':');
        size_t length = (size_t)(end - dir);
        if (length + name + 2 > sizeof full) {
            errno = ENAMETOOLONG;
            return;
        }
        memcpy(full, dir, length);
        full[length] = '/';  /* (an empty entry is the working directory: "/name" would not be) */
        memcpy(full + length + 1, argv[0], name + 1);
        execve(length ? full : full + 1, argv, env);
        if (errno == EACCES)
            denied = 1;
        else if (errno != ENOENT && errno != ENOTDIR)
            return;
        if (!*end)
            break;
        dir = end;
    }
    errno = denied ? EACCES : ENOENT;
}

static int nest(const struct nested *domain) {
    if (!domain->handled_fs && !domain->scoped)
        return 0;
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, domain, sizeof *domain, 0);
    if (ruleset < 0)
        return -1;
    int done = (int)syscall(SYS_landlock_restrict_self, ruleset, 0);
    close(ruleset);
    return done;
}

/* Until `fd` is readable: answer the watch's requests (the starter's own exec is one). */
static void answer_until_readable(int fd, struct memwatch *watch) {
    struct pollfd watched[2] = {{fd, POLLIN, 0}, {watch->listener, POLLIN, 0}};
    while (!watched[0].revents) {
        if (poll(watched, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            _exit(SETUP_FAILED);
        }
        if (watched[1].revents & POLLIN)
            memwatch_answer(watch);
        else if (watched[1].revents)
            watched[1].fd = -1;  /* (the starter died) */
    }
}

/* One message from the command's starter: its listener ('L', one byte and the descriptor,
 * put in *listener), a struct report, or 0 at the end (it exec'd, or died). */
static ssize_t receive_report(int sock, struct report *r, int *listener) {
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(sizeof(int))];
    } control;
    struct iovec io = {r, sizeof *r};
    struct msghdr msg = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = control.space,
                         .msg_controllen = sizeof control.space};
    ssize_t got;
    while ((got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
    }
    struct cmsghdr *c = got > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS
        && c->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(listener, CMSG_DATA(c), sizeof(int));
    return got;
}

/* Start the command; with its listener (if it is watched) open `watch` on it, for the
 * `written` paths (`written_size` bytes), and answer its requests while it execs; with the
 * `names` protected, its creating calls too (namewatch.c). */
static pid_t start(struct launch *launch, const int stdio[3], const struct limits *limits,
                   const struct nested *domain, struct memwatch *watch, const char *written,
                   uint32_t written_size, const struct names *names) {
    int reports[2];  /* a socket, so the starter can hand its listener over too */
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, reports) != 0)
        fail(0, "exec_failed", NULL, strerror(errno), "exec");
    pid_t child = fork();
    if (child < 0)
        fail(0, "exec_failed", NULL, strerror(errno), "exec");
    if (child == 0) {
        close(reports[0]);
        sigset_t none;
        sigemptyset(&none);
        for (int sig = 1; sig < NSIG; sig++)
            signal(sig, SIG_DFL);  /* (fails harmlessly for SIGKILL, SIGSTOP and reserved ones) */
        if (sigprocmask(SIG_SETMASK, &none, NULL) != 0 || setsid() < 0)
            report_and_exit(reports[1], STEP_PRIVILEGE);
        for (int target = 0; target < 3; target++)
            if (dup2(stdio[target], target) < 0)
                report_and_exit(reports[1], STEP_PRIVILEGE);
        if (chdir(launch->cwd) != 0)
            report_and_exit(reports[1], STEP_PRIVILEGE);
        umask(launch->umask);
        if (limits->apply
            && (set_limit(RLIMIT_CORE, 0) || set_limit(RLIMIT_AS, limits->memory)
                || set_limit(RLIMIT_NPROC, limits->processes)
                || set_limit(RLIMIT_FSIZE, limits->file_size)))
            report_and_exit(reports[1], STEP_PRIVILEGE);
        if (nest(domain) != 0)
            report_and_exit(reports[1], STEP_LANDLOCK);
        /* nothing of pid 1's but stdio reaches the command */
        if (!limits->keep_fds && close_range(3, ~0u, CLOSE_RANGE_CLOEXEC) != 0)
            report_and_exit(reports[1], STEP_PRIVILEGE);
        /* pid 1 reads the path of this starter's exec (the command's are dumpable anyway);
         * nothing else runs in the sandbox yet, and the exec replaces pid 1's memory */
        if (limits->watch_exec && prctl(PR_SET_DUMPABLE, 1) != 0)
            report_and_exit(reports[1], STEP_PRIVILEGE);
        if (limits->watch_memory || limits->watch_exec || limits->seal_memfd
            || limits->watch_names) {
            /* last: then no allocation (-1: unwatched, and the exit event says so; the
             * protected names are never left unwatched) */
            int watch = memwatch_install(limits->watch_memory, limits->watch_exec,
                                         limits->seal_memfd, limits->watch_names);
            if (watch < 0 && limits->watch_names)
                report_and_exit(reports[1], STEP_PRIVILEGE);
            if (watch >= 0 && (send_fds(reports[1], 'L', &watch, 1) != 0 || close(watch)))
                report_and_exit(reports[1], STEP_PRIVILEGE);
        }
        exec_search(launch->argv, launch->env);
        report_and_exit(reports[1], STEP_EXEC);
    }
    close(reports[1]);
    struct report r;
    ssize_t got;
    int listener = -1;
    while ((got = receive_report(reports[0], &r, &listener)) == 1) {
        /* its listener came first: then the exec, or a failure */
        if (memwatch_open(watch, listener, limits->watch_memory ? limits->memory : -1,
                          limits->watch_exec, limits->seal_memfd, written, written_size) != 0
            || (limits->watch_names
                && !(watch->names = namewatch_open(listener, names->names, names->names_size,
                                                   names->free, names->free_size)))) {
            close(listener);  /* (the filter's calls then fail ENOSYS: it cannot go on) */
            kill(child, SIGKILL);
            fail(0, "memory_watch_failed", NULL, strerror(errno), "exec");
        }
        answer_until_readable(reports[0], watch);
    }
    close(reports[0]);
    if (got == 0)
        return child;  /* the report pipe closed on exec */
    while (waitpid(child, NULL, 0) < 0 && errno == EINTR) {
    }
    if (got != sizeof r)
        fail(0, "exec_failed", NULL, "the command's starter ended unexpectedly", "exec");
    const char *why = strerror(r.error);
    if (r.step == STEP_PRIVILEGE)
        fail(0, "privilege_failed", NULL, why, "privilege");
    if (r.step == STEP_LANDLOCK)
        fail(0, "landlock_failed", NULL, why, "landlock");
    if (r.error == ENOENT || r.error == ENAMETOOLONG)
        fail(1, "command_not_found", launch->argv[0], why, "exec");
    if (r.error == EACCES || r.error == ENOEXEC || r.error == ENOTDIR || r.error == EPERM)
        fail(1, "command_not_executable", launch->argv[0], why, "exec");
    fail(0, "exec_failed", NULL, why, "exec");
    return -1;
}

/* ---- supervising it ---- */

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
        _exit(SETUP_FAILED);
    return found;
}

static int wait_for(pid_t command, int signals, int lifeline, struct memwatch *memory) {
    int status = 0;
    struct pollfd watched[3] = {{signals, POLLIN, 0}, {lifeline, POLLIN, 0},
                                {memory->listener, POLLIN, 0}};  /* (a negative fd: skipped) */
    while (!reap(command, &status)) {
        if (poll(watched, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            _exit(SETUP_FAILED);
        }
        if (watched[1].revents)
            _exit(1);  /* the owner is gone: pid 1 exiting kills the whole namespace */
        if (watched[2].revents & POLLIN)
            memwatch_answer(memory);
        else if (watched[2].revents)
            watched[2].fd = -1;  /* no process uses the filter any more */
        struct signalfd_siginfo info;
        if (watched[0].revents && read(signals, &info, sizeof info) < 0 && errno != EAGAIN)
            _exit(SETUP_FAILED);
    }
    return status;
}

/* pid 1 from here on: a spare waiting on `handoff` (launch_fds NULL), or with its launch. */
_Noreturn void supervise(int plan_fd, int listener, int handoff, const int *launch_fds) {
    /* exec made this process dumpable again; nothing in the sandbox may inspect it */
    if (prctl(PR_SET_DUMPABLE, 0) != 0)
        _exit(SETUP_FAILED);
    signal(SIGPIPE, SIG_IGN);  /* a closed status pipe is an error return, not a signal */
    sigset_t child_exits;
    sigemptyset(&child_exits);
    sigaddset(&child_exits, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &child_exits, NULL) != 0)
        _exit(SETUP_FAILED);
    int signals = signalfd(-1, &child_exits, SFD_CLOEXEC);
    if (signals < 0)
        _exit(SETUP_FAILED);

    int fds[LAUNCH_FDS];
    struct stat info;
    if (fstat(plan_fd, &info) != 0 || info.st_size > (off_t)MAX_PART)
        _exit(SETUP_FAILED);
    char *plan = malloc((size_t)info.st_size + 1);
    if (!plan || pread(plan_fd, plan, (size_t)info.st_size, 0) != info.st_size)
        _exit(SETUP_FAILED);
    close(plan_fd);
    /* flags, three rlimits, the nested domain's handled rights and scopes, the "started"
     * event's enforced JSON, the view digest, the written paths, the protected names and
     * the paths where they may be made, the launch */
    struct reader r = {plan, plan + info.st_size};
    int bad = 0;
    struct limits limits;
    uint32_t flags = u32(&r, &bad);
    limits.apply = (int)(flags & PLAN_RLIMITS);
    limits.watch_memory = limits.apply && (flags & PLAN_WATCH_MEMORY);
    limits.keep_fds = (flags & PLAN_KEEP_FDS) != 0;
    limits.watch_exec = (flags & PLAN_WATCH_EXEC) != 0;
    limits.seal_memfd = (flags & PLAN_SEAL_MEMFD) != 0;
    limits.watch_names = (flags & PLAN_WATCH_NAMES) != 0;
    proc_unguarded = (flags & PLAN_PROC_UNGUARDED) != 0;  /* (tests only) */
    /* (tests only: then nothing but its command ends it, not its parent's death either) */
    if ((flags & PLAN_UNBOUND) && prctl(PR_SET_PDEATHSIG, 0) != 0)
        _exit(SETUP_FAILED);
    limits.memory = i64(&r, &bad), limits.processes = i64(&r, &bad);
    limits.file_size = i64(&r, &bad);
    struct nested domain = {(uint64_t)i64(&r, &bad), 0, (uint64_t)i64(&r, &bad)};
    uint32_t enforced_size = u32(&r, &bad);
    const char *enforced = r.at;
    bad |= (size_t)(r.end - r.at) < enforced_size;
    r.at += bad ? 0 : enforced_size;
    unsigned char view[DIGEST];
    bad |= take(&r, view, DIGEST);
    uint32_t written_size = u32(&r, &bad);  /* the paths the command may write, NUL-ended */
    const char *written = r.at;
    bad |= (size_t)(r.end - r.at) < written_size
        || (written_size > 0 && written[written_size - 1] != 0);
    r.at += bad ? 0 : written_size;
    struct names names;
    names.names_size = u32(&r, &bad);  /* NUL-ended, as the written paths */
    names.names = r.at;
    bad |= (size_t)(r.end - r.at) < names.names_size
        || (names.names_size > 0 && names.names[names.names_size - 1] != 0);
    r.at += bad ? 0 : names.names_size;
    names.free_size = u32(&r, &bad);
    names.free = r.at;
    bad |= (size_t)(r.end - r.at) < names.free_size
        || (names.free_size > 0 && names.free[names.free_size - 1] != 0);
    r.at += bad ? 0 : names.free_size;
    uint32_t launch_size = u32(&r, &bad);
    bad |= (size_t)(r.end - r.at) != launch_size;
    if (bad)
        _exit(SETUP_FAILED);

    struct launch launch;
    int launch_bad;
    if (!launch_fds) {  /* a spare: wait for the launch this view was made for */
        if (!receive_launch(handoff, fds))
            _exit(0);  /* the zygote is gone: nobody will ever use this sandbox */
        close(handoff);
        status_fd = fds[4];
        stage("handoff");
        size_t size = 0;
        char *data = read_launch(fds[3], &size);
        launch_bad = !data || parse_launch(data, size, &launch) != 0;
        if (!launch_bad && memcmp(launch.digest, view, DIGEST) != 0)
            fail(0, "setup_failed", NULL, "the prepared sandbox was made for another view than "
                 "this launch's", "request");
    } else {
        memcpy(fds, launch_fds, sizeof fds);
        status_fd = fds[4];
        launch_bad = parse_launch(r.at, launch_size, &launch) != 0;
    }
    if (launch_bad)
        fail(0, "request_invalid", NULL, "the launch part of the request is malformed",
             "request");
    if (!launch_fds) {  /* (built and confined ahead: these stages took no time of the launch's) */
        stage("request");
        stage("mounts");
        stage("confine");
    }
    if (listener >= 0 && send_fds(fds[5], 'P', &listener, 1) != 0)
        fail(0, "proxy_listen_failed", NULL, strerror(errno), "network");
    if (listener >= 0)
        close(listener);
    close(fds[5]);

    struct memwatch memory = {.listener = -1};  /* (opened once the command is watched) */
    pid_t command = start(&launch, fds, &limits, &domain, &memory, written, written_size,
                          &names);
    for (int i = 0; i < 3; i++)
        close(fds[i]);  /* the command's readers see the end when it (and its tree) ends */
    stage("exec");
    struct text event = {0};
    puts_(&event, "{\"event\": \"started\", \"enforced\": ");
    put(&event, enforced, enforced_size);
    puts_(&event, "}");
    emit_event(&event);

    int status = wait_for(command, signals, flags & PLAN_UNBOUND ? -1 : fds[3], &memory);
    stage("run");
    if (getpid() == 1)  /* (without a pid namespace of its own, a test's: not the host's!) */
        kill(-1, SIGKILL);  /* from a pid namespace's init: every other process in it */
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {
    }
    /* Only now, with pid 1 alone in the sandbox: the owner may settle on this event without
     * waiting for pid 1 itself to exit (and the kernel to tear the namespaces down). */
    char line[384];
    int size = WIFSIGNALED(status)
        ? snprintf(line, sizeof line, "{\"event\": \"exit\", \"exit_code\": null, "
                   "\"signal\": %d", WTERMSIG(status))
        : snprintf(line, sizeof line, "{\"event\": \"exit\", \"exit_code\": %d, "
                   "\"signal\": null", WEXITSTATUS(status));
    if (limits.watch_memory || limits.watch_exec)
        size += memwatch_summary(&memory, line + size, sizeof line - (size_t)size);
    unsigned unrecorded = memory.names ? namewatch_unrecorded(memory.names) : 0;
    if (unrecorded)
        size += snprintf(line + size, sizeof line - (size_t)size,
                         ", \"protected_unrecorded\": %u", unrecorded);
    size += snprintf(line + size, sizeof line - (size_t)size, "}\n");
    write_all(status_fd, line, (size_t)size);
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc == 6 && strcmp(argv[1], "template") == 0)
        return template_main(parse_fd(argv[2]), parse_fd(argv[3]), parse_fd(argv[4]),
                             parse_fd(argv[5]));
    if (argc != 4 && argc != 10)
        return SETUP_FAILED;
    int fds[LAUNCH_FDS];
    for (int i = 0; argc == 10 && i < LAUNCH_FDS; i++)
        fds[i] = parse_fd(argv[4 + i]);
    supervise(parse_fd(argv[1]), parse_fd(argv[2]), argc == 4 ? parse_fd(argv[3]) : -1,
              argc == 10 ? fds : NULL);
}
