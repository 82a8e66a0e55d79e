/* Memory exhaustion, seen: which of the command's address-space requests limits.memory refused.
 *
 * RLIMIT_AS bounds every process of the command (supervisor.c sets it), but the kernel tells
 * nobody when it refuses a request: the program gets ENOMEM and may die of it in any way (a
 * MemoryError, a message, abort, a SIGSEGV). So the command also runs under a seccomp filter
 * of its own that hands each mmap without MAP_FIXED, and each mremap, to pid 1 (a user
 * notification) before the kernel acts on it. pid 1 reads the caller's address space (the
 * first field of /proc/<tid>/statm: total_vm, the very count RLIMIT_AS bounds) and does the
 * kernel's own check, total_vm + the request's pages > the limit's pages: if it fails, pid 1
 * answers ENOMEM itself and counts the refusal; otherwise it lets the call continue, and the
 * kernel applies RLIMIT_AS as ever. A refusal is therefore one pid 1 made, at the limit, never
 * inferred from how the program ended.
 *
 * What this does not see, said in SECURITY.md: heap growth by brk (glibc and musl fall back to
 * mmap when the heap cannot grow, so their malloc failures are seen), stack growth, requests
 * raced by another thread of the same process (the kernel refuses those, unrecorded), and
 * MAP_FIXED mappings, which may replace what they cover. Continuing a call is safe: its
 * arguments are plain numbers (no pointer the caller could rewrite meanwhile), the kernel
 * still enforces RLIMIT_AS, and pid 1's own filter allows both calls.
 *
 * Executable mappings of written files, refused (exec_from_write = false): the second layer
 * beside the noexec mounts. The same filter hands pid 1 each mmap asking PROT_EXEC of a file
 * descriptor and each mprotect asking PROT_EXEC. pid 1 finds the mount the file is on (the
 * descriptor's mnt_id in /proc/<tid>/fdinfo; for mprotect, the mapping's file in
 * /proc/<tid>/maps) and answers EACCES when it is one the command may write (a write root,
 * /tmp, /dev/shm: their mount ids, found when the sandbox starts), or a file no longer there
 * (deleted, a memfd). This is what keeps `ld.so PROGRAM` and mmap(PROT_EXEC) of a written
 * file from running where a noexec mount is missing. What it does not see, said in
 * SECURITY.md: a descriptor another thread replaces (dup2) between pid 1's look and the
 * kernel's mapping: the noexec mount still refuses that one.
 *
 * Executions of written files, refused: the same filter hands pid 1 each execve and execveat.
 * The kernel maps the program it executes itself, unseen by the mmap watch, and a memfd (or a
 * deleted file) lies on no noexec mount: rootless nothing else stops fexecve of a memfd or an
 * execve of /proc/self/fd/N. pid 1 reads the path from the caller's memory, opens it as the
 * caller names it (from its working directory or descriptor, component by component:
 * /proc/self and /proc/thread-self, and links naming them, read as the caller's /proc/<tid>;
 * procfs's magic links followed by the kernel) and answers EACCES unless it is a regular file
 * with a name (a memfd or a deleted file has none) on a mount the command cannot write.
 * What it does not see, said in SECURITY.md: a path another thread rewrites between pid 1's
 * read and the kernel's, an interpreter the kernel itself opens (a script's #! line), and the
 * executions of a process that made itself non-dumpable (its memory is closed to pid 1).
 *
 * memfds made non-executable (seal): the filter hands pid 1 each memfd_create, and pid 1 makes
 * the memfd itself with MFD_NOEXEC_SEAL (a memfd nobody can make executable: what the
 * kernel does where vm.memfd_noexec = 2, a knob only host root may set) and puts it among the
 * caller's descriptors as the call's answer (SECCOMP_ADDFD_FLAG_SEND); MFD_EXEC is refused
 * EACCES, as the kernel does there. A kernel without MFD_NOEXEC_SEAL (before 6.3) lets the call
 * continue: the exec watch alone remains.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/magic.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "supervisor.h"

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif
#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U
#endif
#define MFD_NAME_MAX 249  /* (the kernel's MFD_NAME_MAX_LEN) */

