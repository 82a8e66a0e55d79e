/* A view template once its view is built (see template.py):
 *
 *     supervisor template SPEC PLAN HANDOFF HOST_PROC
 *
 * The Python template built the view, pivoted into it and execed this, keeping its user and
 * mount namespaces. For each "S" on HANDOFF it clones a spare into fresh namespaces, maps its
 * ids through HOST_PROC (the host's /proc, opened before the pivot) and hands the zygote the
 * spare's handoff socket and pidfd ("S"). The spare covers what each sandbox owns with fresh
 * instances (refresh.c), writes its pid_max and memfd_noexec, makes the proxy's listener, confines itself
 * (confine.c), says "M" + the view's identity, and waits for its launch as the supervisor.
 *
 * Compiled, so that a spare is a clone of a process of a few pages, not of a Python
 * interpreter: it copies and tears down no Python heap, and runs no Python. Whatever fails in
 * a spare, it just ends: the zygote then hands no launch to it. SPEC is a memfd (template.py's
 * _spec); PLAN the supervisor's plan, the same for every spare of the view.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "supervisor.h"

static const uint32_t MAX_SPEC = 16u << 20;
static const int SANDBOX_NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC
                                      | CLONE_NEWUTS | CLONE_NEWNET | CLONE_NEWCGROUP;

/* ---- the spec ---- */

static void *table(size_t count, size_t size, int *bad) {
    void *t = calloc(count ? count : 1, size);
    *bad |= !t;
    return t;
}

static int parse_spec(const char *data, size_t size, struct spec *s) {
    struct reader r = {data, data + size};
    int bad = 0;
    s->flags = u32(&r, &bad), s->uid = u32(&r, &bad), s->gid = u32(&r, &bad);
    s->port = u32(&r, &bad);
    s->pid_max = i64(&r, &bad);
    s->identity = blob(&r, &s->identity_size, &bad);
    const char *bpf = blob(&r, &s->bpf_size, &bad);
    s->bpf = table(1, s->bpf_size, &bad);  /* (a copy: aligned for struct sock_filter) */
    if (bad)
        return -1;
    memcpy(s->bpf, bpf, s->bpf_size);
    s->filesystems = u32(&r, &bad);
    s->filesystem = table(bad ? 0 : s->filesystems, sizeof *s->filesystem, &bad);
    for (uint32_t i = 0; !bad && i < s->filesystems; i++) {
        struct filesystem *f = &s->filesystem[i];
        f->path = string(&r, &bad), f->type = string(&r, &bad);
        f->attrs = (uint64_t)i64(&r, &bad);
        f->options = u32(&r, &bad);
        f->option = table(bad ? 0 : 2 * (size_t)f->options, sizeof *f->option, &bad);
        for (uint32_t k = 0; !bad && k < 2 * f->options; k++)
            f->option[k] = string(&r, &bad);
    }
    s->carried = u32(&r, &bad);
    s->carry = table(bad ? 0 : s->carried, sizeof *s->carry, &bad);
    for (uint32_t i = 0; !bad && i < s->carried; i++) {
        s->carry[i].kind = u32(&r, &bad);
        s->carry[i].path = string(&r, &bad), s->carry[i].link = string(&r, &bad);
    }
    s->handled_fs = (uint64_t)i64(&r, &bad), s->handled_net = (uint64_t)i64(&r, &bad);
    s->scoped = (uint64_t)i64(&r, &bad);
    s->rules = u32(&r, &bad);
    s->rule = table(bad ? 0 : s->rules, sizeof *s->rule, &bad);
    for (uint32_t i = 0; !bad && i < s->rules; i++) {
        s->rule[i].path = string(&r, &bad);
        s->rule[i].access = (uint64_t)i64(&r, &bad);
    }
    s->ports = u32(&r, &bad);
    s->port_rule = table(bad ? 0 : s->ports, sizeof *s->port_rule, &bad);
    for (uint32_t i = 0; !bad && i < s->ports; i++)
        s->port_rule[i] = (uint64_t)i64(&r, &bad);
    return bad || r.at != r.end ? -1 : 0;
}

