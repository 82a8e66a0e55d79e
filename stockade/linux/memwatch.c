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
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
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
#include <unistd.h>

#include "supervisor.h"

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#endif

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

/* The low 32 bits of argument `n` (little-endian: x86_64, aarch64). */
#define ARGUMENT_LOW(n) (offsetof(struct seccomp_data, args) + 8 * (n))

int memwatch_install(void) {
#ifdef NATIVE_ARCH
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),  /* (pid 1's own filter kills these) */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mremap, 4, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mmap, 0, 2),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARGUMENT_LOW(3)),  /* mmap's flags */
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, MAP_FIXED, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
    };
    struct sock_fprog program = {sizeof code / sizeof code[0], code};
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER,
                        &program);
#else
    return -1;  /* no watch on this architecture: RLIMIT_AS alone */
#endif
}

int memwatch_open(struct memwatch *watch, int listener, int64_t limit) {
    memset(watch, 0, sizeof *watch);
    watch->listener = -1;
    struct seccomp_notif_sizes sizes;
    long page = sysconf(_SC_PAGESIZE);
    if (listener < 0 || limit < 0 || page <= 0
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
    watch->limit_pages = (uint64_t)limit / watch->page;
    watch->listener = listener;
    return 0;
}

/* total_vm of the task `tid` in pages (the first field of its statm); -1 if unknown. */
static int64_t pages_in_use(uint32_t tid) {
    char path[64], text[128];
    snprintf(path, sizeof path, "/proc/%u/statm", tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t got = read(fd, text, sizeof text - 1);
    close(fd);
    if (got <= 0)
        return -1;
    text[got] = 0;
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

void memwatch_answer(struct memwatch *watch) {
    struct seccomp_notif *call = watch->request;
    memset(call, 0, watch->request_size);
    if (ioctl(watch->listener, SECCOMP_IOCTL_NOTIF_RECV, call) != 0)
        return;  /* (ENOENT: the caller died meanwhile; EINTR: it comes again) */
    uint64_t pages = growth(&call->data, watch->page);
    int64_t used = pages > 0 ? pages_in_use(call->pid) : -1;
    int refuse = used >= 0 && (uint64_t)used + pages > watch->limit_pages;
    /* the task that read as `tid` is still the caller, waiting for this answer */
    if (ioctl(watch->listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &call->id) != 0)
        return;
    struct seccomp_notif_resp *answer = watch->response;
    memset(answer, 0, sizeof *answer);
    answer->id = call->id;
    if (refuse) {
        answer->error = -ENOMEM;
        watch->refused++;
        if (pages * watch->page > watch->largest) {
            watch->largest = pages * watch->page;
            watch->in_use = (uint64_t)used * watch->page;
        }
    } else {
        answer->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    }
    while (ioctl(watch->listener, SECCOMP_IOCTL_NOTIF_SEND, answer) != 0 && errno == EINTR) {
    }
}

int memwatch_summary(const struct memwatch *watch, char *out, size_t room) {
    return snprintf(out, room, ", \"memory\": {\"watched\": %s, \"refused\": %llu, "
                    "\"largest\": %llu, \"in_use\": %llu}",
                    watch->listener >= 0 ? "true" : "false",
                    (unsigned long long)watch->refused, (unsigned long long)watch->largest,
                    (unsigned long long)watch->in_use);
}