#ifndef SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
#define SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV (1UL << 5)
#endif

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

/* The low 32 bits of argument `n` (little-endian: x86_64, aarch64). */
#define ARGUMENT_LOW(n) (offsetof(struct seccomp_data, args) + 8 * (n))

/* A classic BPF program assembled with labels: each jump names its targets. */
enum { LABEL_NEXT = -1 };
enum label { L_ALLOW = 1, L_NOTIFY, L_MEMORY, L_MEMORY_MMAP, L_MMAP_EXEC, L_MMAP_FILE,
             L_MPROTECT, L_OPEN, L_OPENAT, L_REST, L_LABELS };

struct assembly {
    struct sock_filter code[64];
    int jt[64], jf[64];
    int at[L_LABELS];
    int n;
};

static void emit(struct assembly *a, uint16_t op, uint32_t k, int jt, int jf) {
    a->code[a->n] = (struct sock_filter){op, 0, 0, k};
    a->jt[a->n] = jt, a->jf[a->n] = jf;
    a->n++;
}

static void here(struct assembly *a, enum label label) {
    a->at[label] = a->n;
}

int memwatch_install(int memory, int exec, int seal, int names) {
#ifdef NATIVE_ARCH
    struct assembly a = {0};
    emit(&a, BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch), 0, 0);
    emit(&a, BPF_JMP | BPF_JEQ | BPF_K, NATIVE_ARCH, LABEL_NEXT, L_ALLOW);  /* (pid 1's own
                                                                   * filter kills the others) */
    emit(&a, BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr), 0, 0);
    for (int i = 0; names && i < NAMEWATCH_CALL_COUNT; i++)  /* calls that make a name */
        emit(&a, BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)NAMEWATCH_CALLS[i], L_NOTIFY, LABEL_NEXT);
    if (names) {  /* open and openat only with O_CREAT */
#ifdef __NR_open
        emit(&a, BPF_JMP | BPF_JEQ | BPF_K, __NR_open, L_OPEN, LABEL_NEXT);
#endif
        emit(&a, BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, L_OPENAT, L_REST);
        here(&a, L_OPEN);
        emit(&a, BPF_LD | BPF_W | BPF_ABS, ARGUMENT_LOW(1), 0, 0);
        emit(&a, BPF_JMP | BPF_JSET | BPF_K, O_CREAT, L_NOTIFY, L_ALLOW);
        here(&a, L_OPENAT);
        emit(&a, BPF_LD | BPF_W | BPF_ABS, ARGUMENT_LOW(2), 0, 0);
        emit(&a, BPF_JMP | BPF_JSET | BPF_K, O_CREAT, L_NOTIFY, L_ALLOW);
        here(&a, L_REST);
        emit(&a, BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr), 0, 0);
    }
    if (seal)
        emit(&a, BPF_JMP | BPF_JEQ | BPF_K, __NR_memfd_create, L_NOTIFY, LABEL_NEXT);
    if (exec) {
        emit(&a, BPF_JMP | BPF_JEQ | BPF_K, __NR_execve, L_NOTIFY, LABEL_NEXT);
        emit(&a, BPF_JMP | BPF_JEQ | BPF_K, __NR_execveat, L_NOTIFY, LABEL_NEXT);
        emit(&a, BPF_JMP | BPF_JEQ | BPF_K, __NR_mprotect, L_MPROTECT, LABEL_NEXT);
        emit(&a, BPF_JMP | BPF_JEQ | BPF_K, __NR_mmap, L_MMAP_EXEC, L_MEMORY);
        here(&a, L_MPROTECT);
        emit(&a, BPF_LD | BPF_W | BPF_ABS, ARGUMENT_LOW(2), 0, 0);  /* prot */
        emit(&a, BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, L_NOTIFY, L_ALLOW);
        here(&a, L_MMAP_EXEC);
        emit(&a, BPF_LD | BPF_W | BPF_ABS, ARGUMENT_LOW(2), 0, 0);
        emit(&a, BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, L_MMAP_FILE, L_MEMORY_MMAP);
        here(&a, L_MMAP_FILE);
        emit(&a, BPF_LD | BPF_W | BPF_ABS, ARGUMENT_LOW(4), 0, 0);  /* fd: -1 anonymous */
        emit(&a, BPF_JMP | BPF_JEQ | BPF_K, 0xffffffffu, L_MEMORY_MMAP, L_NOTIFY);
        here(&a, L_MEMORY);
        emit(&a, BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr), 0, 0);
    }
    if (memory) {
        emit(&a, BPF_JMP | BPF_JEQ | BPF_K, __NR_mremap, L_NOTIFY, LABEL_NEXT);
        emit(&a, BPF_JMP | BPF_JEQ | BPF_K, __NR_mmap, LABEL_NEXT, L_ALLOW);
    }
    here(&a, L_MEMORY_MMAP);
    if (memory) {
        emit(&a, BPF_LD | BPF_W | BPF_ABS, ARGUMENT_LOW(3), 0, 0);  /* mmap's flags */
        emit(&a, BPF_JMP | BPF_JSET | BPF_K, MAP_FIXED, L_ALLOW, L_NOTIFY);
    }
    if (!memory && !exec)
        here(&a, L_MEMORY);
    here(&a, L_ALLOW);
    emit(&a, BPF_RET | BPF_K, SECCOMP_RET_ALLOW, 0, 0);
    here(&a, L_NOTIFY);
    emit(&a, BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF, 0, 0);
    for (int i = 0; i < a.n; i++) {
        if (BPF_CLASS(a.code[i].code) != BPF_JMP)
            continue;
        int jt = a.jt[i] == LABEL_NEXT ? i + 1 : a.at[a.jt[i]];
        int jf = a.jf[i] == LABEL_NEXT ? i + 1 : a.at[a.jf[i]];
        a.code[i].jt = (uint8_t)(jt - i - 1);
        a.code[i].jf = (uint8_t)(jf - i - 1);
    }
    struct sock_fprog program = {(unsigned short)a.n, a.code};
    /* (a signal then cannot make the kernel restart a call pid 1 has carried out: a name
     * namewatch.c made would fail EEXIST; before 5.19 the flag is unknown) */
    int listener = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                                SECCOMP_FILTER_FLAG_NEW_LISTENER
                                | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, &program);
    if (listener < 0 && errno == EINVAL)
        listener = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                                SECCOMP_FILTER_FLAG_NEW_LISTENER, &program);
    return listener;