static int read_spec(int fd, struct spec *s) {
    struct stat info;
    if (fstat(fd, &info) != 0 || info.st_size > (off_t)MAX_SPEC)
        return -1;
    char *data = malloc((size_t)info.st_size + 1);
    if (!data || pread(fd, data, (size_t)info.st_size, 0) != info.st_size)
        return -1;
    close(fd);
    return parse_spec(data, (size_t)info.st_size, s);  /* (its strings point into data) */
}

/* ---- the template's side ---- */

static int write_file_at(int dir, const char *path, const char *text) {
    int fd = openat(dir, path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t size = (ssize_t)strlen(text), done = write(fd, text, (size_t)size);
    close(fd);
    return done == size ? 0 : -1;
}

/* The spare's uid and gid map to ours, one id each; setgroups denied (as ns.map_ids). */
static int map_ids(int host_proc, pid_t pid, const struct spec *s) {
    char path[64], line[64];
    snprintf(path, sizeof path, "%d/setgroups", pid);
    if (write_file_at(host_proc, path, "deny") != 0)
        return -1;
    snprintf(path, sizeof path, "%d/uid_map", pid);
    snprintf(line, sizeof line, "%u %u 1\n", s->uid, s->uid);
    if (write_file_at(host_proc, path, line) != 0)
        return -1;
    snprintf(path, sizeof path, "%d/gid_map", pid);
    snprintf(line, sizeof line, "%u %u 1\n", s->gid, s->gid);
    return write_file_at(host_proc, path, line);
}

/* Close every descriptor from 3 up but those in keep[] (sorted, ascending). */
static void close_others(const int *keep, int count) {
    unsigned first = 3;
    for (int i = 0; i < count; i++) {
        if (keep[i] < (int)first)
            continue;
        if ((unsigned)keep[i] > first)
            syscall(SYS_close_range, first, (unsigned)keep[i] - 1, 0);
        first = (unsigned)keep[i] + 1;
    }
    syscall(SYS_close_range, first, ~0u, 0);
}

static void sort_fds(int *fds, int count) {
    for (int i = 1; i < count; i++)
        for (int j = i; j > 0 && fds[j - 1] > fds[j]; j--) {
            int t = fds[j];
            fds[j] = fds[j - 1], fds[j - 1] = t;
        }
}

/* ---- the spare's side: pid 1 of its namespaces until it is the supervisor ---- */

static int loopback_up(void) {
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq request = {0};
    strcpy(request.ifr_name, "lo");
    int done = sock >= 0 && ioctl(sock, SIOCGIFFLAGS, &request) == 0
        && (request.ifr_flags |= IFF_UP, ioctl(sock, SIOCSIFFLAGS, &request) == 0);
    if (sock >= 0)
        close(sock);
    return done ? 0 : -1;
}

/* The proxy's listener on the sandbox's own 127.0.0.1 (see net.py); -1 on failure. */
static int proxy_listener(uint32_t port) {
    int sock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (sock >= 0 && (bind(sock, (struct sockaddr *)&address, sizeof address) != 0
                      || listen(sock, 128) != 0)) {
        close(sock);
        return -1;
    }
    return sock;
}

/* What init.settle_as_pid1 does: not dumpable, its own hostname, /dev/null as stdio. */
static int settle(void) {
    if (prctl(PR_SET_DUMPABLE, 0) != 0 || sethostname("stockade", 8) != 0)
        return -1;
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0)
        return -1;
    for (int target = 0; target < 3; target++)
        if (dup2(null, target) < 0)
            return -1;
    close(null);
    return 0;
}

