/* A spare confines itself as init._confine confines a pid 1 built at launch, in the same
 * order and from the same values (template.py computes them with landlock.py, privilege.py
 * and seccomp.py): securebits locked, the Landlock ruleset, every capability dropped and
 * no_new_privs, then the seccomp filter. The supervisor it becomes and the command it forks
 * inherit all of it. A layer weakened for a test is absent from the spec's flags. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/securebits.h>
#include <errno.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "supervisor.h"

/* NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE set, KEEP_CAPS clear, all four locked
 * (privilege.SECUREBITS) */
static const unsigned long SECUREBITS = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED
    | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED
    | SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
/* Landlock's ABI, spelled out: the build's kernel headers may be older than the kernel. */
enum { RULE_PATH_BENEATH = 1, RULE_NET_PORT = 2 };
static const uint64_t EXECUTE = 1 << 0, WRITE_FILE = 1 << 1, READ_FILE = 1 << 2,
                      TRUNCATE = 1 << 14, IOCTL_DEV = 1 << 15, CONNECT_TCP = 1 << 1;
/* the only rights the kernel accepts on a rule for a file that is not a directory */
static const uint64_t FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;

struct path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

struct net_port {
    uint64_t allowed_access, port;
};

static int allow_beneath(int ruleset, const struct rule *rule) {
    int fd = open(rule->path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    struct stat info;
    if (fd < 0 || fstat(fd, &info) != 0 || S_ISLNK(info.st_mode)) {
        if (fd >= 0)
            close(fd);
        return -1;  /* (a root must not be a symbolic link: landlock.py refuses it too) */
    }
    struct path_beneath attr = {
        .allowed_access = S_ISDIR(info.st_mode) ? rule->access : rule->access & FILE_RIGHTS,
        .parent_fd = fd};
    int done = (int)syscall(SYS_landlock_add_rule, ruleset, RULE_PATH_BENEATH, &attr, 0);
    close(fd);
    return done;
}

static int landlock(const struct spec *s) {
    struct {
        uint64_t handled_access_fs, handled_access_net, scoped;
    } attr = {s->handled_fs, s->handled_net, s->scoped};
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0), done = -1;
    if (ruleset < 0)
        return -1;
    for (uint32_t i = 0; i < s->rules; i++)
        if (allow_beneath(ruleset, &s->rule[i]) != 0)
            goto out;
    for (uint32_t i = 0; i < s->ports; i++) {
        struct net_port port = {CONNECT_TCP, s->port_rule[i]};
        if (syscall(SYS_landlock_add_rule, ruleset, RULE_NET_PORT, &port, 0) != 0)
            goto out;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0)
        done = (int)syscall(SYS_landlock_restrict_self, ruleset, 0);
out:
    close(ruleset);
    return done;
}

static int drop_capabilities(void) {
    for (int cap = 0;; cap++) {
        int held = prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
        if (held < 0 && errno == EINVAL)
            break;  /* past the kernel's last capability */
        if (held < 0 || (held && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0))
            return -1;
    }
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[2] = {{0}};
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0
        || syscall(SYS_capset, &header, none) != 0)
        return -1;
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

static int filter(const struct spec *s) {
    size_t count = s->bpf_size / sizeof(struct sock_filter);
    if (s->bpf_size % sizeof(struct sock_filter) || count == 0 || count > BPF_MAXINSNS)
        return -1;
    struct sock_fprog program = {(unsigned short)count, s->bpf};
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program);
}

int confine(const struct spec *s) {
    if ((s->flags & LAYER_PRIVILEGES) && prctl(PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0) != 0)
        return -1;
    if ((s->flags & LAYER_LANDLOCK) && landlock(s) != 0)
        return -1;
    if ((s->flags & LAYER_PRIVILEGES) && drop_capabilities() != 0)
        return -1;
    if ((s->flags & LAYER_SECCOMP) && filter(s) != 0)
        return -1;
    return 0;
}