#else
    (void)memory, (void)exec, (void)seal, (void)names;
    return -1;  /* no watch on this architecture: RLIMIT_AS alone, the noexec mounts alone */
#endif
}

static int mount_id(int dir, const char *path, int flags, uint64_t *id) {
    struct statx info;
    if (statx(dir, path, flags | AT_STATX_DONT_SYNC, STATX_MNT_ID, &info) != 0
        || !(info.stx_mask & STATX_MNT_ID))
        return -1;
    *id = info.stx_mnt_id;
    return 0;
}

int memwatch_open(struct memwatch *watch, int listener, int64_t limit, int exec, int seal,
                  const char *written, uint32_t written_size) {
    memset(watch, 0, sizeof *watch);
    watch->listener = -1;
    struct seccomp_notif_sizes sizes;
    long page = sysconf(_SC_PAGESIZE);
    if (listener < 0 || page <= 0
        || syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes) != 0)
        return -1;
    /* (the kernel may know larger structures than these headers: its sizes are used) */
    size_t request = sizes.seccomp_notif, response = sizes.seccomp_notif_resp;
    watch->request_size = request > sizeof *watch->request ? request : sizeof *watch->request;
    watch->request = calloc(1, watch->request_size);
    watch->response = calloc(1, response > sizeof *watch->response
                                    ? response : sizeof *watch->response);
    if (!watch->request || !watch->response)
        return -1;
    watch->page = (uint64_t)page;
    watch->memory = limit >= 0;
    watch->limit_pages = watch->memory ? (uint64_t)limit / watch->page : 0;
    watch->exec = exec;
    int probe = seal ? memfd_create("stockade-probe", MFD_NOEXEC_SEAL | MFD_CLOEXEC) : -1;
    watch->seal = probe >= 0;  /* (before 6.3 the kernel has no MFD_NOEXEC_SEAL: calls go on) */
    if (probe >= 0)
        close(probe);
    for (const char *path = written; exec && path < written + written_size;
         path += strlen(path) + 1) {
        if (watch->written_count == WRITTEN_MAX)
            return -1;
        if (mount_id(AT_FDCWD, path, 0, &watch->written[watch->written_count]) == 0)
            watch->written_count++;  /* (a root that is not there has no mount to map from) */
    }
    watch->listener = listener;
    return 0;
}