static _Noreturn void spare(const struct spec *s, int plan_fd, int handoff, int host_proc,
                            int go) {
    int keep[] = {plan_fd, handoff, host_proc, go};
    sort_fds(keep, 4);
    close_others(keep, 4);
    signal(SIGCHLD, SIG_DFL);  /* (the template's SIG_IGN would hide the command's exit) */
    char byte;
    if (read(go, &byte, 1) != 1 || byte != 'g')
        _exit(0);  /* the template could not map our ids */
    close(go);
    if (settle() != 0 || loopback_up() != 0 || refresh(s) != 0)
        _exit(0);
    if (s->pid_max >= 0) {  /* (through the host's proc, the write is our pid namespace's) */
        char value[32];
        snprintf(value, sizeof value, "%lld", (long long)s->pid_max);
        if (write_file_at(host_proc, "sys/kernel/pid_max", value) != 0)
            _exit(0);
    }
    if ((s->flags & MEMFD_NOEXEC) && write_file_at(host_proc, "sys/vm/memfd_noexec", "2") != 0)
        _exit(0);  /* (no memfd can be executed in our pid namespace: limits.py) */
    close(host_proc);
    int listener = -1;
    if ((s->flags & PROXY_LISTENER) && (listener = proxy_listener(s->port)) < 0)
        _exit(0);
    if (confine(s) != 0)
        _exit(0);
    char said[1 + 256];
    if (s->identity_size > sizeof said - 1)
        _exit(0);
    said[0] = 'M';
    memcpy(said + 1, s->identity, s->identity_size);
    if (send(handoff, said, 1 + s->identity_size, MSG_NOSIGNAL) < 0)
        _exit(0);
    supervise(plan_fd, listener, handoff, NULL);
}

int template_main(int spec_fd, int plan_fd, int handoff, int host_proc) {
    static struct spec s;
    if (prctl(PR_SET_DUMPABLE, 0) != 0 || read_spec(spec_fd, &s) != 0)
        return SETUP_FAILED;
    signal(SIGCHLD, SIG_IGN);  /* its spares are reaped by the kernel */
    signal(SIGPIPE, SIG_IGN);
    char request;
    while (recv(handoff, &request, 1, 0) == 1 && request == 'S') {
        int pair[2], go[2], pidfd = -1;
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0
            || pipe2(go, O_CLOEXEC) != 0)
            return SETUP_FAILED;
        /* Born dumpable, a spare's /proc files are its own until its ids are mapped (by us,
         * below); unmapped and not dumpable, they would be its namespace's unmapped root's. */
        if (prctl(PR_SET_DUMPABLE, 1) != 0)
            return SETUP_FAILED;
        /* The spare is the zygote's child (CLONE_PARENT), not this template's, which may be
         * thrown away while its spares run: the kernel kills it, and its pid namespace, when
         * the zygote goes (the owner gone), whatever it is doing then (see launcher.py's
         * _die_with_parent; the zygote reaps nothing: it ignores SIGCHLD, as we do). */
        pid_t pid = (pid_t)syscall(SYS_clone, SANDBOX_NAMESPACES | CLONE_PARENT | CLONE_PIDFD
                                   | SIGCHLD, 0, &pidfd, 0, 0);
        if (pid == 0) {
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
                _exit(0);
            close(pair[0]);
            close(go[1]);
            spare(&s, plan_fd, pair[1], host_proc, go[0]);
        }
        if (prctl(PR_SET_DUMPABLE, 0) != 0 || pid < 0)
            return SETUP_FAILED;
        close(go[0]);
        close(pair[1]);
        if (map_ids(host_proc, pid, &s) != 0 || write(go[1], "g", 1) != 1)
            return SETUP_FAILED;
        close(go[1]);
        int handed[2] = {pair[0], pidfd};
        if (send_fds(handoff, 'S', handed, 2) != 0)
            return SETUP_FAILED;
        close(pair[0]);
        close(pidfd);
    }
    return 0;
}