ssize_t proc_text(uint32_t tid, const char *what, char *text, size_t room) {
    char path[96];
    snprintf(path, sizeof path, "/proc/%u/%s", tid, what);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t got = read(fd, text, room - 1);
    close(fd);
    if (got > 0)
        text[got] = 0;
    return got;
}

static int written(const struct memwatch *watch, uint64_t id) {
    for (int i = 0; i < watch->written_count; i++)
        if (watch->written[i] == id)
            return 1;
    return 0;
}

/* The mount id of descriptor `fd` of task `tid` (its fdinfo's mnt_id); -1 if unknown. */
static int descriptor_mount(uint32_t tid, uint64_t fd, uint64_t *id) {
    char what[48], text[512];
    snprintf(what, sizeof what, "fdinfo/%llu", (unsigned long long)fd);
    if (proc_text(tid, what, text, sizeof text) <= 0)
        return -1;
    char *at = strstr(text, "mnt_id:");
    return at && sscanf(at, "mnt_id: %llu", (unsigned long long *)id) == 1 ? 0 : -1;
}

/* Whether the mapping of task `tid` holding `address` is of a file the command wrote (on a
 * written mount, or no longer there); 0 for anonymous memory and files of other mounts. */
static int mapping_written(const struct memwatch *watch, uint32_t tid, uint64_t address) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/maps", tid);
    FILE *maps = fopen(path, "re");
    if (!maps)
        return 1;  /* (it cannot be told: refused) */
    char line[PATH_MAX + 128];
    int found = 0;
    while (fgets(line, sizeof line, maps)) {
        unsigned long long start, end, inode;
        int name = 0;
        if (sscanf(line, "%llx-%llx %*s %*s %*s %llu %n", &start, &end, &inode, &name) < 3
            || address < start || address >= end)
            continue;
        line[strcspn(line, "\n")] = 0;
        const char *file = name ? line + name : "";
        uint64_t id;
        size_t length = strlen(file);
        if (inode == 0 || file[0] != '/')
            found = 0;  /* anonymous memory, the stack, the vdso */
        else if (length > 10 && strcmp(file + length - 10, " (deleted)") == 0)
            found = 1;
        else
            found = mount_id(AT_FDCWD, file, AT_SYMLINK_NOFOLLOW, &id) != 0
                || written(watch, id);
        break;
    }
    fclose(maps);
    return found;
}

/* Whether `call` asks to make a written file executable. */
static int exec_of_written(const struct memwatch *watch, const struct seccomp_data *call,
                           uint32_t tid) {
    if (!watch->exec || !(call->args[2] & PROT_EXEC))
        return 0;
    if (call->nr == __NR_mprotect)
        return mapping_written(watch, tid, call->args[0]);
    uint64_t id;
    if (call->nr != __NR_mmap || (int)call->args[4] < 0 || (call->args[3] & MAP_ANONYMOUS))
        return 0;
    return descriptor_mount(tid, call->args[4], &id) == 0 && written(watch, id);
}

int caller_string(uint32_t tid, uint64_t address, char *text, size_t room) {
    char path[48];
    snprintf(path, sizeof path, "/proc/%u/mem", tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        errno = EACCES;
        return -1;
    }
    ssize_t got = pread(fd, text, room, (off_t)address);  /* (short at an unmapped page) */
    close(fd);
    if (got <= 0) {
        errno = EFAULT;
        return -1;
    }
    if (!memchr(text, 0, (size_t)got)) {
        errno = (size_t)got == room ? ENAMETOOLONG : EFAULT;
        return -1;
    }
    return 0;
}

enum { PROC_ROOT_INO = 1, PROC_DEPTH_MAX = 16 };

/* The Tgid in the status file of procfs directory `dir` (a /proc/<pid>, or the caller's own
 * status when `dir` is -1 and `tid` given); 0 when there is none. */
static unsigned tgid_of(int dir, uint32_t tid) {
    char text[2048];
    unsigned tgid = 0;
    ssize_t got = -1;
    if (dir < 0) {
        got = proc_text(tid, "status", text, sizeof text);
    } else {
        int fd = openat(dir, "status", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            got = read(fd, text, sizeof text - 1);
            close(fd);
        }
        if (got > 0)
            text[got] = 0;
    }
    const char *at = got > 0 ? strstr(text, "\nTgid:") : NULL;
    return at && sscanf(at, "\nTgid: %u", &tgid) == 1 ? tgid : 0;
}

/* The directory of procfs's root that procfs directory `dir` lies in (itself, or at any depth
 * below it: /proc/1, /proc/1/fd, /proc/1/task/1/fd), as an O_PATH descriptor; -1 when `dir`
 * is the root itself; -2 when that cannot be told. Found by going up ("..": pid 1's own
 * lookups, never the caller's), so how `dir` was reached (a working directory, a descriptor,
 * a magic link) does not matter. */
static int top_directory(int dir) {
    struct stat info;
    int at = fcntl(dir, F_DUPFD_CLOEXEC, 0);
    if (at < 0 || fstat(at, &info) != 0 || info.st_ino == PROC_ROOT_INO) {
        if (at >= 0)
            close(at);
        return at < 0 ? -2 : info.st_ino == PROC_ROOT_INO ? -1 : -2;
    }
    for (int depth = 0; depth < PROC_DEPTH_MAX; depth++) {
        int up = openat(at, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
        struct statfs where;
        if (up < 0 || fstat(up, &info) != 0 || fstatfs(up, &where) != 0
            || where.f_type != PROC_SUPER_MAGIC) {  /* (a procfs mount on another: not told) */
            if (up >= 0)
                close(up);
            break;
        }
        if (info.st_ino == PROC_ROOT_INO) {
            close(up);
            return at;
        }
        close(at);
        at = up;
    }
    close(at);
    return -2;
}

/* Whether the directory of procfs's root `top` is a process's (a /proc/<pid>: numbered) */
static int numbered(int top) {
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", top);
    ssize_t size = readlink(link, path, sizeof path - 1);
    if (size <= 0)
        return 1;  /* (not told: taken as one) */
    path[size] = 0;
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    return name[0] == 0 || name[strspn(name, "0123456789")] == 0;
}

/* (supervisor.h) pid 1 follows no path through one for the caller:
 * inside it, what the kernel guards with the caller's access (fd/, maps, mem, cwd) is opened
 * with pid 1's, and in /proc/1 leads to what is pid 1's own (its status pipe, its lifeline,
 * its seccomp listener). A procfs of another mount, whose numbers pid 1 cannot compare,
 * counts as another process's. */
int proc_unguarded;

int another_process(uint32_t tid, int dir, const char *name) {
    struct statfs where;
    if (proc_unguarded || fstatfs(dir, &where) != 0 || where.f_type != PROC_SUPER_MAGIC)
        return 0;
    struct stat info, own;
    unsigned tgid = tgid_of(-1, tid);
    if (tgid == 0 || fstat(dir, &info) != 0 || stat("/proc", &own) != 0
        || info.st_dev != own.st_dev)
        return 1;
    int top = top_directory(dir);
    if (top == -2)
        return 1;
    if (top == -1) {  /* the root: only a numbered name is a process's */
        if (name[strspn(name, "0123456789")] != 0 || strtoul(name, NULL, 10) == tid
            || strtoul(name, NULL, 10) == tgid)
            return 0;
        top = openat(dir, name, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (top < 0)
            return 0;  /* (none such: the caller's lookup fails as well) */
    }
    unsigned owner = tgid_of(top, 0);
    int another = owner ? owner != tgid : numbered(top);
    close(top);
    return another;
}

int caller_resolve(uint32_t tid, int dir, const char *path) {
    char rest[2 * PATH_MAX], name[NAME_MAX + 1], target[PATH_MAX], own[16];
    snprintf(own, sizeof own, "%u", tid);
    if (strlen(path) >= sizeof rest / 2) {
        close(dir);
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(rest, path);
    for (int links = 0, start = 1; rest[0];) {
        if (start && rest[0] == '/') {  /* (the path's, or a link's, first component) */
            close(dir);
            if ((dir = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
                return -1;
        }
        start = 0;
        char *at = rest + strspn(rest, "/");
        size_t length = strcspn(at, "/");
        if (length > NAME_MAX) {
            close(dir);
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(name, at, length);
        name[length] = 0;
        memmove(rest, at + length, strlen(at + length) + 1);
        if (!name[0] || strcmp(name, ".") == 0)
            continue;
        struct statfs where;
        int proc = fstatfs(dir, &where) == 0 && where.f_type == PROC_SUPER_MAGIC;
        if (proc && (strcmp(name, "self") == 0 || strcmp(name, "thread-self") == 0))
            strcpy(name, own);  /* (only /proc itself has these names) */
        if (another_process(tid, dir, name)) {
            close(dir);
            errno = EACCES;
            return -1;
        }
        int next = openat(dir, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        struct stat info;
        if (next >= 0 && fstat(next, &info) == 0 && S_ISLNK(info.st_mode)) {
            ssize_t size = readlinkat(dir, name, target, sizeof target - 1);
            int textual = size > 0 && (!proc || strncmp(target, "self", 4) == 0
                                       || strncmp(target, "thread-self", 11) == 0);
            close(next);
            next = -1;
            if (++links > 40)
                errno = ELOOP;
            else if (size > 0 && (size_t)size + strlen(rest) + 2 > sizeof rest)
                errno = ENAMETOOLONG;
            else if (size <= 0 && !proc)
                errno = size == 0 ? ENOENT : errno;  /* (readlinkat's own answer) */
            else if (textual) {  /* go on along the link's text, then the rest */
                target[size] = 0;
                memmove(rest + size + 1, rest, strlen(rest) + 1);
                memcpy(rest, target, (size_t)size);
                rest[size] = '/';
                start = 1;
                continue;
            } else  /* a magic link (one pid 1 may not read: another process's), whose
                     * lookup the kernel answers as for the caller */
                next = openat(dir, name, O_PATH | O_CLOEXEC);
        }
        int error = errno;
        close(dir);
        if (next < 0) {
            errno = error;
            return -1;
        }
        dir = next;
    }
    return dir;
}

int caller_dir(uint32_t tid, int dir) {
    char where[64];
    if (dir == AT_FDCWD)
        snprintf(where, sizeof where, "/proc/%u/cwd", tid);
    else
        snprintf(where, sizeof where, "/proc/%u/fd/%d", tid, dir);
    return open(where, O_PATH | O_CLOEXEC);  /* (the caller's own: the kernel follows) */
}

/* An O_PATH descriptor on the file the execve/execveat `call` of task `tid` names, found as
 * the caller would find it (resolve); -1 with errno. */
static int exec_target(const struct seccomp_data *call, uint32_t tid) {
    int execveat = call->nr == __NR_execveat;
    int dir = execveat ? (int)call->args[0] : AT_FDCWD;
    char name[PATH_MAX];
    if (caller_string(tid, call->args[execveat], name, sizeof name) != 0)
        return -1;
    int base = caller_dir(tid, dir);
    if (base < 0)
        return -1;
    if (name[0] == 0 && execveat && (call->args[4] & AT_EMPTY_PATH))
        return base;  /* fexecve */
    return caller_resolve(tid, base, name);
}

/* Whether the execve/execveat `call` of task `tid` runs a file the command wrote: one with no
 * name left (a memfd, a deleted file) or on a written mount; or one pid 1 cannot tell. */
static int exec_of_written_file(const struct memwatch *watch, const struct seccomp_data *call,
                                uint32_t tid) {
    int fd = exec_target(call, tid);
    if (fd < 0)  /* not there (the kernel's own lookup fails too), or a caller that made itself
                  * non-dumpable (a session's agent), which pid 1 cannot read: not judged */
        return errno != ENOENT && errno != ENOTDIR && errno != EFAULT && errno != EACCES;
    struct statx info;
    int bad = statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC,
                    STATX_TYPE | STATX_NLINK | STATX_MNT_ID, &info) != 0
        || !(info.stx_mask & STATX_MNT_ID);
    close(fd);  /* (only a regular file can be executed: anything else is refused anyway) */
    return bad || !S_ISREG(info.stx_mode) || info.stx_nlink == 0
        || written(watch, info.stx_mnt_id);
}

/* Answer the memfd_create `call` with a memfd pid 1 made sealed non-executable: 0 when
 * answered, else the error to answer. */
static int seal_memfd(const struct memwatch *watch, const struct seccomp_notif *call) {
    unsigned int flags = (unsigned int)call->data.args[1];
    if (flags & MFD_EXEC)
        return EACCES;  /* (as the kernel does where vm.memfd_noexec = 2) */
    char name[MFD_NAME_MAX + 1];
    if (caller_string(call->pid, call->data.args[0], name, sizeof name) != 0) {
        if (errno != EACCES)
            return errno == ENAMETOOLONG ? EINVAL : errno;
        strcpy(name, "memfd");  /* (a non-dumpable caller's name cannot be read) */
    }
    int fd = memfd_create(name, flags | MFD_NOEXEC_SEAL);
    if (fd < 0)
        return errno;
    struct seccomp_notif_addfd add = {.id = call->id, .flags = SECCOMP_ADDFD_FLAG_SEND,
                                      .srcfd = (uint32_t)fd,
                                      .newfd_flags = flags & MFD_CLOEXEC ? O_CLOEXEC : 0};
    int done = ioctl(watch->listener, SECCOMP_IOCTL_NOTIF_ADDFD, &add);
    int error = errno;
    close(fd);
    return done >= 0 || error == ENOENT ? 0 : error;  /* (ENOENT: the caller is gone) */
}

/* total_vm of the task `tid` in pages (the first field of its statm); -1 if unknown. */
static int64_t pages_in_use(uint32_t tid) {
    char text[128];
    if (proc_text(tid, "statm", text, sizeof text) <= 0)
        return -1;
    char *end;
    long long pages = strtoll(text, &end, 10);
    return end == text || pages < 0 ? -1 : pages;
}

/* How many pages the call would add to its caller's address space (0: none). */
static uint64_t growth(const struct seccomp_data *call, uint64_t page) {
    uint64_t old_size = call->args[1], size = call->args[1];
    if (call->nr == __NR_mremap) {
        size = call->args[2];
        if (!(call->args[3] & MREMAP_DONTUNMAP) && old_size != 0)
            size = size > old_size ? size - old_size : 0;
    }
    return size / page + (size % page != 0);
}

/* A memory_refused event, before the caller learns of the refusal: a warm sandbox's owner
 * takes the events that came while a command ran as that command's (session/sandbox.py).
 * "refused" counts every refusal so far, so one lost (the budget spent, the pipe full) is
 * still counted by the next. */
static void said_refused(struct memwatch *watch, uint64_t size, uint64_t in_use) {
    if (budget_next(&watch->said) >= EVENTS_RECORDED)
        return;
    char line[160];
    int length = snprintf(line, sizeof line, "{\"event\": \"memory_refused\", "
                          "\"refused\": %llu, \"size\": %llu, \"in_use\": %llu}",
                          (unsigned long long)watch->refused, (unsigned long long)size,
                          (unsigned long long)in_use);
    struct text event = {0};
    put(&event, line, (size_t)length);
    emit_event_unwaiting(&event);
}

/* Answer the pending call `id`: with -`error`, or (0) let the kernel carry it out. */
static void answer_call(struct memwatch *watch, uint64_t id, int error) {
    struct seccomp_notif_resp *answer = watch->response;
    memset(answer, 0, sizeof *answer);
    answer->id = id;
    answer->error = -error;
    answer->flags = error ? 0 : SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    while (ioctl(watch->listener, SECCOMP_IOCTL_NOTIF_SEND, answer) != 0 && errno == EINTR) {
    }
}

void memwatch_answer(struct memwatch *watch) {
    struct seccomp_notif *call = watch->request;
    memset(call, 0, watch->request_size);
    if (ioctl(watch->listener, SECCOMP_IOCTL_NOTIF_RECV, call) != 0)
        return;  /* (ENOENT: the caller died meanwhile; EINTR: it comes again) */
    int nr = call->data.nr;
    if (watch->names && namewatch_traps(nr)) {
        namewatch_answer(watch->names, call);
        return;
    }
    if (nr == __NR_memfd_create) {
        int error = watch->seal ? seal_memfd(watch, call) : 0;
        if (error || !watch->seal)
            answer_call(watch, call->id, error);
        return;  /* (else answered with the descriptor) */
    }
    int exec = nr == __NR_execve || nr == __NR_execveat
        ? exec_of_written_file(watch, &call->data, call->pid)
        : exec_of_written(watch, &call->data, call->pid);
    int memory = watch->memory && !exec && (nr == __NR_mremap
        || (nr == __NR_mmap && !(call->data.args[3] & MAP_FIXED)));
    uint64_t pages = memory ? growth(&call->data, watch->page) : 0;
    int64_t used = pages > 0 ? pages_in_use(call->pid) : -1;
    int refuse = used >= 0 && (uint64_t)used + pages > watch->limit_pages;
    /* the task that read as `tid` is still the caller, waiting for this answer */
    if (ioctl(watch->listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &call->id) != 0)
        return;
    if (exec) {
        watch->exec_refused++;
    } else if (refuse) {
        watch->refused++;
        if (pages * watch->page > watch->largest) {
            watch->largest = pages * watch->page;
            watch->in_use = (uint64_t)used * watch->page;
        }
        said_refused(watch, pages * watch->page, (uint64_t)used * watch->page);
    }
    answer_call(watch, call->id, exec ? EACCES : refuse ? ENOMEM : 0);
}

int memwatch_summary(const struct memwatch *watch, char *out, size_t room) {
    int size = 0;
    if (watch->memory)
        size = snprintf(out, room, ", \"memory\": {\"watched\": %s, \"refused\": %llu, "
                        "\"largest\": %llu, \"in_use\": %llu}",
                        watch->listener >= 0 ? "true" : "false",
                        (unsigned long long)watch->refused, (unsigned long long)watch->largest,
                        (unsigned long long)watch->in_use);
    if (watch->exec)
        size += snprintf(out + size, room - (size_t)size,
                         ", \"exec\": {\"watched\": %s, \"refused\": %llu}",
                         watch->listener >= 0 ? "true" : "false",
                         (unsigned long long)watch->exec_refused);
    return size;
}
